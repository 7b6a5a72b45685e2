#!/usr/bin/env bash
# reaplet's test bed: a private containerd on its own socket, state and cgroup root, with
# busybox and pause images built locally (no registry is reachable). The runtime is containerd
# 2.x built from the Go module proxy (testbed/containerd.sh; the runtime Kubernetes 1.36
# supports), or Debian's containerd 1.6 with REAPLET_TESTBED_RUNTIME=debian (the compatibility
# job: reaplet also stands by on older nodes). runc is Debian's either way.
#
#   testbed/testbed.sh install   apt-get install containerd, runc, busybox-static, gcc, dbus-daemon, chromium, jq, curl if missing
#   testbed/testbed.sh images    build the OCI image tarballs (cached under $REAPLET_CACHE_DIR,
#                                with their sha256 digests: a broken or truncated one is rebuilt)
#   testbed/testbed.sh start     install + images + start containerd + import images (idempotent);
#                                builds containerd 2.x first when it is not cached (about 10 min)
#   testbed/testbed.sh ctr ARGS  the running instance's own ctr on its socket (namespace k8s.io)
#   testbed/testbed.sh stop      kill every pod, stop containerd, unmount, remove leftover cgroups
#   testbed/testbed.sh restart   stop containerd alone (pods and their shims keep running), start it
#   testbed/testbed.sh status    exit 0 when the private containerd is running
#   testbed/testbed.sh apt-install PKG...  apt-get install with a lock timeout and retries
#                                (what install does; testbed/vm/image.sh uses it too)
#   testbed/testbed.sh reaplet-image BINARY
#                                the DaemonSet's image (deploy/daemonset.yaml, `reaplet:local`):
#                                BINARY (the release build) stripped, with the shared libraries
#                                it links, as an OCI tarball BINARY-image.tar (rebuilt when BINARY
#                                changed); prints its path. Load it on a node with
#                                `ctr -n k8s.io images import --snapshotter overlayfs TAR`
#
# Settings (environment): REAPLET_TESTBED_DIR (default /tmp/reaplet-testbed),
# REAPLET_CACHE_DIR (default ~/.cache/reaplet), REAPLET_TESTBED_CGROUP_ROOT (default /reaplet-testbed:
# the cgroup root the test pods go below, in every hierarchy, and that stop cleans),
# REAPLET_APT_LOCK_TIMEOUT (seconds apt waits for another apt/dpkg to finish; default 300),
# REAPLET_TESTBED_RUNTIME (containerd2, the default, or debian).
# The socket is $REAPLET_TESTBED_DIR/containerd.sock.
# Any failing command stops the script with a message naming the step and the command
# (errexit reaches into command substitutions and functions; pipes fail on any member).
set -eEuo pipefail
shopt -s inherit_errexit

DIR=${REAPLET_TESTBED_DIR:-/tmp/reaplet-testbed}
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}
SOCK=$DIR/containerd.sock
CGROUP_ROOT=${REAPLET_TESTBED_CGROUP_ROOT:-reaplet-testbed}
CGROUP_ROOT=${CGROUP_ROOT#/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUSYBOX_IMAGE=reaplet.test/busybox:latest
PAUSE_IMAGE=reaplet.test/pause:latest
RUNTIME=${REAPLET_TESTBED_RUNTIME:-containerd2}

log() { printf 'testbed: %s\n' "$*" >&2; }
die() { printf 'testbed: ERROR: %s\n' "$*" >&2; exit 1; }

# what the script is doing, for the message of a command that fails
STEP="${1:-usage}"
on_err() { # on_err STATUS LINE COMMAND
    # a failed `x=$(...)` was reported inside the substitution already
    case $3 in *'$('*) exit "$1" ;; esac
    printf 'testbed: ERROR: step "%s" failed: `%s` exited with status %s (testbed.sh line %s)\n' \
        "$STEP" "$3" "$1" "$2" >&2
    exit "$1"
}
trap 'on_err $? $LINENO "$BASH_COMMAND"' ERR

need_root() {
    [ "$(id -u)" = 0 ] || die "the test bed needs root (containerd, cgroups, mounts); run as root"
}

# apt-get with a lock timeout (another apt or unattended-upgrades may hold dpkg's lock) and
# download retries
apt_get() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="${REAPLET_APT_LOCK_TIMEOUT:-300}" \
        -o Acquire::Retries=3 "$@"
}

