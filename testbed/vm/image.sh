#!/usr/bin/env bash
# Builds (or finds in the cache) the VM image reaplet's VM test boots: a Debian 12 root
# filesystem with systemd, containerd (systemd cgroup driver) and runc, Debian's cloud kernel and
# a tiny busybox initramfs. Prints the image directory (vmlinuz, initrd.gz, rootfs.img).
#
#   testbed/vm/image.sh            build if missing or stale, print the directory
#   testbed/vm/image.sh --key      print the cache key only
#
# The cache lives outside the repository, in $REAPLET_CACHE_DIR/vm/<key> (default
# ~/.cache/reaplet); the key covers the package list, the kernel package's version, the host's
# apt sources and every file baked into the image (this script and testbed/vm/guest/*), so a
# change to any of them builds a new image. Old images are removed after a successful build.
# Needs root and Debian's apt sources; installs qemu-system-x86, mmdebstrap and friends if missing.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}/vm
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,udev,dbus,kmod,containerd,runc,iproute2,busybox-static,procps
SOURCES=/etc/apt/sources.list.d/debian.sources

log() { printf 'vm-image: %s\n' "$*" >&2; }
die() { printf 'vm-image: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "building the VM image needs root (mmdebstrap, file ownership)"
[ -f "$SOURCES" ] || SOURCES=/etc/apt/sources.list
[ -f "$SOURCES" ] || die "no apt sources file on this host"

install_host_tools() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v depmod >/dev/null || [ -x /sbin/depmod ] || missing+=(kmod)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v mkfs.ext4 >/dev/null || [ -x /sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
    [ -x /bin/busybox ] || missing+=(busybox-static)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]} from Debian's packages"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

kernel_package() {
    # the versioned package behind the cloud kernel meta-package, e.g. linux-image-6.1.0-56-cloud-amd64
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        awk '$1=="Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}'
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
    } | sha256sum | cut -c1-16
}

build() {
    local out=$1 work kpkg kver root
    work=$(mktemp -d "$CACHE/build.XXXXXX")
    trap "rm -rf '$work'" EXIT
    root=$work/root
    kpkg=$(kernel_package)
    kver=${kpkg#linux-image-}
    log "building a $SUITE root filesystem ($PACKAGES)"
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$SUITE" "$root" "$SOURCES" >&2

    log "unpacking $kpkg (not installed: no initramfs-tools in the guest)"
    (cd "$work" && apt-get -o APT::Sandbox::User=root download -qq "$kpkg" >&2)
    # --keep-directory-symlink: /lib is a symlink to usr/lib in the root filesystem
    dpkg-deb --fsys-tarfile "$work"/"$kpkg"_*.deb |
        tar -x --keep-directory-symlink -C "$root"
    /sbin/depmod -b "$root" "$kver"
    cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"

    log "configuring the guest"
    echo reaplet-vm >"$root/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 reaplet-vm\n' >"$root/etc/hosts"
    printf 'LABEL=reaplet-vm / ext4 rw,noatime 0 1\n' >"$root/etc/fstab"
    printf 'overlay\n' >"$root/etc/modules-load.d/reaplet-vm.conf"
    install -D -m 0644 "$HERE/guest/containerd.toml" "$root/etc/containerd/config.toml"
    install -D -m 0755 "$HERE/guest/runner.sh" "$root/usr/local/sbin/reaplet-vm-runner"
    install -D -m 0644 "$HERE/guest/reaplet-vm-runner.service" \
        "$root/etc/systemd/system/reaplet-vm-runner.service"
    ln -sf /lib/systemd/system/containerd.service \
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

    log "building the initramfs"
    local ird=$work/initramfs m i=0
    mkdir -p "$ird"/{bin,mod,proc,sys,dev,newroot}
    cp /bin/busybox "$ird/bin/busybox"
    for m in $( { /sbin/modprobe -d "$root" -S "$kver" --show-depends virtio_pci
        /sbin/modprobe -d "$root" -S "$kver" --show-depends virtio_blk; } |
        awk '$1=="insmod" && !seen[$2]++ {print $2}'); do
        i=$((i + 1))
        cp "$m" "$ird/mod/$(printf %02d "$i")-$(basename "$m")"
    done
    [ "$i" -gt 0 ] || die "no virtio modules found in $kpkg"
    install -m 0755 "$HERE/guest/init" "$ird/init"
    (cd "$ird" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

    log "writing the ext4 image"
    /sbin/mkfs.ext4 -q -F -L reaplet-vm -d "$root" "$work/rootfs.img" 2G >&2
    rm -rf "$root"
    echo "$kpkg" >"$work/kernel"
    mkdir -p "$out.new"
    mv "$work/vmlinuz" "$work/initrd.gz" "$work/rootfs.img" "$work/kernel" "$out.new/"
    rm -rf "$out"
    mv "$out.new" "$out"
}

main() {
    mkdir -p "$CACHE"
    if [ "${1:-}" != --key ]; then install_host_tools; fi
    local key out
    key=$(cache_key)
    if [ "${1:-}" = --key ]; then echo "$key"; return; fi
    out=$CACHE/$key
    # one build at a time; a second caller waits and then finds the image
    exec 9>"$CACHE/.lock"
    flock 9
    if [ ! -f "$out/rootfs.img" ]; then
        local t0=$SECONDS
        build "$out"
        log "image $key built in $((SECONDS - t0)) s"
        # older images are stale now
        find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name 'build.*' -exec rm -rf {} +
    fi
    echo "$out"
}

main "$@"
