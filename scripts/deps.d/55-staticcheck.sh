# staticcheck for `make vet` (honnef.co/go/tools, pinned). Like govulncheck it
# type-checks with the toolchain that builds it, so it is built by the
# Makefile's GOTOOLCHAIN and kept per Go version. About 30 s the first time.
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
_sc_ver=v0.8.2
_sc_go="$(go env GOVERSION)"
_sc_bin="$TURNSNAP_CACHE/staticcheck/bin-$_sc_go-$_sc_ver"
if [ -x "$_sc_bin/staticcheck" ]; then
  echo "deps: staticcheck $_sc_ver for $_sc_go present"
else
  mkdir -p "$TURNSNAP_CACHE/staticcheck"
  _sc_tmp="$(mktemp -d "$TURNSNAP_CACHE/staticcheck/build.XXXXXX")"
  (cd "$_sc_tmp" && GOFLAGS= GOBIN="$_sc_tmp" go install "honnef.co/go/tools/cmd/staticcheck@$_sc_ver")
  mkdir -p "$_sc_bin"
  mv -f "$_sc_tmp/staticcheck" "$_sc_bin/staticcheck"
  rm -rf "$_sc_tmp"
  echo "deps: staticcheck $_sc_ver for $_sc_go ready"
fi
ln -sfn "bin-$_sc_go-$_sc_ver" "$TURNSNAP_CACHE/staticcheck/current"
unset _sc_ver _sc_go _sc_bin _sc_tmp
