# The bench's named image "debian-bookworm" (docs/BENCH.md, a trace's
# base "image": {"name": "debian-bookworm"}): a Debian 12 rootfs from
# `debootstrap --variant=minbase bookworm` plus python3, python3-pytest,
# git, sqlite3 and nodejs, for traces written outside the project, which
# need more than busybox (issue 26: a Python project with pytest, a Node
# project). v2 added nodejs and python3-pytest.
# Built once (a few minutes: debootstrap talks only to Debian's archive)
# into $TURNSNAP_CACHE/images/debian-bookworm-v$VERSION/rootfs; bump
# _debimg_version when the recipe changes, so every machine rebuilds.
# packages.txt next to rootfs lists what went in (dpkg-query).
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
_debimg_version=2
_debimg_dir="$TURNSNAP_CACHE/images/debian-bookworm-v$_debimg_version"
if [ -f "$_debimg_dir/.complete" ]; then
  echo "deps: debian-bookworm image v$_debimg_version present"
else
  apt_need debootstrap debootstrap
  echo "deps: building the debian-bookworm image v$_debimg_version (debootstrap, a few minutes)"
  mkdir -p "$TURNSNAP_CACHE/images"
  rm -rf "$TURNSNAP_CACHE"/images/debian-bookworm-build.* # left by an interrupted build
  # Built aside and renamed, so an interrupted build is never taken for
  # an image.
  _debimg_tmp="$(mktemp -d "$TURNSNAP_CACHE/images/debian-bookworm-build.XXXXXX")"
  # The machine's own mirror: the first URIs line of its sources (the main
  # archive), as scripts/criu-install.sh takes it.
  _debimg_uri="$( (grep -m1 '^URIs:' /etc/apt/sources.list.d/debian.sources || true) | awk '{print $2}')"
  [ -n "$_debimg_uri" ] || { echo "deps: no URIs line in /etc/apt/sources.list.d/debian.sources" >&2; false; }
  debootstrap --variant=minbase --include=python3,python3-pytest,git,sqlite3,nodejs bookworm "$_debimg_tmp/rootfs" "$_debimg_uri" \
    >"$_debimg_tmp/debootstrap.log" 2>&1 || { tail -20 "$_debimg_tmp/debootstrap.log" >&2; false; }
  # The package caches are 100+ MB a trace's sandbox never reads.
  rm -rf "$_debimg_tmp"/rootfs/var/cache/apt/archives/*.deb "$_debimg_tmp"/rootfs/var/lib/apt/lists/*
  chroot "$_debimg_tmp/rootfs" dpkg-query -W -f '${Package} ${Version}\n' >"$_debimg_tmp/packages.txt"
  # What the traces run must run (pytest and node in particular: a
  # package that installs but does not start would fail every trace).
  chroot "$_debimg_tmp/rootfs" python3 -c 'import sqlite3'
  chroot "$_debimg_tmp/rootfs" git --version >/dev/null
  chroot "$_debimg_tmp/rootfs" sqlite3 --version >/dev/null
  chroot "$_debimg_tmp/rootfs" python3 -m pytest --version >/dev/null 2>&1 ||
    { echo "deps: python3 -m pytest --version fails in the debian-bookworm image" >&2; false; }
  chroot "$_debimg_tmp/rootfs" node --version >/dev/null ||
    { echo "deps: node --version fails in the debian-bookworm image" >&2; false; }
  touch "$_debimg_tmp/.complete"
  rm -rf "$_debimg_dir"
  mv "$_debimg_tmp" "$_debimg_dir"
  # Older recipes' images: nothing reads them once this one is complete.
  for _debimg_old in "$TURNSNAP_CACHE"/images/debian-bookworm-v*; do
    [ "$_debimg_old" = "$_debimg_dir" ] || rm -rf "$_debimg_old"
  done
  echo "deps: debian-bookworm image built: $(wc -l <"$_debimg_dir/packages.txt") packages, $(du -sh "$_debimg_dir/rootfs" | cut -f1)"
fi
unset _debimg_version _debimg_dir _debimg_tmp _debimg_uri _debimg_old
