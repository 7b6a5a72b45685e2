#!/usr/bin/env bash
# reaplet's test bed: a private containerd (Debian's package) on its own socket, state and
# cgroup root, with busybox and pause images built locally (no registry is reachable).
#
#   testbed/testbed.sh install   apt-get install containerd, runc, busybox-static, gcc if missing
#   testbed/testbed.sh images    build the OCI image tarballs (cached under $REAPLET_CACHE_DIR)
#   testbed/testbed.sh start     install + images + start containerd + import images (idempotent)
#   testbed/testbed.sh stop      kill every pod, stop containerd, unmount, remove leftover cgroups
#   testbed/testbed.sh restart   stop containerd alone (pods and their shims keep running), start it
#   testbed/testbed.sh status    exit 0 when the private containerd is running
#
# Settings (environment): REAPLET_TESTBED_DIR (default /tmp/reaplet-testbed),
# REAPLET_CACHE_DIR (default ~/.cache/reaplet), REAPLET_TESTBED_CGROUP_ROOT (default /reaplet-testbed:
# the cgroup root the test pods go below, in every hierarchy, and that stop cleans).
# The socket is $REAPLET_TESTBED_DIR/containerd.sock.
set -euo pipefail

DIR=${REAPLET_TESTBED_DIR:-/tmp/reaplet-testbed}
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}
SOCK=$DIR/containerd.sock
CGROUP_ROOT=${REAPLET_TESTBED_CGROUP_ROOT:-reaplet-testbed}
CGROUP_ROOT=${CGROUP_ROOT#/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUSYBOX_IMAGE=reaplet.test/busybox:latest
PAUSE_IMAGE=reaplet.test/pause:latest

log() { printf 'testbed: %s\n' "$*" >&2; }
die() { printf 'testbed: ERROR: %s\n' "$*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "the test bed needs root (containerd, cgroups, mounts); run as root"
}

cmd_install() {
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 || missing+=(busybox-static)
    command -v gcc >/dev/null || missing+=(gcc libc6-dev)
    if [ ${#missing[@]} -gt 0 ]; then
        need_root
        log "installing ${missing[*]} from Debian's packages"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    if ! file_is_static /bin/busybox; then
        need_root
        log "installing busybox-static (the image needs a static busybox)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >/dev/null
    fi
}

file_is_static() {
    # a static binary has no PT_INTERP; ldd says so
    ! ldd "$1" >/dev/null 2>&1
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# write_blob FILE -> prints "sha256:<hex> <size>" and stores FILE in the layout's blobs
write_blob() {
    local f=$1 layout=$2 d
    d=$(sha "$f")
    mkdir -p "$layout/blobs/sha256"
    cp "$f" "$layout/blobs/sha256/$d"
    printf 'sha256:%s %s\n' "$d" "$(stat -c %s "$f")"
}

det_tar() { # det_tar OUT DIR: deterministic tar of DIR's contents
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
        -C "$2" -cf "$1" .
}

# build_image OUT_TAR ROOTFS ENTRYPOINT_JSON NAME...
build_image() {
    local out=$1 rootfs=$2 entry=$3; shift 3
    local work layout ldig lsize cdig csize mdig msize names=""
    work=$(mktemp -d); layout=$work/layout; mkdir -p "$layout"
    det_tar "$work/layer.tar" "$rootfs"
    read -r ldig lsize < <(write_blob "$work/layer.tar" "$layout")
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin:/usr/bin:/sbin"],"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
        "$entry" "$ldig" >"$work/config.json"
    read -r cdig csize < <(write_blob "$work/config.json" "$layout")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
        "$cdig" "$csize" "$ldig" "$lsize" >"$work/manifest.json"
    read -r mdig msize < <(write_blob "$work/manifest.json" "$layout")
    local n
    for n in "$@"; do
        [ -n "$names" ] && names+=","
        names+=$(printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
            "$mdig" "$msize" "$n" "${n##*:}")
    done
    printf '{"schemaVersion":2,"manifests":[%s]}' "$names" >"$layout/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    det_tar "$out.tmp" "$layout"
    mv "$out.tmp" "$out"
    rm -rf "$work"
}

images_key() {
    # contents only (not paths): every checkout of the same sources shares the cache
    { /bin/busybox 2>&1 | head -1; cat "$HERE/testbed.sh" "$HERE/pause.c"; } | sha256sum | cut -c1-16
}

cmd_images() {
    cmd_install
    local key out
    key=$(images_key)
    out=$CACHE/images/$key
    if [ -f "$out/busybox.tar" ] && [ -f "$out/pause.tar" ]; then
        echo "$out"; return
    fi
    log "building images into $out"
    mkdir -p "$out"
    local work; work=$(mktemp -d)
    # busybox: /bin/busybox and one symlink per applet, passwd/group, /tmp 1777
    local r=$work/busybox
    mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/root" "$r/var/run"
    cp /bin/busybox "$r/bin/busybox"
    local a
    for a in $(/bin/busybox --list); do
        [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"
    done
    chmod 1777 "$r/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
    build_image "$out/busybox.tar" "$r" '["/bin/sh"]' "$BUSYBOX_IMAGE"
    # pause: a static C binary (exit 0 on TERM/INT, reaps children)
    local p=$work/pause
    mkdir -p "$p"
    gcc -static -Os -o "$p/pause" "$HERE/pause.c"
    strip "$p/pause" 2>/dev/null || true
    build_image "$out/pause.tar" "$p" '["/pause"]' "$PAUSE_IMAGE" registry.k8s.io/pause:3.6
    rm -rf "$work"
    echo "$out"
}

running() {
    [ -f "$DIR/containerd.pid" ] && kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null &&
        [ -S "$SOCK" ]
}

write_config() {
    mkdir -p "$DIR"/{root,state,opt,runc,logs,cni/bin,cni/conf}
    cat >"$DIR/config.toml" <<EOF
version = 2
root = "$DIR/root"
state = "$DIR/state"
oom_score = 0

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$DIR/cni/bin"
    conf_dir = "$DIR/cni/conf"
EOF
}

cmd_restart() {
    need_root
    if [ -f "$DIR/containerd.pid" ]; then
        local pid; pid=$(cat "$DIR/containerd.pid")
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for i in $(seq 1 200); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$pid" 2>/dev/null && die "containerd $pid did not stop within 10 s"
    fi
    cmd_start
}

cmd_start() {
    need_root
    local images; images=$(cmd_images)
    if running; then
        log "containerd already running on $SOCK"
        return
    fi
    write_config
    log "starting containerd on $SOCK"
    containerd --config "$DIR/config.toml" >"$DIR/containerd.log" 2>&1 &
    echo $! >"$DIR/containerd.pid"
    local i
    for i in $(seq 1 200); do
        if [ -S "$SOCK" ] && ctr --address "$SOCK" version >/dev/null 2>&1; then break; fi
        kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null || { tail -20 "$DIR/containerd.log" >&2; die "containerd exited"; }
        sleep 0.05
    done
    [ -S "$SOCK" ] || die "containerd did not open $SOCK within 10 s (see $DIR/containerd.log)"
    ctr --address "$SOCK" -n k8s.io images import --snapshotter overlayfs "$images/busybox.tar" >/dev/null
    ctr --address "$SOCK" -n k8s.io images import --snapshotter overlayfs "$images/pause.tar" >/dev/null
    log "ready: socket $SOCK, images $BUSYBOX_IMAGE $PAUSE_IMAGE"
}

cmd_stop() {
    need_root
    if [ -S "$SOCK" ] && running; then
        local t
        # pods first: kill every task so no process of the test bed outlives it
        for t in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$SOCK" -n k8s.io tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
        done
        sleep 0.3
        for t in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$SOCK" -n k8s.io tasks rm -f "$t" >/dev/null 2>&1 || true
        done
        kill -TERM "$(cat "$DIR/containerd.pid")" 2>/dev/null || true
        local i
        for i in $(seq 1 100); do
            kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null || break
            sleep 0.05
        done
        kill -KILL "$(cat "$DIR/containerd.pid")" 2>/dev/null || true
    fi
    # shims of this instance (they survive containerd by design)
    pkill -KILL -f "containerd-shim-runc-v2 .*-address $SOCK( |$)" 2>/dev/null || true
    # mounts under the test bed (rootfs, netns, shm), deepest first
    if [ -d "$DIR" ]; then
        awk -v d="$DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
            while read -r m; do umount -l "$m" 2>/dev/null || true; done
    fi
    # leftover cgroups below the test bed's cgroup root, in every hierarchy, deepest first
    local h
    for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
        [ -d "$h/$CGROUP_ROOT" ] || continue
        find "$h/$CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    rm -rf "$DIR"
    log "stopped and cleaned"
}

case ${1:-} in
install) cmd_install ;;
images) cmd_images ;;
start) cmd_start ;;
restart) cmd_restart ;;
stop) cmd_stop ;;
status) running ;;
*) sed -n '2,15p' "$0"; exit 64 ;;
esac
