#!/usr/bin/env bash
# Go's two most used Kafka clients for the conformance suite, from Debian 12's packages: sarama
# (golang-github-shopify-sarama-dev) and kafka-go (golang-github-segmentio-kafka-go-dev), built
# with Debian's Go in GOPATH mode, as Debian ships Go libraries, into .cache/go/bin/.
#
# Idempotent and quick once done: packages are installed only when missing, and a program is
# rebuilt only when one of its .go sources is newer than its binary or the client's package
# version changed. When the clients cannot be had it still exits 0, printing why on stderr and
# leaving the reason in .cache/go/unavailable, which the tests skip with.
#
# GO_CLIENTS_BUILD_ONLY=1 (the tests set it): never install packages, only (re)build.
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
CACHE=$ROOT/.cache/go
BIN=$CACHE/bin
REASON=$CACHE/unavailable
GO=/usr/lib/go/bin/go # golang-go's, Go 1.19 on Debian 12
GOPATH_DIR=/usr/share/gocode
# gcc and libc6-dev: cgo, for the zstd binding sarama uses (golang-go only recommends them).
PACKAGES="golang-go gcc libc6-dev golang-github-shopify-sarama-dev golang-github-segmentio-kafka-go-dev"
# program directory : the Debian package whose version it reports
PROGRAMS="sarama:golang-github-shopify-sarama-dev kafkago:golang-github-segmentio-kafka-go-dev"

mkdir -p "$CACHE"

unavailable() {
    printf '%s\n' "$*" >"$REASON.$$" && mv -f "$REASON.$$" "$REASON"
    echo "Go Kafka clients unavailable: $*" >&2
    exit 0
}

missing_packages() {
    local p
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
            printf '%s ' "$p"
    done
}

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        return 1
    fi
}

install_packages() {
    if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
        unavailable "not a Debian system (no dpkg-query/apt-get): the Go clients come from" \
            "Debian 12's packages $PACKAGES"
    fi
    local missing
    read -r -a missing <<<"$(missing_packages)"
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "${GO_CLIENTS_BUILD_ONLY:-}" = 1 ]; then
        unavailable "Debian packages not installed: ${missing[*]}; run" \
            "\`bash tests/conformance/go/install.sh\` (\`make test\` does)"
    fi
    echo "installing ${missing[*]}" >&2
    if ! as_root apt-get update -qq ||
        ! as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        unavailable "apt-get could not install ${missing[*]} (not root and no working sudo," \
            "or not Debian 12, where these packages exist)"
    fi
    read -r -a missing <<<"$(missing_packages)"
    [ ${#missing[@]} -eq 0 ] || unavailable "still not installed after apt-get: ${missing[*]}"
}

# build <dir> <package>: .cache/go/bin/<dir>, from tests/conformance/go/<dir>/*.go.
build() {
    local name=$1 package=$2 target=$BIN/$1 version log tmp
    version=$(dpkg-query -W -f='${Version}' "$package")
    if [ -x "$target" ] && [ "$(cat "$target.version" 2>/dev/null)" = "$version" ] &&
        [ -z "$(find "$HERE/$name" -name '*.go' -newer "$target")" ]; then
        return 0
    fi
    mkdir -p "$BIN"
    tmp=$(mktemp "$BIN/.$name.XXXXXX")
    log=$CACHE/build-$name.log
    echo "building $target ($package $version)" >&2
    # GOPATH mode: the imports resolve under Debian's GOPATH; the sources stay where they are.
    if ! (cd "$HERE" && env GOPATH=$GOPATH_DIR GO111MODULE=off GOFLAGS= GOENV=off \
        CGO_ENABLED=1 GOCACHE="$CACHE/build-cache" \
        "$GO" build -o "$tmp" -ldflags "-X main.clientVersion=$version" "./$name") >"$log" 2>&1; then
        rm -f "$tmp"
        tail -n 30 "$log" >&2
        unavailable "\`go build\` of tests/conformance/go/$name failed (Go $("$GO" env GOVERSION 2>/dev/null)," \
            "$package $version); see $log"
    fi
    mv -f "$tmp" "$target"
    printf '%s\n' "$version" >"$target.version"
}

install_packages
[ -x "$GO" ] || unavailable "$GO is missing although golang-go is installed"
for program in $PROGRAMS; do
    build "${program%%:*}" "${program#*:}"
done
rm -f "$REASON"
