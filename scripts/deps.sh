#!/usr/bin/env bash
# Installs what turnsnap's tests and demo need on a fresh Debian 12 machine.
# Idempotent: each part is checked first and installed only when missing, so
# a second run costs a few stat calls. Run as root (make test does).
set -euo pipefail

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "deps: must run as root (overlay mounts, apt-get)" >&2
    exit 1
  fi
}

# Debian packages the tests use, as "command:package" pairs.
APT_PARTS=(
  "mount:mount"
)

apt_install() {
  local missing=()
  for part in "${APT_PARTS[@]}"; do
    command -v "${part%%:*}" >/dev/null 2>&1 || missing+=("${part##*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
}

check_overlay() {
  if ! grep -qw overlay /proc/filesystems; then
    modprobe overlay 2>/dev/null || true
  fi
  grep -qw overlay /proc/filesystems || { echo "deps: this kernel has no overlayfs" >&2; exit 1; }
}

need_root
apt_install
check_overlay
go mod download
echo "deps: ok"
