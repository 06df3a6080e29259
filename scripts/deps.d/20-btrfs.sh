# btrfs sandbox roots: tests build a btrfs filesystem in a sparse image file
# and loop-mount it, so they need mkfs.btrfs (btrfs-progs), the loop driver
# and the btrfs control device. turnsnap itself drives btrfs through ioctls;
# the CLI from btrfs-progs is only used by test setup (mkfs).
apt_need mkfs.btrfs btrfs-progs
apt_need losetup mount
if ! grep -qw btrfs /proc/filesystems; then modprobe btrfs 2>/dev/null || true; fi
grep -qw btrfs /proc/filesystems || { echo "deps: this kernel has no btrfs" >&2; exit 1; }
if [ ! -e /dev/loop-control ]; then modprobe loop 2>/dev/null || true; fi
for dev in /dev/loop-control /dev/btrfs-control; do
  [ -c "$dev" ] || { echo "deps: $dev is missing (btrfs tests loop-mount an image)" >&2; exit 1; }
done
