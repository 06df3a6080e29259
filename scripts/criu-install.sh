#!/usr/bin/env bash
# Installs CRIU >= 4.2 from Debian's archive into a private prefix, following
# the recipe ../shared/ENVIRONMENT.md verified for trixie's 4.1.1, with one
# change: the suite is forky (CRIU 4.2.1), because CRIU 4.1.1 cannot dump any
# TCP socket on kernels >= 6.16 ("sockets: Can't get 1:16 opt: Operation not
# supported"; fixed in CRIU 4.2, see docs/PROCESSES.md). Debian 12's own criu
# (3.17.1) fails on this kernel ("vdso: Unexpected rt vDSO area bounds"), and
# CRIU 4.x needs glibc >= 2.38, so it runs with its suite's own loader and
# libraries instead of the system's. The system's apt state (sources, lists,
# status, cache, lock) is never touched: apt-get runs with a private config
# under the cache.
#
# Layout under $TURNSNAP_CACHE/criu (default /var/cache/turnsnap/criu):
#   apt/    private sources (package lists only while downloading)
#   debs/   the downloaded .debs (kept: a second run downloads nothing)
#   root/   the unpacked prefix
#   criu    the wrapper every turnsnap part calls
#
# Idempotent: when the wrapper exists and reports a CRIU >= 4.2, the script
# exits at once. Run as root.
set -euo pipefail

suite="forky"
min_major=4 min_minor=2
cache="${TURNSNAP_CACHE:-/var/cache/turnsnap}/criu"
wrapper="$cache/criu"
root="$cache/root"
debs="$cache/debs"
priv="$cache/apt"

# criu and every library it loads, with their own dependencies, that
# Debian 12's glibc 2.36 cannot provide (the verified trixie list, with
# forky's libnet9 in place of libnet1).
pkgs=(criu libcompel1 libc6 libgnutls30t64 libnftables1 libnl-3-200
  libprotobuf-c1 libbsd0 libnet9 libuuid1 libmd0 libidn2-0 libunistring5
  libtasn1-6 libnettle8t64 libhogweed6t64 libgmp10 libp11-kit0 libffi8
  libjansson4 libmnl0 libnftnl11 libxtables12 libedit2 libtinfo6)

# version_ok WRAPPER: the wrapper runs and reports CRIU >= min_major.min_minor.
version_ok() {
  local v major minor
  v="$("$1" --version 2>/dev/null | sed -n 's/^Version: //p')" || return 1
  [ -n "$v" ] || return 1
  major="${v%%.*}"; minor="${v#*.}"; minor="${minor%%.*}"
  [ "$major" -gt "$min_major" ] || { [ "$major" -eq "$min_major" ] && [ "$minor" -ge "$min_minor" ]; }
}

if [ -x "$wrapper" ] && version_ok "$wrapper"; then
  echo "criu-install: $("$wrapper" --version | head -n1) ready at $wrapper"
  exit 0
fi

mkdir -p "$debs" "$priv/src" "$priv/lists/partial" "$priv/cache/archives/partial"

have_all_debs() {
  local p
  for p in "${pkgs[@]}"; do
    compgen -G "$debs/${p}_*.deb" >/dev/null || return 1
  done
}

if ! have_all_debs; then
  # The machine's own mirror (its first URIs line: the main archive, not the
  # security one) with the suite above. Debian 12's keyring carries the
  # archive's current signing keys, so signatures are checked as usual.
  uris="$(grep -m1 '^URIs:' /etc/apt/sources.list.d/debian.sources || true)"
  if [ -z "$uris" ]; then
    echo "criu-install: no URIs line in /etc/apt/sources.list.d/debian.sources" >&2
    exit 1
  fi
  cat >"$priv/src/criu.sources" <<SRC
Types: deb
$uris
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  aptopts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$priv/src"
    -o "Dir::State::Lists=$priv/lists" -o "Dir::Cache=$priv/cache"
    -o Dir::State::status=/dev/null -o Debug::NoLocking=1
    -o APT::Sandbox::User=root) # the private cache is root's; no _apt privilege drop
  echo "criu-install: fetching $suite package lists"
  apt-get "${aptopts[@]}" -qq update
  echo "criu-install: downloading ${#pkgs[@]} packages"
  (cd "$debs" && apt-get "${aptopts[@]}" -qq download "${pkgs[@]}")
  have_all_debs || { echo "criu-install: download incomplete in $debs" >&2; exit 1; }
  rm -rf "$priv/lists" "$priv/cache" # 30 MB of package lists, needed only to download
fi

# Unpack into a staging directory and rename it into place, so an
# interrupted run never leaves a half-filled prefix that looks complete.
stage="$(mktemp -d "$cache/root.new-XXXXXX")"
trap 'rm -rf "$stage"' EXIT
for p in "${pkgs[@]}"; do
  # If a package was downloaded twice (a newer upload), unpack the newest.
  deb="$(ls "$debs/${p}"_*.deb | sort -V | tail -n1)"
  dpkg -x "$deb" "$stage"
done
loader="usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
libpath="usr/lib/x86_64-linux-gnu:lib/x86_64-linux-gnu"
# Name any library the suite now wants that the list above lacks.
missing="$(cd "$stage" && "./$loader" --library-path "$stage/${libpath%%:*}:$stage/${libpath#*:}" \
  --list ./usr/sbin/criu 2>&1 | grep 'not found' || true)"
if [ -n "$missing" ]; then
  echo "criu-install: criu needs libraries missing from the package list:" >&2
  echo "$missing" >&2
  exit 1
fi
rm -rf "$root"
mv "$stage" "$root"
trap - EXIT

cat >"$wrapper.new" <<WRAP
#!/bin/sh
# CRIU from Debian $suite, run with its own loader and libraries (written by
# scripts/criu-install.sh; see docs/PROCESSES.md).
R=$root
exec "\$R/$loader" --library-path "\$R/usr/lib/x86_64-linux-gnu:\$R/lib/x86_64-linux-gnu" "\$R/usr/sbin/criu" "\$@"
WRAP
chmod 755 "$wrapper.new"
mv "$wrapper.new" "$wrapper"

if ! version_ok "$wrapper"; then
  echo "criu-install: $wrapper does not report CRIU >= $min_major.$min_minor:" >&2
  "$wrapper" --version >&2 || true
  exit 1
fi
echo "criu-install: $("$wrapper" --version | head -n1) installed at $wrapper"
