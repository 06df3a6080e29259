# Core: overlayfs in the kernel, Go modules downloaded.
apt_need mount mount
if ! grep -qw overlay /proc/filesystems; then modprobe overlay 2>/dev/null || true; fi
grep -qw overlay /proc/filesystems || { echo "deps: this kernel has no overlayfs" >&2; exit 1; }
go mod download
# Directory-rename tests rename base directories the way tools in a sandbox
# do (git mv, Python's os.rename).
apt_need git git
apt_need python3 python3
