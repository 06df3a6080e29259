# Processes (package proc): runc runs sandboxes as OCI containers,
# busybox-static provides the test rootfs (/bin/busybox), and CRIU 4.1.1 is
# unpacked into a private prefix under $TURNSNAP_CACHE/criu (see
# scripts/criu-install.sh and docs/PROCESSES.md).
apt_need runc runc
apt_need busybox busybox-static
"$(dirname "${BASH_SOURCE[0]}")/../criu-install.sh"
