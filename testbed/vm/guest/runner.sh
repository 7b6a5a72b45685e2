#!/bin/bash
# reaplet VM test runner (guest side). The host attaches two raw disks, found here by their
# virtio serial: reaplet-in (a tar: the guest driver `vm-guest`, reaplet's two Debian packages,
# the test-hooks reaplet for the watchdog scenario, the config, the images) and reaplet-out
# (written here: a tar of the results and the logs, also when something failed).
# The kernel command line names the boot: reaplet.boot=agent (reaplet beside containerd, no API
# server) or reaplet.boot=node (the real kubelet and reaplet in standby, the API server on the
# host reached through qemu's user-mode network: its address is configured here).
set -u
# The last scenario powers the guest off: systemd then stops this unit, SIGTERM to every process
# in it. This script and tee ignore it so the results are still collected below; the driver gets
# the default disposition back and handles it in that scenario (its end).
trap '' TERM
by_serial() {
    local d
    for d in /sys/block/vd*; do
        [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
    done
    return 1
}
# the inputs (a few hundred MB of debug binaries) go on the root disk, not on a small tmpfs
IN=/var/tmp/reaplet-vm/in
OUT=/var/tmp/reaplet-vm/out
rm -rf "$IN" "$OUT"
mkdir -p "$IN" "$OUT"
out=$(by_serial reaplet-out) || { echo "runner: no reaplet-out disk"; exit 1; }
boot=agent
for w in $(cat /proc/cmdline); do
    case $w in reaplet.boot=*) boot=${w#reaplet.boot=} ;; esac
done
# the node boot's network: qemu's user-mode network (restrict=on: nothing but the forwards the
# host set up, 10.0.2.100:6443 the API server and 10.0.2.101:80 its audit log); the first
# interface that is not loopback, once udev has named it
net_up() {
    local i dev=
    for i in $(seq 1 300); do
        for d in /sys/class/net/*; do
            [ "${d##*/}" = lo ] || { dev=${d##*/}; break; }
        done
        [ -n "$dev" ] && break
        sleep 0.1
    done
    [ -n "$dev" ] || { echo "runner: no network interface"; return 1; }
    ip link set "$dev" up && ip addr add 10.0.2.15/24 dev "$dev" &&
        ip route add default via 10.0.2.2 dev "$dev" && echo "runner: $dev 10.0.2.15/24"
}
rc=0
if ! in=$(by_serial reaplet-in); then
    echo "runner: no reaplet-in disk" | tee "$OUT/driver.log"
    rc=1
elif ! tar -xf "$in" -C "$IN" 2>"$OUT/driver.log"; then
    echo "runner: cannot read the input disk" | tee -a "$OUT/driver.log"
    rc=1
else
    echo "runner: guest driver starting ($boot boot)"
    [ "$boot" = node ] && { net_up 2>&1 | tee -a "$OUT/driver.log"; }
    (trap - TERM; exec "$IN/vm-guest" --guest "$IN" "$OUT" "$boot") 2>&1 | tee -a "$OUT/driver.log"
    rc=${PIPESTATUS[0]}
fi
echo "$rc" >"$OUT/rc"
journalctl -b --no-pager -o short-monotonic -u reaplet >"$OUT/reaplet.journal" 2>&1
journalctl -b --no-pager -o short-monotonic -u containerd >"$OUT/containerd.journal" 2>&1
[ "$boot" = node ] && journalctl -b --no-pager -o short-monotonic -u kubelet >"$OUT/kubelet.journal" 2>&1
journalctl -b --no-pager -o short-monotonic >"$OUT/boot.journal" 2>&1
tar -cf "$out" -C "$OUT" . && sync
echo "runner: done (driver exit $rc)"
