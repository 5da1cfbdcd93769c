#!/usr/bin/env bash
# Debian's librdkafka (librdkafka1) and Debian's Python binding of it (python3-confluent-kafka),
# for tests/conformance/test_debian_librdkafka.py, which runs them with Debian's /usr/bin/python3.
#
# Idempotent and quick when installed (one import). Always exits 0: when the client cannot be
# installed the reason goes to stderr and to .cache/debian_librdkafka/unavailable, which the
# test reports as its skip reason.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
CACHE=$ROOT/.cache/debian_librdkafka
UNAVAILABLE=$CACHE/unavailable
PYTHON=/usr/bin/python3
PACKAGES=(python3 python3-confluent-kafka)

mkdir -p "$CACHE"

unavailable() {
  printf '%s\n' "$*" >"$UNAVAILABLE"
  echo "Debian's confluent-kafka not installed: $*" >&2
  exit 0
}

# Prints "<confluent-kafka version> <librdkafka version>" when Debian's binding imports.
versions() {
  [ -x "$PYTHON" ] && "$PYTHON" -I -c '
import confluent_kafka as c
if not c.__file__.startswith("/usr/lib/python3/dist-packages/"):
    raise SystemExit(f"confluent_kafka comes from {c.__file__}, not Debian")
print(c.version()[0], c.libversion()[0])'
}

if found=$(versions 2>/dev/null); then
  rm -f "$UNAVAILABLE"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || unavailable "apt-get not found: not a Debian system"
run=()
[ "$(id -u)" = 0 ] || run=(sudo)
if ! { "${run[@]}" apt-get update -qq &&
  "${run[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    -o DPkg::Lock::Timeout=300 --no-install-recommends "${PACKAGES[@]}"; } >&2; then
  unavailable "apt-get install ${PACKAGES[*]} failed"
fi
if ! found=$(versions 2>&1); then
  unavailable "$PYTHON cannot import Debian's confluent_kafka: $(echo "$found" | tail -n 1)"
fi
rm -f "$UNAVAILABLE"
read -r binding librdkafka <<<"$found"
echo "Debian's confluent-kafka $binding with librdkafka $librdkafka installed" >&2
