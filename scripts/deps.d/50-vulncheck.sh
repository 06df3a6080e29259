# govulncheck and an offline Go vulnerability database for `make test`.
# The network database (vuln.go.dev) is not reachable here; the
# golang.org/x/vulndb module (on the module proxy) carries the OSV files in
# data/osv, and its own cmd/indexdb turns them into the v1 database layout
# that `govulncheck -db file://DIR` reads. Versions are pinned; built once
# into the cache (about 4 minutes of downloads the first time).
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
_vc_vuln=v1.9.0
_vc_db=v0.0.0-20261105234957-e22db6528018
_vc_dir="$TURNSNAP_CACHE/vulncheck"
if [ -x "$_vc_dir/bin/govulncheck" ] && [ -f "$_vc_dir/db-$_vc_db/index/db.json" ]; then
  echo "deps: govulncheck $_vc_vuln and vulndb $_vc_db present"
else
  mkdir -p "$_vc_dir/bin"
  _vc_tmp="$(mktemp -d "$_vc_dir/build.XXXXXX")"
  (cd "$_vc_tmp" && GOFLAGS= GOBIN="$_vc_tmp" go install "golang.org/x/vuln/cmd/govulncheck@$_vc_vuln" &&
    GOFLAGS= GOBIN="$_vc_tmp" go install "golang.org/x/vulndb/cmd/indexdb@$_vc_db")
  _vc_src="$(cd "$_vc_tmp" && GOFLAGS= go mod download -json "golang.org/x/vulndb@$_vc_db" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  "$_vc_tmp/indexdb" -vulns "$_vc_src/data/osv" -out "$_vc_tmp/db"
  rm -rf "$_vc_dir/db-$_vc_db"
  mv "$_vc_tmp/db" "$_vc_dir/db-$_vc_db"
  mv -f "$_vc_tmp/govulncheck" "$_vc_dir/bin/govulncheck"
  rm -rf "$_vc_tmp"
  echo "deps: govulncheck $_vc_vuln with vulndb $_vc_db ready"
fi
ln -sfn "db-$_vc_db" "$_vc_dir/db"
unset _vc_vuln _vc_db _vc_dir _vc_tmp _vc_src