# apt-get update, retried with backoff (5, 10, 20 s) on transient failures (mirror, network, lock)
apt_update() {
    local attempt delay=5 out=
    for attempt in 1 2 3 4; do
        if out=$(apt_get update -qq 2>&1); then return 0; fi
        [ "$attempt" = 4 ] && break
        log "apt-get update failed (attempt $attempt of 4; retrying in $delay s): $(printf '%s\n' "$out" | tail -1)"
        sleep "$delay"
        delay=$((delay * 2))
    done
    printf '%s\n' "$out" >&2
    die "install step \"apt-get update\" failed 4 times (apt's output above); check the network and the apt sources"
}

# apt_install PKG...: update the package lists, install, or stop with a message naming the step
cmd_apt_install() {
    [ $# -gt 0 ] || die "apt-install: which packages?"
    need_root
    STEP="apt-get update"
    apt_update
    STEP="apt-get install $*"
    local out rc=0
    out=$(apt_get install -y -qq --no-install-recommends "$@" 2>&1) || rc=$?
    if [ "$rc" != 0 ]; then
        printf '%s\n' "$out" | tail -20 >&2
        die "install step \"apt-get install $*\" failed with status $rc (apt's output above)"
    fi
}

cmd_install() {
    STEP=install
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 || missing+=(busybox-static)
    command -v gcc >/dev/null || missing+=(gcc libc6-dev)
    # a private bus for the shutdown manager's test (tests/shutdown.rs)
    command -v dbus-daemon >/dev/null || missing+=(dbus-daemon)
    # headless rendering of the timeline's SVG chart (tests/timeline.rs)
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    # scripts/test.sh reads cargo's metadata (the test binaries it spreads over lanes)
    command -v jq >/dev/null || missing+=(jq)
    # the kubelet's /stats/summary, read with a client certificate (tests/kubelet_reasons.rs)
    command -v curl >/dev/null || missing+=(curl)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]} from Debian's packages (apt-get)"
        local t0=$SECONDS
        cmd_apt_install "${missing[@]}"
        local c
        for c in containerd runc gcc dbus-daemon chromium jq curl; do
            command -v "$c" >/dev/null ||
                die "install step \"apt-get install ${missing[*]}\" succeeded but $c is still not on PATH"
        done
        log "installed ${missing[*]} in $((SECONDS - t0)) s"
    fi
    if ! file_is_static /bin/busybox; then
        log "installing busybox-static (the image needs a static busybox)"
        cmd_apt_install busybox-static
        file_is_static /bin/busybox || die "busybox-static is installed but /bin/busybox is not static"
    fi
}

