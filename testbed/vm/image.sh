#!/usr/bin/env bash
# Builds (or finds in the cache) the VM image reaplet's VM test boots: a Debian 12 root
# filesystem with systemd and Debian's runc, containerd 2.x (containerd, its runc shim and ctr
# as testbed/containerd.sh builds them from the Go module proxy; systemd cgroup driver, schema-3
# configuration) and the real kubelet as testbed/kube.sh builds it (installed, not enabled: the
# VM test's node boot starts it), Debian's cloud kernel and a tiny busybox initramfs. Prints the
# image directory (vmlinuz, initrd.gz, rootfs.img).
#
#   testbed/vm/image.sh            build if missing or stale, print the directory
#   testbed/vm/image.sh --key      print the cache key only
#
# The cache lives outside the repository, in $REAPLET_CACHE_DIR/vm/<key> (default
# ~/.cache/reaplet); the key covers the package list, the kernel package's version, the host's
# apt sources and every file baked into the image (this script, testbed/vm/guest/* and the
# sha256 of the containerd, shim, ctr and kubelet binaries), so a change to any of them builds a
# new image. Old images are removed after a successful build.
# The image's files are recorded with their sha256 digests (SHA256SUMS) when it is built and
# checked on every reuse (about 7 s for the 2 GiB root filesystem): a broken or truncated image
# is rebuilt. Any failing command stops the script with a message naming the step.
# Needs root and Debian's apt sources; installs qemu-system-x86, mmdebstrap and friends if missing
# (through testbed/testbed.sh apt-install: apt lock timeout and retries).
set -eEuo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}/vm
SUITE=bookworm
# Debian's runc; containerd is the test bed's 2.x (below), not Debian's 1.6
PACKAGES=systemd,systemd-sysv,udev,dbus,kmod,runc,iproute2,busybox-static,procps,mount
SOURCES=/etc/apt/sources.list.d/debian.sources
# the files an image consists of (all of them are covered by its SHA256SUMS)
FILES=(vmlinuz initrd.gz rootfs.img kernel)

log() { printf 'vm-image: %s\n' "$*" >&2; }
die() { printf 'vm-image: ERROR: %s\n' "$*" >&2; exit 1; }

# what the script is doing, for the message of a command that fails
STEP=start
on_err() { # on_err STATUS LINE COMMAND
    # a failed `x=$(...)` was reported inside the substitution already
    case $3 in *'$('*) exit "$1" ;; esac
    printf 'vm-image: ERROR: step "%s" failed: `%s` exited with status %s (image.sh line %s)\n' \
        "$STEP" "$3" "$1" "$2" >&2
    exit "$1"
}
trap 'on_err $? $LINENO "$BASH_COMMAND"' ERR

preflight() {
    [ "$(id -u)" = 0 ] || die "building the VM image needs root (mmdebstrap, file ownership)"
    [ -f "$SOURCES" ] || SOURCES=/etc/apt/sources.list
    [ -f "$SOURCES" ] || die "no apt sources file on this host"
}

