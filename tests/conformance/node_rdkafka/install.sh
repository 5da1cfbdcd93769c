#!/usr/bin/env bash
# node-rdkafka for tests/conformance/test_node_rdkafka.py: the version pinned by package-lock.json,
# compiled by node-gyp against Debian's librdkafka (librdkafka-dev; BUILD_LIBRDKAFKA=0 turns off
# the copy bundled in the npm package) and the Node headers of the node on PATH (the nodejs
# package's /usr/include/node, or Debian's libnode-dev: nodejs.org, where node-gyp would fetch
# them, may be unreachable).
#
# Idempotent, and quick when nothing changed: a stamp in .cache/node_rdkafka/ records what the
# build was made from. Always exits 0: when the client cannot be installed the reason goes to
# stderr and to .cache/node_rdkafka/unavailable, which the test reports as its skip reason.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
CACHE=$ROOT/.cache/node_rdkafka
UNAVAILABLE=$CACHE/unavailable
STAMP=$CACHE/installed
LOG=$CACHE/build.log
ADDON=$HERE/node_modules/node-rdkafka/build/Release/node-librdkafka.node

mkdir -p "$CACHE"

unavailable() {
  printf '%s\n' "$*" >"$UNAVAILABLE"
  echo "node-rdkafka not installed: $*" >&2
  exit 0
}

apt_install() {
  local run=()
  [ "$(id -u)" = 0 ] || run=(sudo)
  command -v apt-get >/dev/null 2>&1 || return 1
  { "${run[@]}" apt-get update -qq &&
    "${run[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      -o DPkg::Lock::Timeout=300 --no-install-recommends "$@"; } >&2
}

# What the build depends on; a change in any of them means a rebuild.
fingerprint() {
  printf '%s %s %s\n' "$(sha256sum "$HERE/package-lock.json" | cut -c1-16)" \
    "$(node -p 'process.version + "/" + process.versions.modules')" \
    "$(dpkg-query -W -f='${Version}' librdkafka-dev 2>/dev/null)"
}

# node -e: the addon loads and was linked against the system's librdkafka.
# shellcheck disable=SC2016  # the single-quoted ${...} are JavaScript's
loads() {
  (cd "$HERE" && node -e '
    const k = require("node-rdkafka")
    const want = process.argv[1]
    if (k.librdkafkaVersion !== want) {
      throw new Error(`linked librdkafka ${k.librdkafkaVersion}, the system has ${want}`)
    }
    for (const f of ["gzip", "snappy", "lz4", "zstd"]) {
      if (!k.features.includes(f)) throw new Error(`librdkafka built without ${f}`)
    }' "$(system_librdkafka)")
}

system_librdkafka() {
  dpkg-query -W -f='${Version}' librdkafka-dev 2>/dev/null | sed 's/-[^-]*$//'
}

if command -v node >/dev/null 2>&1 && [ -f "$ADDON" ] && [ -f "$STAMP" ] &&
  [ "$(cat "$STAMP")" = "$(fingerprint)" ] && loads 2>/dev/null; then
  rm -f "$UNAVAILABLE"
  exit 0
fi

# -- Debian packages ---------------------------------------------------------------------------
missing=()
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
[ -f /usr/include/librdkafka/rdkafkacpp.h ] || missing+=(librdkafka-dev)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}" ||
    unavailable "could not install the Debian packages ${missing[*]} (apt-get failed or absent)"
fi
for tool in node npm g++ make python3; do
  command -v "$tool" >/dev/null 2>&1 || unavailable "$tool is not on PATH"
done
[ -f /usr/include/librdkafka/rdkafkacpp.h ] ||
  unavailable "no librdkafka headers (/usr/include/librdkafka/rdkafkacpp.h): install librdkafka-dev"

# -- Node headers matching the running node (its NODE_MODULE_VERSION) --------------------------
MODULES=$(node -p process.versions.modules)
NODE_PREFIX=$(dirname "$(dirname "$(readlink -f "$(command -v node)")")")

find_nodedir() {
  local d
  for d in "${npm_config_nodedir:-}" "$NODE_PREFIX" /usr /usr/local; do
    [ -n "$d" ] && [ -f "$d/include/node/common.gypi" ] &&
      grep -Eq "^#define NODE_MODULE_VERSION $MODULES\$" "$d/include/node/node_version.h" \
        2>/dev/null && { echo "$d"; return 0; }
  done
  return 1
}

NODEDIR=$(find_nodedir)
if [ -z "$NODEDIR" ] && dpkg-query -S "$(readlink -f "$(command -v node)")" 2>/dev/null |
  grep -q '^nodejs:' && ! dpkg-query -W -f='${Version}' nodejs | grep -q nodesource; then
  apt_install libnode-dev || true  # Debian's own nodejs: its headers are in libnode-dev
  NODEDIR=$(find_nodedir)
fi
if [ -z "$NODEDIR" ]; then
  echo "node-rdkafka: no local headers for node $(node -v) (NODE_MODULE_VERSION $MODULES);" \
    "node-gyp will try to download them" >&2
fi

# -- build -------------------------------------------------------------------------------------
echo "node-rdkafka: building against librdkafka $(system_librdkafka) (log: $LOG)" >&2
rm -f "$STAMP"
if ! (cd "$HERE" && env BUILD_LIBRDKAFKA=0 ${NODEDIR:+npm_config_nodedir=$NODEDIR} \
  npm ci --no-audit --no-fund --foreground-scripts --loglevel=error) >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  # The first compiler error, else node-gyp's, else npm's.
  reason=$(grep -m1 -E ': error:' "$LOG" || grep -m1 -E 'gyp ERR! stack Error' "$LOG" ||
    grep -m1 -E 'npm error' "$LOG")
  unavailable "npm ci failed building node-rdkafka against librdkafka $(system_librdkafka)" \
    "with node $(node -v)${NODEDIR:+ (headers from $NODEDIR)}: $(echo "$reason" | cut -c1-300)" \
    "(log: $LOG)"
fi
[ -f "$ADDON" ] || unavailable "npm ci did not build $ADDON (install scripts blocked?); see $LOG"
if ! err=$(loads 2>&1); then
  unavailable "the built node-rdkafka does not load: $(echo "$err" | grep -m1 Error)"
fi
fingerprint >"$STAMP"
rm -f "$UNAVAILABLE"
echo "node-rdkafka: installed ($(cd "$HERE" && node -p 'require("node-rdkafka/package.json").version')" \
  "with librdkafka $(system_librdkafka))" >&2
