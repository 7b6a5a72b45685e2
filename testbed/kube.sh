#!/usr/bin/env bash
# The real Kubernetes components of the test bed, built from the Go module proxy (never a
# downloaded binary): kube-apiserver, kubelet, kube-controller-manager, kube-scheduler from
# k8s.io/kubernetes and etcd from go.etcd.io/etcd/server/v3, at the versions pinned by
# testbed/kube/go.mod and go.sum. Static binaries (CGO_ENABLED=0), the Kubernetes version
# stamped as its own release build does (so `--version` says v1.36.x).
#
#   testbed/kube.sh build           build what is missing into the cache, say what and how long each took
#   testbed/kube.sh build kubemark  also kubemark (k8s.io/kubernetes/cmd/kubemark, same version), on demand:
#                                   only the fleet benchmark (benches/fleet) runs it
#   testbed/kube.sh dir [kubemark]  print the cache directory (builds first when anything is missing)
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
# about 12 min. A warm cache: nothing is built. kubemark is not part of that set (the test suite
# does not use it): `build kubemark` builds it, reusing Go's build cache of the kubelet build.
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
# built only when asked for by name (`build kubemark`)
ON_DEMAND=(
    "kubemark k8s.io/kubernetes/cmd/kubemark"
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

build_one() { # build_one NAME PACKAGE [MODULE DIRECTORY, default $MOD]
    local name=$1 pkg=$2 dir=${3:-$MOD} t0=$SECONDS tmp=$OUT/.$1.tmp flags=""
    case $name in kube-* | kubelet | kubemark) flags=$(ldflags) ;; *) flags="-s -w" ;; esac
    log "building $name ($pkg)"
    (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$flags" -o "$tmp" "$pkg") ||
        die "go build of $name failed (command: cd $dir && CGO_ENABLED=0 go build $pkg)"
    local ver
    ver=$("$tmp" --version 2>&1 | head -1) || die "$name --version failed: $ver"
    if [ "$dir" != "$MOD" ] && [ "$ver" != "Kubernetes $KUBE_VERSION" ]; then
        die "$name says \"$ver\", not Kubernetes $KUBE_VERSION"
    fi
    mv -f "$tmp" "$OUT/$name"
    log "built $name in $((SECONDS - t0)) s: $ver"
}

# An on-demand component is built in a scratch copy of the module: its packages need a few
# go.sum lines the pinned set does not (kubemark: github.com/moby/ipvs, vishvananda/netlink and
# netns, sigs.k8s.io/knftables), added there (checked against the Go checksum database) and
# never to testbed/kube/go.sum, whose hash names the cache. Every version still comes from
# testbed/kube/go.mod: the build must leave the copy's go.mod as it was, else it stops.
build_on_demand() { # build_on_demand NAME PACKAGE
    local scratch rc=0
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/reaplet-kube-$1.XXXXXX")
    cp "$MOD/go.mod" "$MOD/go.sum" "$scratch/"
    (build_one "$1" "$2" "$scratch") || rc=$?
    if [ "$rc" = 0 ] && ! cmp -s "$MOD/go.mod" "$scratch/go.mod"; then
        rm -f "$OUT/$1"
        rc=1
        log "ERROR: building $1 changed go.mod (it needs modules outside testbed/kube/go.mod):"
        diff "$MOD/go.mod" "$scratch/go.mod" >&2 || true
    fi
    rm -rf "$scratch"
    return "$rc"
}

cmd_build() { # cmd_build [ON-DEMAND NAME...]
    mkdir -p "$OUT"
    local wanted=("${COMPONENTS[@]}") missing=() c name extra
    for extra in "$@"; do
        for c in "${ON_DEMAND[@]}"; do
            [ "${c%% *}" = "$extra" ] && wanted+=("$c") && continue 2
        done
        die "unknown component $extra (on demand: ${ON_DEMAND[*]%% *})"
    done
    for c in "${wanted[@]}"; do
        name=${c%% *}
        [ -x "$OUT/$name" ] || missing+=("$c")
    done
    if [ ${#missing[@]} = 0 ]; then
        log "cached: kubernetes $KUBE_VERSION, etcd $ETCD_VERSION in $OUT"
        return 0
    fi
    log "building ${#missing[@]} of ${#wanted[@]} components (kubernetes $KUBE_VERSION, etcd $ETCD_VERSION) into $OUT"
    [ ${#missing[@]} -le $# ] || log "a cold build takes about 12 min on 2 cores; later runs reuse it"
    local t0=$SECONDS
    log "downloading the modules (go mod download; cached in $(go env GOMODCACHE))"
    (cd "$MOD" && go mod download) || die "go mod download failed in $MOD (is the Go module proxy reachable? go env GOPROXY: $(go env GOPROXY))"
    log "modules ready in $((SECONDS - t0)) s"
    for c in "${missing[@]}"; do
        case " ${ON_DEMAND[*]} " in
        *" $c "*) build_on_demand ${c} ;;
        *) build_one ${c} ;;
        esac
    done
    log "all built in $((SECONDS - t0)) s: $OUT"
}

case ${1:-} in
build)
    shift
    cmd_build "$@"
    ;;
dir)
    shift
    cmd_build "$@" >&2
    printf '%s\n' "$OUT"
    ;;
*)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 64
    ;;
esac