file_is_static() {
    # a static binary has no PT_INTERP; ldd says so
    ! ldd "$1" >/dev/null 2>&1
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# write_blob FILE LAYOUT -> prints "sha256:<hex> <size>" and stores FILE in the layout's blobs
write_blob() {
    local f=$1 layout=$2 d size
    d=$(sha "$f")
    size=$(stat -c %s "$f")
    mkdir -p "$layout/blobs/sha256"
    cp "$f" "$layout/blobs/sha256/$d"
    printf 'sha256:%s %s\n' "$d" "$size"
}

det_tar() { # det_tar OUT DIR: deterministic tar of DIR's contents
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
        -C "$2" -cf "$1" .
}

# build_image OUT_TAR ROOTFS ENTRYPOINT_JSON NAME...
build_image() {
    local out=$1 rootfs=$2 entry=$3; shift 3
    local work layout blob ldig lsize cdig csize mdig msize names=""
    work=$(mktemp -d); layout=$work/layout; mkdir -p "$layout"
    det_tar "$work/layer.tar" "$rootfs"
    # (not `read < <(...)`: a process substitution's failure would go unnoticed)
    blob=$(write_blob "$work/layer.tar" "$layout")
    read -r ldig lsize <<<"$blob"
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin:/usr/bin:/sbin"],"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
        "$entry" "$ldig" >"$work/config.json"
    blob=$(write_blob "$work/config.json" "$layout")
    read -r cdig csize <<<"$blob"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
        "$cdig" "$csize" "$ldig" "$lsize" >"$work/manifest.json"
    blob=$(write_blob "$work/manifest.json" "$layout")
    read -r mdig msize <<<"$blob"
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
    { sha /bin/busybox; cat "$HERE/testbed.sh" "$HERE/pause.c"; } | sha256sum | cut -c1-16
}

# images_ok DIR: both tarballs are there and match the digests recorded when they were built
images_ok() {
    [ -f "$1/SHA256SUMS" ] && grep -q ' busybox.tar$' "$1/SHA256SUMS" &&
        grep -q ' pause.tar$' "$1/SHA256SUMS" &&
        (cd "$1" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1)
}

cmd_images() {
    cmd_install
    STEP=images
    local key out
    key=$(images_key)
    out=$CACHE/images/$key
    mkdir -p "$CACHE/images"
    # one build at a time (the integration tests start many test beds at once); the lock's
    # descriptor is closed after the group, so containerd never inherits it
    {
        flock 8
        if ! images_ok "$out"; then
            if [ -e "$out" ]; then
                log "cached images in $out do not match their recorded sha256 digests (broken or truncated): rebuilding"
            fi
            build_images "$out"
            images_ok "$out" || die "the images just built in $out do not match their digests"
        fi
    } 8>"$CACHE/images/.lock"
    echo "$out"
}

# build_images OUT: builds both tarballs in a scratch directory, records their digests
# (SHA256SUMS) and moves the result into place whole: a failed build never leaves a cache entry
build_images() {
    local out=$1 t0=$SECONDS work
    log "building the busybox and pause images into $out"
    work=$(mktemp -d "$CACHE/images/build.XXXXXX")
    # shellcheck disable=SC2064 # the path now: $work is local
    trap "rm -rf '$work'" EXIT
    # busybox: /bin/busybox and one symlink per applet, passwd/group, /tmp 1777
    STEP="images: busybox root filesystem"
    local r=$work/busybox applets a
    mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/root" "$r/var/run"
    cp /bin/busybox "$r/bin/busybox"
    applets=$(/bin/busybox --list)
    for a in $applets; do
        [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"
    done
    chmod 1777 "$r/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
    mkdir -p "$work/out"
    STEP="images: busybox image"
    build_image "$work/out/busybox.tar" "$r" '["/bin/sh"]' "$BUSYBOX_IMAGE"
    # pause: a static C binary (exit 0 on TERM/INT, reaps children)
    STEP="images: pause binary (gcc -static)"
    local p=$work/pause
    mkdir -p "$p"
    gcc -static -Os -o "$p/pause" "$HERE/pause.c"
    strip "$p/pause" 2>/dev/null || true
    STEP="images: pause image"
    build_image "$work/out/pause.tar" "$p" '["/pause"]' "$PAUSE_IMAGE" registry.k8s.io/pause:3.6
    (cd "$work/out" && sha256sum busybox.tar pause.tar >SHA256SUMS)
    rm -rf "$out"
    mv "$work/out" "$out"
    rm -rf "$work"
    STEP=images
    log "images built in $((SECONDS - t0)) s"
}

# the name the DaemonSet's `image: reaplet:local` resolves to in containerd
REAPLET_IMAGE=docker.io/library/reaplet:local

# cmd_reaplet_image BINARY: see the usage above. The root filesystem: /usr/bin/reaplet, the
# libraries and loader `ldd` names at the paths it names, /tmp, /etc/passwd; nothing else (no
# shell: the image runs reaplet and nothing else)
cmd_reaplet_image() {
    local bin=${1:-} out key work r lib
    [ -n "$bin" ] || die "usage: testbed.sh reaplet-image BINARY (e.g. target/release/reaplet)"
    [ -x "$bin" ] || die "$bin: no such executable; build it first (cargo build --release --locked)"
    STEP="reaplet-image"
    out=$bin-image.tar
    key=$({ sha "$bin"; sha "$0"; } | sha256sum | cut -c1-16)
    if [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
        printf '%s\n' "$out"
        return
    fi
    work=$(mktemp -d)
    # shellcheck disable=SC2064 # the path now: $work is local
    trap "rm -rf '$work'" EXIT
    r=$work/rootfs
    mkdir -p "$r/usr/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/run"
    chmod 1777 "$r/tmp"
    STEP="reaplet-image: strip the binary"
    strip -o "$r/usr/bin/reaplet" "$bin"
    STEP="reaplet-image: shared libraries (ldd)"
    for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
        mkdir -p "$r$(dirname "$lib")"
        cp -L "$lib" "$r$lib"
    done
    printf 'root:x:0:0:root:/:/usr/bin/reaplet\n' >"$r/etc/passwd"
    printf 'root:x:0:\n' >"$r/etc/group"
    STEP="reaplet-image: image"
    build_image "$out.tmp" "$r" '["/usr/bin/reaplet"]' "$REAPLET_IMAGE"
    mv "$out.tmp" "$out"
    printf '%s\n' "$key" >"$out.key"
    rm -rf "$work"
    log "reaplet image built: $out ($REAPLET_IMAGE)"
    printf '%s\n' "$out"
}

# runtime_bin: the directory of the runtime's containerd, shim and ctr (containerd 2.x is built
# when missing)
runtime_bin() {
    case $RUNTIME in
    containerd2) bash "$HERE/containerd.sh" dir ;;
    debian) dirname "$(command -v containerd)" ;;
    *) die "REAPLET_TESTBED_RUNTIME=$RUNTIME: the runtime is containerd2 (the default) or debian" ;;
    esac
}

