#!/usr/bin/env bash
# Helm for the test bed, built from the Go module proxy (never a downloaded binary):
# helm.sh/helm/v4/cmd/helm at the version pinned by testbed/helm/go.mod and go.sum. A static
# binary (CGO_ENABLED=0), its version stamped as Helm's own release build does (so
# `helm version` says v4.x.y). tests/helm.rs installs deploy/helm/reaplet with it.
#
#   testbed/helm.sh build   build it when missing, say how long it took
#   testbed/helm.sh path    print the binary's path (builds first when missing)
#
# The cache: $REAPLET_CACHE_DIR/helm/<helm version>-<first 12 hex of sha256(go.sum)>/helm
# (default ~/.cache/reaplet/helm/...). The binary is written under a temporary name and renamed
# only once `helm version` printed the pinned version, so an interrupted build is never taken
# for a finished one. Go's module and build caches (GOMODCACHE, GOCACHE) are outside the
# repository, shared with testbed/kube.sh.
#
# Cost measured on a 2-core machine of this kind (2026-11-28, testbed/kube.sh building the
# Kubernetes components and two cargo builds beside it, load 10-12): the modules 27 s, then
# helm 738 s (7 min of CPU: about 4 min on an otherwise idle machine). A warm cache: nothing is
# built.
set -eEuo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD=$HERE/helm
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}

log() { printf 'helm: %s\n' "$*" >&2; }
die() { printf 'helm: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH: helm is built from the Go module proxy with go (1.26 or newer)"

# the version, read from go.mod (the single place it is pinned)
HELM_VERSION=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v4\./ { print $2; exit }' "$MOD/go.mod")
[ -n "$HELM_VERSION" ] || die "no helm.sh/helm/v4 version in $MOD/go.mod"
SUM=$(sha256sum "$MOD/go.sum" | cut -c1-12)
OUT=$CACHE/helm/$HELM_VERSION-$SUM
BIN=$OUT/helm

cmd_build() {
    if [ -x "$BIN" ]; then
        log "cached: helm $HELM_VERSION in $OUT"
        return 0
    fi
    mkdir -p "$OUT"
    local t0=$SECONDS tmp=$OUT/.helm.tmp v=helm.sh/helm/v4/internal/version ver
    log "building helm $HELM_VERSION into $OUT (a cold build takes a few minutes on 2 cores)"
    log "downloading the modules (go mod download; cached in $(go env GOMODCACHE))"
    (cd "$MOD" && go mod download) ||
        die "go mod download failed in $MOD (is the Go module proxy reachable? go env GOPROXY: $(go env GOPROXY))"
    log "modules ready in $((SECONDS - t0)) s"
    (cd "$MOD" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
        -ldflags "-s -w -X $v.version=$HELM_VERSION -X $v.metadata= -X $v.gitTreeState=clean" \
        -o "$tmp" helm.sh/helm/v4/cmd/helm) ||
        die "go build of helm failed (command: cd $MOD && CGO_ENABLED=0 go build helm.sh/helm/v4/cmd/helm)"
    ver=$("$tmp" version --template '{{.Version}}' 2>&1) || die "helm version failed: $ver"
    [ "$ver" = "$HELM_VERSION" ] || die "the built helm says $ver, not $HELM_VERSION"
    mv -f "$tmp" "$BIN"
    log "built helm $ver in $((SECONDS - t0)) s: $BIN"
}

case ${1:-} in
build) cmd_build ;;
path)
    cmd_build >&2
    printf '%s\n' "$BIN"
    ;;
*)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 64
    ;;
esac
