#!/usr/bin/env bash
# Many MCP sessions at once on kgate's own /mcp, each on its own kernel, every reply checked.
# usage: bench/mcp_sessions.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), SESSIONS=50, CELLS=10,
#        SESSIONS_OUT=bench/results/mcp-sessions-latest.json
# Exit status: 0 every reply right, 1 a reply lost or crossed or a step failed, 2 setup.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bench/mcp_sessions.sh [-h]   (settings via environment; see -h)" >&2; exit 2 ;;
esac
exec /usr/bin/python3 "$here/mcp_sessions.py"
