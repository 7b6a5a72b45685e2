#!/usr/bin/env bash
# The real Kubernetes components of the test bed, built from the Go module proxy (never a
# downloaded binary): kube-apiserver, kubelet, kube-controller-manager, kube-scheduler from
# k8s.io/kubernetes and etcd from go.etcd.io/etcd/server/v3, at the versions pinned by
# testbed/kube/go.mod and go.sum. Static binaries (CGO_ENABLED=0), the Kubernetes version
# stamped as its own release build does (so `--version` says v1.36.x).
#
#   testbed/kube.sh build   build what is missing into the cache, say what and how long each took
#   testbed/kube.sh dir     print the cache directory (builds first when anything is missing)
#
# The cache: $REAPLET_CACHE_DIR/kube/<kubernetes version>-<first 12 hex of sha256(go.sum)>/
# (default ~/.cache/reaplet/kube/...). A binary is written under a temporary name and renamed
# only once it ran `--version`, so an interrupted build is never taken for a finished one.
# Go's own module and build caches (GOMODCACHE, GOCACHE) are outside the repository too: a
# second cold build of the same versions reuses the compiled packages.
#
# Cost measured on a 2-core machine of this kind (2026-11-26, a cargo build running beside it):
# the modules download in about 1 min, then etcd 84 s, kube-apiserver 470 s, kubelet 111 s,
# kube-controller-manager 55 s, kube-scheduler 9 s (they share Go's build cache): 729 s in all,
# about 12 min. A warm cache: nothing is built.
set -eEuo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD=$HERE/kube
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}

log() { printf 'kube: %s\n' "$*" >&2; }
die() { printf 'kube: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH: the components are built from the Go module proxy with go (1.26 or newer)"

# the versions, read from go.mod (the single place they are pinned)
KUBE_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ { print $2; exit }' "$MOD/go.mod")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v3\./ { print $2; exit }' "$MOD/go.mod")
[ -n "$KUBE_VERSION" ] || die "no k8s.io/kubernetes version in $MOD/go.mod"
[ -n "$ETCD_VERSION" ] || die "no go.etcd.io/etcd/server/v3 version in $MOD/go.mod"
SUM=$(sha256sum "$MOD/go.sum" | cut -c1-12)
OUT=$CACHE/kube/$KUBE_VERSION-$SUM

# NAME PACKAGE
COMPONENTS=(
    "etcd go.etcd.io/etcd/server/v3"
    "kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
    "kubelet k8s.io/kubernetes/cmd/kubelet"
    "kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager"
    "kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler"
)

# what the Kubernetes release build stamps (hack/lib/version.sh): the version packages of
# component-base and client-go
ldflags() {
    local v=${KUBE_VERSION#v} major minor x
    major=${v%%.*}
    minor=${v#*.}
    minor=${minor%%.*}
    for x in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s ' \
            "$x" "$KUBE_VERSION" "$x" "$major" "$x" "$minor"
        printf -- '-X %s.gitTreeState=clean -X %s.buildDate=1970-01-01T00:00:00Z ' "$x" "$x"
    done
    printf -- '-s -w'
}

build_one() { # build_one NAME PACKAGE
    local name=$1 pkg=$2 t0=$SECONDS tmp=$OUT/.$1.tmp flags=""
    case $name in kube-* | kubelet) flags=$(ldflags) ;; *) flags="-s -w" ;; esac
    log "building $name ($pkg)"
    (cd "$MOD" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$flags" -o "$tmp" "$pkg") ||
        die "go build of $name failed (command: cd $MOD && CGO_ENABLED=0 go build $pkg)"
    local ver
    ver=$("$tmp" --version 2>&1 | head -1) || die "$name --version failed: $ver"
    mv -f "$tmp" "$OUT/$name"
    log "built $name in $((SECONDS - t0)) s: $ver"
}

cmd_build() {
    mkdir -p "$OUT"
    local missing=() c name
    for c in "${COMPONENTS[@]}"; do
        name=${c%% *}
        [ -x "$OUT/$name" ] || missing+=("$c")
    done
    if [ ${#missing[@]} = 0 ]; then
        log "cached: kubernetes $KUBE_VERSION, etcd $ETCD_VERSION in $OUT"
        return 0
    fi
    log "building ${#missing[@]} of ${#COMPONENTS[@]} components (kubernetes $KUBE_VERSION, etcd $ETCD_VERSION) into $OUT"
    log "a cold build takes about 12 min on 2 cores; later runs reuse it"
    local t0=$SECONDS
    log "downloading the modules (go mod download; cached in $(go env GOMODCACHE))"
    (cd "$MOD" && go mod download) || die "go mod download failed in $MOD (is the Go module proxy reachable? go env GOPROXY: $(go env GOPROXY))"
    log "modules ready in $((SECONDS - t0)) s"
    for c in "${missing[@]}"; do
        build_one ${c}
    done
    log "all built in $((SECONDS - t0)) s: $OUT"
}

case ${1:-} in
build) cmd_build ;;
dir)
    cmd_build >&2
    printf '%s\n' "$OUT"
    ;;
*)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 64
    ;;
esac