install_host_tools() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v depmod >/dev/null || [ -x /sbin/depmod ] || missing+=(kmod)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v mkfs.ext4 >/dev/null || [ -x /sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
    [ -x /bin/busybox ] || missing+=(busybox-static)
    if [ ${#missing[@]} -gt 0 ]; then
        STEP="install ${missing[*]}"
        log "installing ${missing[*]} from Debian's packages (apt-get)"
        bash "$HERE/../testbed.sh" apt-install "${missing[@]}"
    fi
}

kernel_package() {
    # the versioned package behind the cloud kernel meta-package, e.g. linux-image-6.1.0-56-cloud-amd64
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        awk '$1=="Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}'
}

# the directories of the binaries baked into the image: containerd 2.x (testbed/containerd.sh)
# and the kubelet (testbed/kube.sh); each builds what is missing into its cache first
CONTAINERD_BIN=
KUBE_BIN=
binaries() {
    [ -n "$CONTAINERD_BIN" ] && return
    CONTAINERD_BIN=$(bash "$HERE/../containerd.sh" dir)
    KUBE_BIN=$(bash "$HERE/../kube.sh" dir)
    local b
    for b in "$CONTAINERD_BIN"/{containerd,containerd-shim-runc-v2,ctr} "$KUBE_BIN/kubelet"; do
        [ -x "$b" ] || die "no $b"
    done
}

cache_key() {
    local kpkg kver
    kpkg=$(kernel_package)
    [ -n "$kpkg" ] || die "apt knows no linux-image-cloud-amd64 (run apt-get update)"
    kver=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
    {
        echo "$SUITE $PACKAGES $kpkg $kver"
        grep -v '^#' "$SOURCES"
        cat "$HERE/image.sh"
        find "$HERE/guest" -type f | LC_ALL=C sort | xargs cat
        binaries
        sha256sum "$CONTAINERD_BIN"/{containerd,containerd-shim-runc-v2,ctr} "$KUBE_BIN/kubelet" |
            cut -d' ' -f1
    } | sha256sum | cut -c1-16
}

build() {
    local out=$1 work kpkg kver root
    work=$(mktemp -d "$CACHE/build.XXXXXX")
    trap "rm -rf '$work'" EXIT
    root=$work/root
    kpkg=$(kernel_package)
    kver=${kpkg#linux-image-}
    STEP="root filesystem (mmdebstrap)"
    log "building a $SUITE root filesystem ($PACKAGES)"
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" --aptopt='Acquire::Retries "3"' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$SUITE" "$root" "$SOURCES" >&2

    STEP="kernel ($kpkg)"
    log "unpacking $kpkg (not installed: no initramfs-tools in the guest)"
    (cd "$work" && apt-get -o APT::Sandbox::User=root -o Acquire::Retries=3 download -qq "$kpkg" >&2)
    # --keep-directory-symlink: /lib is a symlink to usr/lib in the root filesystem
    dpkg-deb --fsys-tarfile "$work"/"$kpkg"_*.deb |
        tar -x --keep-directory-symlink -C "$root"
    /sbin/depmod -b "$root" "$kver"
    cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"

    STEP="configuring the guest"
    log "configuring the guest"
    echo reaplet-vm >"$root/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 reaplet-vm\n' >"$root/etc/hosts"
    printf 'LABEL=reaplet-vm / ext4 rw,noatime 0 1\n' >"$root/etc/fstab"
    printf 'overlay\n' >"$root/etc/modules-load.d/reaplet-vm.conf"
    binaries
    local b
    for b in containerd containerd-shim-runc-v2 ctr; do
        install -D -m 0755 "$CONTAINERD_BIN/$b" "$root/usr/local/bin/$b"
    done
    install -D -m 0755 "$KUBE_BIN/kubelet" "$root/usr/local/bin/kubelet"
    install -D -m 0644 "$HERE/guest/containerd.toml" "$root/etc/containerd/config.toml"
    install -D -m 0644 "$HERE/guest/containerd.service" "$root/etc/systemd/system/containerd.service"
    install -D -m 0644 "$HERE/guest/kubelet.service" "$root/etc/systemd/system/kubelet.service"
    install -D -m 0755 "$HERE/guest/runner.sh" "$root/usr/local/sbin/reaplet-vm-runner"
    install -D -m 0644 "$HERE/guest/reaplet-vm-runner.service" \
        "$root/etc/systemd/system/reaplet-vm-runner.service"
    ln -sf /etc/systemd/system/containerd.service \
        "$root/etc/systemd/system/multi-user.target.wants/containerd.service"
    ln -sf /etc/systemd/system/reaplet-vm-runner.service \
        "$root/etc/systemd/system/multi-user.target.wants/reaplet-vm-runner.service"
    # no login prompt, no network configuration, no timers in a test VM
    local u
    for u in getty@tty1.service serial-getty@ttyS0.service apt-daily.timer apt-daily-upgrade.timer \
        dpkg-db-backup.timer e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer; do
        ln -sf /dev/null "$root/etc/systemd/system/$u"
    done
    rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/* "$root/boot"/*

    STEP="initramfs"
    log "building the initramfs"
    local ird=$work/initramfs m mods i=0
    mkdir -p "$ird"/{bin,mod,proc,sys,dev,newroot}
    cp /bin/busybox "$ird/bin/busybox"
    mods=$( { /sbin/modprobe -d "$root" -S "$kver" --show-depends virtio_pci
        /sbin/modprobe -d "$root" -S "$kver" --show-depends virtio_blk; } |
        awk '$1=="insmod" && !seen[$2]++ {print $2}')
    for m in $mods; do
        i=$((i + 1))
        cp "$m" "$ird/mod/$(printf %02d "$i")-$(basename "$m")"
    done
    [ "$i" -gt 0 ] || die "no virtio modules found in $kpkg"
    install -m 0755 "$HERE/guest/init" "$ird/init"
    (cd "$ird" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

    STEP="ext4 image"
    log "writing the ext4 image"
    /sbin/mkfs.ext4 -q -F -L reaplet-vm -d "$root" "$work/rootfs.img" 2G >&2
    rm -rf "$root"
    echo "$kpkg" >"$work/kernel"
    mkdir -p "$out.new"
    mv "$work/vmlinuz" "$work/initrd.gz" "$work/rootfs.img" "$work/kernel" "$out.new/"
    rm -rf "$out"
    mv "$out.new" "$out"
}

# image_ok DIR: every file of the image is there and matches the digest recorded at build time
image_ok() {
    local f
    [ -f "$1/SHA256SUMS" ] || return 1
    for f in "${FILES[@]}"; do
        grep -q " $f\$" "$1/SHA256SUMS" || return 1
    done
    (cd "$1" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1)
}

# record_digests DIR: writes SHA256SUMS last, so an image without it was never finished
record_digests() {
    (cd "$1" && sha256sum "${FILES[@]}" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
}

main() {
    preflight
    mkdir -p "$CACHE"
    if [ "${1:-}" != --key ]; then install_host_tools; fi
    STEP="cache key"
    local key out
    key=$(cache_key)
    if [ "${1:-}" = --key ]; then echo "$key"; return; fi
    out=$CACHE/$key
    # one build at a time; a second caller waits and then finds the image
    exec 9>"$CACHE/.lock"
    flock 9
    STEP="digest check"
    [ -e "$out" ] && log "checking the cached image $key against its sha256 digests"
    if [ -e "$out" ] && ! image_ok "$out"; then
        log "the cached image in $out does not match its recorded sha256 digests (broken, truncated or unfinished): rebuilding"
        rm -rf "$out"
    fi
    if [ ! -e "$out" ]; then
        local t0=$SECONDS
        build "$out"
        STEP="recording digests"
        record_digests "$out"
        log "image $key built in $((SECONDS - t0)) s"
        # older images are stale now
        find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name 'build.*' -exec rm -rf {} +
    fi
    exec 9>&-
    echo "$out"
}

# run unless sourced (tests/scripts.rs sources it to drive main with a stub build)
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
