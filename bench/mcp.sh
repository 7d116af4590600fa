#!/usr/bin/env bash
# kgate-mcp benchmark: MCP execute round trip (kgate-mcp on stdio, and kgate's own /mcp) vs direct ZMQ / kgate ws / jupyter_server,
# kgate-mcp idle RSS, and spawn to answering initialize.
# usage: bench/mcp.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), KGATE_MCP_BIN (default <repo>/build/translator/kgate-mcp),
#        MCP_N=200, MCP_REPS=3, MCP_STARTS=20, MCP_BUDGET=170 (s), MCP_KERNEL_HISTORY=disk|memory,
#        MCP_OUT=bench/results/mcp-latest.json, MCP_KEEP_TMP=1
# Prints tables on stdout, progress on stderr, raw JSON to bench/results/mcp-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bench/mcp.sh [-h]   (settings via environment; see -h)" >&2; exit 2 ;;
esac
py=/usr/bin/python3   # Debian's python has jupyter_server/jupyter_client/ipykernel/websocket-client; pyenv's does not
if ! "$py" -c 'import jupyter_server, jupyter_client, ipykernel, websocket, zmq' 2>/dev/null; then
  echo "mcp: $py lacks jupyter_server/jupyter_client/ipykernel/websocket-client/pyzmq (run scripts/bootstrap.sh)" >&2
  exit 2
fi
exec "$py" "$here/mcp.py"
