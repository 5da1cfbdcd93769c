#!/usr/bin/env bash
# etcd for the cluster metadata store and its tests (tests/cluster/): Debian's etcd-server,
# installed only when no etcd binary is found (MINI_BROKER_ETCD, else PATH).
#
# The package ships an init script and a systemd unit and its postinst starts the service. The
# tests start their own etcd on ephemeral loopback ports, so the packaged service must not run:
# a policy-rc.d that forbids every start (exit 101, honoured by invoke-rc.d and
# deb-systemd-invoke) is in place during the install, and where systemd runs, the unit is
# disabled and stopped afterwards. Exits non-zero when etcd cannot be installed: the cluster
# tests need a real etcd.
set -euo pipefail

found() {
  if [ -n "${MINI_BROKER_ETCD:-}" ]; then
    [ -x "$MINI_BROKER_ETCD" ]
  else
    command -v etcd >/dev/null 2>&1
  fi
}

if found; then
  exit 0
fi
if [ -n "${MINI_BROKER_ETCD:-}" ]; then
  echo "MINI_BROKER_ETCD=$MINI_BROKER_ETCD is not an executable etcd" >&2
  exit 1
fi
command -v apt-get >/dev/null 2>&1 || {
  echo "etcd not found and apt-get missing: install etcd 3.4+ and put it on PATH" \
    "or point MINI_BROKER_ETCD at it" >&2
  exit 1
}

run=()
[ "$(id -u)" = 0 ] || run=(sudo)
POLICY=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\n# mini-broker: no service starts while etcd-server installs\nexit 101\n' |
    "${run[@]}" tee "$POLICY" >/dev/null
  "${run[@]}" chmod 755 "$POLICY"
  own_policy=1
fi
cleanup() { [ -z "$own_policy" ] || "${run[@]}" rm -f "$POLICY"; }
trap cleanup EXIT

"${run[@]}" apt-get update -qq >&2
"${run[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  -o DPkg::Lock::Timeout=300 --no-install-recommends etcd-server >&2

# A pre-existing policy-rc.d may have allowed the start, and the service would start on boot.
# systemctl disable works without a running systemd (it removes the enable links, and the
# SysV links with them).
if command -v systemctl >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    "${run[@]}" systemctl disable --now etcd.service >&2 || true
  else
    "${run[@]}" systemctl disable etcd.service >/dev/null 2>&1 || true
  fi
fi
if [ ! -d /run/systemd/system ] && [ -x /etc/init.d/etcd ]; then
  "${run[@]}" update-rc.d etcd disable >/dev/null 2>&1 || true
  "${run[@]}" invoke-rc.d etcd stop >/dev/null 2>&1 || true
fi
command -v etcd >/dev/null 2>&1 || { echo "etcd-server installed but etcd not on PATH" >&2; exit 1; }
echo "$(etcd --version | head -n 1) installed (service not started)" >&2
