# MinIO server for the S3 store's tests: no S3 server is in Debian's archive,
# so build the real one from the Go module proxy, once, into the cache
# (about 6 minutes on 2 cores, 150 MB). The version is pinned so every
# machine tests against the same server. MinIO is AGPL: tests run it as a
# separate process and never import it.
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
_minio_version=v0.0.0-20260212201848-7aac2a2c5b7c
_minio_bin="$TURNSNAP_CACHE/bin/minio"
_minio_stamp="$TURNSNAP_CACHE/bin/minio.version"
if [ -x "$_minio_bin" ] && [ "$(cat "$_minio_stamp" 2>/dev/null)" = "$_minio_version" ] &&
  "$_minio_bin" --version >/dev/null 2>&1; then
  echo "deps: minio $_minio_version present"
else
  echo "deps: building minio $_minio_version (about 6 minutes)"
  mkdir -p "$TURNSNAP_CACHE/bin"
  rm -rf "$TURNSNAP_CACHE"/bin/minio-build.* # left by an interrupted build
  # Build into a temporary GOBIN and rename, so an interrupted build never
  # leaves a half-written binary that a later run would accept. Build from
  # outside our module with GOFLAGS cleared: flags meant for our module
  # (-mod=vendor, say) break `go install pkg@version`.
  _minio_tmp="$(mktemp -d "$TURNSNAP_CACHE/bin/minio-build.XXXXXX")"
  (cd "$_minio_tmp" && GOFLAGS= GOBIN="$_minio_tmp" go install "github.com/minio/minio@$_minio_version")
  "$_minio_tmp/minio" --version >/dev/null
  mv -f "$_minio_tmp/minio" "$_minio_bin"
  echo "$_minio_version" >"$_minio_stamp"
  rm -rf "$_minio_tmp"
  echo "deps: minio built: $("$_minio_bin" --version | head -1)"
fi
unset _minio_version _minio_bin _minio_stamp _minio_tmp
