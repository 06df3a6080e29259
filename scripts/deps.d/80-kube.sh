# A real Kubernetes API server for the kube tests (internal/kubetest, through
# controller-runtime's envtest): kube-apiserver and etcd, built from the Go
# module proxy once per version into $TURNSNAP_CACHE/kube/<k8s version>/,
# the directory envtest reads as KUBEBUILDER_ASSETS. About 9 minutes
# (apiserver) and 2 minutes (etcd) on 2 cores; 119 MB and 25 MB stripped.
# `go install pkg@version` is refused for both (their go.mod files carry
# replace directives), so each is built from a scratch module that requires
# it; for Kubernetes that module replaces every k8s.io staging module with
# its published v0.x release, the list taken from the replace block of the
# downloaded k8s.io/kubernetes go.mod.
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
_kube_ver=v1.37.2
_kube_staging=v0.37.2 # the staging modules' release that goes with $_kube_ver
_etcd_ver=v3.7.3
_kube_dir="$TURNSNAP_CACHE/kube/$_kube_ver"

# _kube_ok BIN WANT: BIN exists and its --version names WANT.
_kube_ok() {
  [ -x "$1" ] && "$1" --version 2>/dev/null | grep -qF "${2#v}"
}

if _kube_ok "$_kube_dir/kube-apiserver" "$_kube_ver" && _kube_ok "$_kube_dir/etcd" "$_etcd_ver"; then
  echo "deps: kube-apiserver $_kube_ver and etcd $_etcd_ver present"
else
  # The toolchain the Makefile pins (it fixes standard-library
  # vulnerabilities; the apiserver listens on TCP). Read from the Makefile so
  # there is one place to change it; an explicit GOTOOLCHAIN wins.
  _kube_here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  _kube_tc="${GOTOOLCHAIN:-}"
  if [ -z "$_kube_tc" ] || [ "$_kube_tc" = local ]; then
    _kube_tc="$(sed -n 's/^export GOTOOLCHAIN := *//p' "$_kube_here/Makefile")"
  fi
  mkdir -p "$_kube_dir"
  rm -rf "$_kube_dir"/build.* # left by an interrupted build
  _kube_tmp="$(mktemp -d "$_kube_dir/build.XXXXXX")"
  # Build outside our module with GOFLAGS cleared (flags meant for our module
  # break foreign builds); into the temporary directory, then rename, so an
  # interrupted build never leaves a half-written binary a later run accepts.
  (
    set -euo pipefail
    export GOTOOLCHAIN="$_kube_tc" GOFLAGS= GOWORK=off CGO_ENABLED=0
    if ! _kube_ok "$_kube_dir/kube-apiserver" "$_kube_ver"; then
      echo "deps: building kube-apiserver $_kube_ver with $GOTOOLCHAIN (about 9 minutes)"
      mkdir "$_kube_tmp/apiserver"
      cd "$_kube_tmp/apiserver"
      _gomod="$(go mod download -json "k8s.io/kubernetes@$_kube_ver" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
      [ -f "$_gomod" ] || { echo "deps: no go.mod for k8s.io/kubernetes@$_kube_ver" >&2; exit 1; }
      _gover="$(sed -n 's/^go //p' "$_gomod" | head -1)"
      {
        echo "module turnsnap.local/kubebuild"
        echo
        echo "go $_gover"
        echo
        echo "require k8s.io/kubernetes $_kube_ver"
        echo
        echo "replace ("
        # Lines like `k8s.io/api => ./staging/src/k8s.io/api`.
        sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*$|\t\1 => \1 '"$_kube_staging"'|p' "$_gomod"
        echo ")"
      } >go.mod
      grep -q "=> k8s.io/api $_kube_staging" go.mod || { echo "deps: no staging replaces found in $_gomod" >&2; exit 1; }
      printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >tools.go
      go mod tidy
      go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$_kube_ver" \
        -o "$_kube_tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
      _kube_ok "$_kube_tmp/kube-apiserver" "$_kube_ver"
      mv -f "$_kube_tmp/kube-apiserver" "$_kube_dir/kube-apiserver"
      echo "deps: kube-apiserver built: $("$_kube_dir/kube-apiserver" --version)"
    fi
    if ! _kube_ok "$_kube_dir/etcd" "$_etcd_ver"; then
      echo "deps: building etcd $_etcd_ver with $GOTOOLCHAIN (about 2 minutes)"
      mkdir "$_kube_tmp/etcd"
      cd "$_kube_tmp/etcd"
      _gomod="$(go mod download -json "go.etcd.io/etcd/server/v3@$_etcd_ver" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
      [ -f "$_gomod" ] || { echo "deps: no go.mod for go.etcd.io/etcd/server/v3@$_etcd_ver" >&2; exit 1; }
      _gover="$(sed -n 's/^go //p' "$_gomod" | head -1)"
      printf 'module turnsnap.local/etcdbuild\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$_gover" "$_etcd_ver" >go.mod
      printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
      go mod tidy
      go build -trimpath -ldflags "-s -w" -o "$_kube_tmp/etcd-bin" go.etcd.io/etcd/server/v3
      _kube_ok "$_kube_tmp/etcd-bin" "$_etcd_ver"
      mv -f "$_kube_tmp/etcd-bin" "$_kube_dir/etcd"
      echo "deps: etcd built: $("$_kube_dir/etcd" --version | head -1)"
    fi
  )
  rm -rf "$_kube_tmp"
fi
unset -f _kube_ok
unset _kube_ver _kube_staging _etcd_ver _kube_dir _kube_here _kube_tc _kube_tmp
