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
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch mcp.py "jupyter_server jupyter_client ipykernel websocket zmq" "$@"
