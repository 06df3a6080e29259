# The official MCP TypeScript SDK, for the MCP server's conformance tests
# (cmd/turnsnap/testdata/mcp_client.mjs lists and calls every tool of `turnsnap
# mcp` over stdio and of the daemon's streamable HTTP endpoint with it).
# Node and npm are Debian's; the SDK comes from the npm registry at a pinned
# version, installed once into the cache (about a minute, 30 MB). Tests find it
# at $TURNSNAP_CACHE/mcp-node/current/node_modules.
# Sourced by scripts/deps.sh (TURNSNAP_CACHE exported, set -euo pipefail).
: "${TURNSNAP_CACHE:=/var/cache/turnsnap}"
apt_need node nodejs
apt_need npm npm
_mcpn_ver=1.32.2
_mcpn_dir="$TURNSNAP_CACHE/mcp-node/sdk-$_mcpn_ver"
if [ -f "$_mcpn_dir/node_modules/@modelcontextprotocol/sdk/package.json" ] &&
  [ "$(node -p "require('$_mcpn_dir/node_modules/@modelcontextprotocol/sdk/package.json').version")" = "$_mcpn_ver" ]; then
  echo "deps: @modelcontextprotocol/sdk $_mcpn_ver present"
else
  echo "deps: installing @modelcontextprotocol/sdk $_mcpn_ver from npm"
  mkdir -p "$TURNSNAP_CACHE/mcp-node"
  rm -rf "$TURNSNAP_CACHE"/mcp-node/build.* # left by an interrupted install
  # Install into a temporary directory and rename, so an interrupted
  # install never leaves a half-filled tree that a later run would accept.
  # --ignore-scripts: nothing from the registry runs at install time.
  _mcpn_tmp="$(mktemp -d "$TURNSNAP_CACHE/mcp-node/build.XXXXXX")"
  printf '{"name":"turnsnap-mcp-tests","private":true,"type":"module"}\n' >"$_mcpn_tmp/package.json"
  (cd "$_mcpn_tmp" && npm install --no-audit --no-fund --ignore-scripts --save-exact \
    "@modelcontextprotocol/sdk@$_mcpn_ver" >/dev/null)
  rm -rf "$_mcpn_dir"
  mv "$_mcpn_tmp" "$_mcpn_dir"
  echo "deps: @modelcontextprotocol/sdk $_mcpn_ver installed"
fi
ln -sfn "sdk-$_mcpn_ver" "$TURNSNAP_CACHE/mcp-node/current"
unset _mcpn_ver _mcpn_dir _mcpn_tmp
