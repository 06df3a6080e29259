# govulncheck and an offline Go vulnerability database for `make test`.
# The network database (vuln.go.dev) is not reachable here; the
# golang.org/x/vulndb module (on the module proxy) carries the OSV files in
# data/osv, and its own cmd/indexdb turns them into the v1 database layout
# that `govulncheck -db file://DIR` reads. Versions are pinned; built once
# into the cache (about 4 minutes of downloads the first time).
# govulncheck type-checks the standard library of the toolchain it analyses
# with its own go/types, so it is built by that toolchain (the Makefile's
# GOTOOLCHAIN) and kept per Go version: bin-go1.27.3/govulncheck.
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
_vc_vuln=v1.9.0
_vc_db=v0.0.0-20261105234957-e22db6528018
_vc_dir="$TURNSNAP_CACHE/vulncheck"
_vc_go="$(go env GOVERSION)"
_vc_bin="$_vc_dir/bin-$_vc_go"
if [ -x "$_vc_bin/govulncheck" ]; then
  echo "deps: govulncheck $_vc_vuln for $_vc_go present"
else
  mkdir -p "$_vc_dir"
  _vc_tmp="$(mktemp -d "$_vc_dir/build.XXXXXX")"
  (cd "$_vc_tmp" && GOFLAGS= GOBIN="$_vc_tmp" go install "golang.org/x/vuln/cmd/govulncheck@$_vc_vuln")
  mkdir -p "$_vc_bin"
  mv -f "$_vc_tmp/govulncheck" "$_vc_bin/govulncheck"
  rm -rf "$_vc_tmp"
  echo "deps: govulncheck $_vc_vuln for $_vc_go ready"
fi
if [ -f "$_vc_dir/db-$_vc_db/index/db.json" ]; then
  echo "deps: vulndb $_vc_db present"
else
  mkdir -p "$_vc_dir"
  _vc_tmp="$(mktemp -d "$_vc_dir/build.XXXXXX")"
  (cd "$_vc_tmp" && GOFLAGS= GOBIN="$_vc_tmp" go install "golang.org/x/vulndb/cmd/indexdb@$_vc_db")
  _vc_src="$(cd "$_vc_tmp" && GOFLAGS= go mod download -json "golang.org/x/vulndb@$_vc_db" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  "$_vc_tmp/indexdb" -vulns "$_vc_src/data/osv" -out "$_vc_tmp/db"
  rm -rf "$_vc_dir/db-$_vc_db"
  mv "$_vc_tmp/db" "$_vc_dir/db-$_vc_db"
  rm -rf "$_vc_tmp"
  echo "deps: vulndb $_vc_db ready"
fi
ln -sfn "db-$_vc_db" "$_vc_dir/db"
unset _vc_vuln _vc_db _vc_dir _vc_tmp _vc_src _vc_go _vc_bin
