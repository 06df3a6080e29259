#!/usr/bin/env bash
# Installs everything turnsnap's tests and demo need on a fresh Debian 12
# machine: runs each scripts/deps.d/*.sh in name order (or only the parts
# named as arguments). Every part checks
# before it installs, so a second run costs seconds. Tools that are not
# Debian packages are built or unpacked into $TURNSNAP_CACHE (default
# /var/cache/turnsnap), which survives between runs on the same machine.
# Run as root (make test does).
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "deps: must run as root (mounts, apt-get)" >&2
  exit 1
fi
export TURNSNAP_CACHE="${TURNSNAP_CACHE:-/var/cache/turnsnap}"
mkdir -p "$TURNSNAP_CACHE"
here="$(cd "$(dirname "$0")" && pwd)"

# apt_need CMD PKG...: install PKG unless CMD is on PATH. For deps.d parts.
apt_need() {
  local cmd="$1"; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [ -z "${_apt_updated:-}" ]; then apt-get update -qq; _apt_updated=1; fi
  echo "deps: installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
export -f apt_need

# With arguments, only the parts whose names contain one of them run
# (`deps.sh base proc` for the demo, which needs no MinIO build).
for part in "$here"/deps.d/*.sh; do
  if [ $# -gt 0 ]; then
    want=""
    for w in "$@"; do case "$(basename "$part")" in *"$w"*) want=1 ;; esac; done
    [ -n "$want" ] || continue
  fi
  echo "deps: $(basename "$part")"
  # shellcheck source=/dev/null
  source "$part"
done
echo "deps: ok (cache $TURNSNAP_CACHE)"
