#!/usr/bin/env bash
# containerd 2.x for the test bed, built from the Go module proxy (never a downloaded binary):
# the daemon (cmd/containerd), its runc shim (cmd/containerd-shim-runc-v2) and ctr (cmd/ctr) of
# github.com/containerd/containerd/v2 at the version pinned by testbed/containerd/go.mod and
# go.sum. Static binaries (CGO_ENABLED=0, without the btrfs, devmapper and zfs snapshotters,
# which need cgo), the version stamped as containerd's own release build does (so
# `containerd --version` says v2.x.y). Kubernetes 1.36 supports containerd 2.x only; the test
# bed runs this one unless REAPLET_TESTBED_RUNTIME=debian (Debian's containerd 1.6, the
# compatibility job). runc is Debian's.
#
#   testbed/containerd.sh build   build what is missing into the cache, say how long it took
#   testbed/containerd.sh dir     print the cache directory (builds first when anything is missing)
#   testbed/containerd.sh version print the pinned version
#
# The cache: $REAPLET_CACHE_DIR/containerd/<version>-<first 12 hex of sha256(go.sum)>/
# (default ~/.cache/reaplet/containerd/...). A binary is written under a temporary name and
# renamed only once it printed the pinned version, so an interrupted build is never taken for a
# finished one. Go's module and build caches (GOMODCACHE, GOCACHE) are outside the repository,
# shared with testbed/kube.sh and testbed/helm.sh.
#
# Cost measured on a 2-core machine of this kind: see COST below.
set -eEuo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD=$HERE/containerd
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}
PKG=github.com/containerd/containerd/v2

log() { printf 'containerd: %s\n' "$*" >&2; }
die() { printf 'containerd: ERROR: %s\n' "$*" >&2; exit 1; }

# the version, read from go.mod (the single place it is pinned)
VERSION=$(awk -v p="$PKG" '$1 == p && $2 ~ /^v2\./ { print $2; exit }' "$MOD/go.mod")
[ -n "$VERSION" ] || die "no $PKG version in $MOD/go.mod"
SUM=$(sha256sum "$MOD/go.sum" | cut -c1-12)
OUT=$CACHE/containerd/$VERSION-$SUM
BINARIES=(containerd containerd-shim-runc-v2 ctr)

build_one() { # build_one NAME
    local name=$1 t0=$SECONDS tmp=$OUT/.$1.tmp ver
    log "building $name ($PKG/cmd/$name)"
    (cd "$MOD" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
        -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags "-s -w -X $PKG/version.Version=$VERSION -X $PKG/version.Revision=module-proxy" \
        -o "$tmp" "$PKG/cmd/$name") ||
        die "go build of $name failed (command: cd $MOD && CGO_ENABLED=0 go build -tags 'no_btrfs no_devmapper no_zfs' $PKG/cmd/$name)"
    # the shim prints its version with -v, over lines ("Version:  v2.x.y")
    local flag=--version
    [ "$name" = containerd-shim-runc-v2 ] && flag=-v
    ver=$("$tmp" "$flag" 2>&1 | tr -s ' \n' ' ') || die "$name $flag failed: $ver"
    case " $ver " in
    *" $VERSION "*) ;;
    *) die "$name says \"$ver\", not $VERSION" ;;
    esac
    mv -f "$tmp" "$OUT/$name"
    log "built $name in $((SECONDS - t0)) s: $ver"
}

missing() {
    local b
    for b in "${BINARIES[@]}"; do
        [ -x "$OUT/$b" ] || printf '%s\n' "$b"
    done
}

cmd_build() {
    local missing=() b
    mapfile -t missing < <(missing)
    if [ ${#missing[@]} = 0 ]; then
        log "cached: containerd $VERSION in $OUT"
        return 0
    fi
    # one build at a time (many test beds may start at once); the lock goes with the process
    mkdir -p "$CACHE/containerd"
    exec 9>"$CACHE/containerd/.lock"
    flock 9
    mapfile -t missing < <(missing)
    [ ${#missing[@]} = 0 ] && return 0
    command -v go >/dev/null || die "go is not on PATH: containerd is built from the Go module proxy with go (1.26 or newer)"
    mkdir -p "$OUT"
    local t0=$SECONDS
    log "building ${missing[*]} (containerd $VERSION) into $OUT; a cold build takes about 10 min on 2 cores, later runs reuse it"
    log "downloading the modules (go mod download; cached in $(go env GOMODCACHE))"
    (cd "$MOD" && go mod download) ||
        die "go mod download failed in $MOD (is the Go module proxy reachable? go env GOPROXY: $(go env GOPROXY))"
    log "modules ready in $((SECONDS - t0)) s"
    for b in "${missing[@]}"; do
        build_one "$b"
    done
    log "all built in $((SECONDS - t0)) s: $OUT"
}

case ${1:-} in
build) cmd_build ;;
dir)
    cmd_build >&2
    printf '%s\n' "$OUT"
    ;;
version) printf '%s\n' "$VERSION" ;;
*)
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 64
    ;;
esac
