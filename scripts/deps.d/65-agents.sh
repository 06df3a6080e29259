# Real coding agents for the end-to-end tests (cmd/turnsnap agents tests):
# Claude Code and Codex CLI from the npm registry. Both ship their native
# binary inside a platform package, so `npm install` is all they need and
# they run offline. Pinned, installed once per version into the cache under a
# temporary prefix and renamed, so an interrupted install is never accepted.
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
apt_need node nodejs
apt_need npm npm
# contrib/claude-code's hooks reach the daemon's socket with curl.
apt_need curl curl
# _agent_install NAME PKG@VERSION BIN: the CLI lands in
# $TURNSNAP_CACHE/agents/NAME-VERSION, and agents/NAME points at it.
_agent_install() {
  local name="$1" spec="$2" bin="$3"
  local version="${spec##*@}"
  local dir="$TURNSNAP_CACHE/agents/$name-$version"
  if [ -x "$dir/node_modules/.bin/$bin" ] && "$dir/node_modules/.bin/$bin" --version >/dev/null 2>&1; then
    echo "deps: $spec present"
  else
    echo "deps: installing $spec (npm, a few hundred MB)"
    mkdir -p "$TURNSNAP_CACHE/agents"
    rm -rf "$TURNSNAP_CACHE/agents/$name-$version".tmp.*
    local tmp
    tmp="$(mktemp -d "$dir.tmp.XXXXXX")"
    # --prefix keeps the install out of the system's node_modules; no
    # package-lock or audit traffic beyond the registry itself.
    (cd "$tmp" && npm install --no-audit --no-fund --loglevel=error --prefix "$tmp" "$spec" >/dev/null)
    "$tmp/node_modules/.bin/$bin" --version >/dev/null
    rm -rf "$dir"
    mv "$tmp" "$dir"
  fi
  ln -sfn "$name-$version" "$TURNSNAP_CACHE/agents/$name"
}
_agent_install claude-code @anthropic-ai/claude-code@2.1.328 claude
_agent_install codex @openai/codex@0.169.0 codex
unset -f _agent_install
