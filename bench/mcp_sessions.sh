#!/usr/bin/env bash
# Many MCP sessions at once on kgate's own /mcp, each on its own kernel, every reply checked.
# usage: bench/mcp_sessions.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), SESSIONS=50, CELLS=10,
#        SESSIONS_OUT=bench/results/mcp-sessions-latest.json
# Exit status: 0 every reply right, 1 a reply lost or crossed or a step failed, 2 setup.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch mcp_sessions.py "" "$@"