# the running instance's ctr ($DIR/bin is the runtime's directory, linked at start)
ctr_() {
    if [ -x "$DIR/bin/ctr" ]; then "$DIR/bin/ctr" --address "$SOCK" "$@"; else ctr --address "$SOCK" "$@"; fi
}

running() {
    [ -f "$DIR/containerd.pid" ] && kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null &&
        [ -S "$SOCK" ]
}

write_config() {
    mkdir -p "$DIR"/{root,state,opt,runc,logs,cni/bin,cni/conf}
    case $RUNTIME in
    debian) write_config_v2 ;;
    *) write_config_v3 ;;
    esac >"$DIR/config.toml"
}

# what both schemas share: this instance's own paths and sockets
config_paths() {
    cat <<EOF
root = "$DIR/root"
state = "$DIR/state"
oom_score = 0

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/opt"
EOF
}

# cri_runtime PLUGIN [LINE]: the CRI runtime settings both schemas share, under PLUGIN (2.x's
# runtime plugin, 1.6's CRI plugin): the flags this machine needs (see
# ../shared/reference/testbed.md), runc with the cgroupfs driver and its own root; LINE goes
# into the containerd table (1.6's snapshotter)
cri_runtime() {
    cat <<EOF
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  [plugins.$1.containerd]
    ${2:-}
    default_runtime_name = "runc"
    [plugins.$1.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.$1.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$DIR/runc"
EOF
}

# containerd 2.x: schema 3 (the CRI plugin split into runtime and images plugins; the sandbox
# image is a pinned image; NRI off: its socket is one path for the whole machine, and many test
# beds run at once)
write_config_v3() {
    printf 'version = 3\n'
    config_paths
    cat <<EOF

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
$(cri_runtime '"io.containerd.cri.v1.runtime"')
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$DIR/cni/bin"]
    conf_dir = "$DIR/cni/conf"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
}

# Debian's containerd 1.6: schema 2
write_config_v2() {
    printf 'version = 2\n'
    config_paths
    cat <<EOF

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
$(cri_runtime '"io.containerd.grpc.v1.cri"' 'snapshotter = "overlayfs"')
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
    local images
    images=$(cmd_images)
    STEP=start
    if running; then
        log "containerd already running on $SOCK"
        return
    fi
    local bin
    bin=$(runtime_bin)
    write_config
    ln -sfn "$bin" "$DIR/bin"
    log "starting containerd ($RUNTIME: $("$bin/containerd" --version | head -1)) on $SOCK"
    # the shim containerd starts is the first containerd-shim-runc-v2 on its PATH: its own
    PATH=$bin:$PATH "$bin/containerd" --config "$DIR/config.toml" >"$DIR/containerd.log" 2>&1 &
    echo $! >"$DIR/containerd.pid"
    local i
    for i in $(seq 1 200); do
        if [ -S "$SOCK" ] && ctr_ version >/dev/null 2>&1; then break; fi
        kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null || { tail -20 "$DIR/containerd.log" >&2; die "containerd exited"; }
        sleep 0.05
    done
    [ -S "$SOCK" ] || die "containerd did not open $SOCK within 10 s (see $DIR/containerd.log)"
    STEP="start: import the images"
    ctr_ -n k8s.io images import --snapshotter overlayfs "$images/busybox.tar" >/dev/null
    ctr_ -n k8s.io images import --snapshotter overlayfs "$images/pause.tar" >/dev/null
    log "ready: socket $SOCK, images $BUSYBOX_IMAGE $PAUSE_IMAGE"
}

cmd_stop() {
    need_root
    if [ -S "$SOCK" ] && running; then
        local t
        # pods first: kill every task so no process of the test bed outlives it
        for t in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null || true); do
            ctr_ -n k8s.io tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
        done
        sleep 0.3
        for t in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null || true); do
            ctr_ -n k8s.io tasks rm -f "$t" >/dev/null 2>&1 || true
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
status) running || exit 1 ;;
apt-install) shift; cmd_apt_install "$@" ;;
ctr) shift; running || die "no test bed running in $DIR"; ctr_ -n k8s.io "$@" ;;
reaplet-image) shift; cmd_reaplet_image "$@" ;;
*) sed -n '2,33p' "$0"; exit 64 ;;
esac
