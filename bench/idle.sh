#!/usr/bin/env bash
# kgate idle-kernel benchmark: the gateway's own CPU with IDLE_N idle kernels, kgate beside
# jupyter_server, and the round trip with them held against one kernel alone.
# usage: bench/idle.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), IDLE_N=60, IDLE_SECONDS=60, IDLE_SETTLE=10,
#        IDLE_RT=200, IDLE_BUDGET=900 (s), IDLE_OUT=bench/results/idle-latest.json, IDLE_KEEP_TMP=1
# Prints tables on stdout, progress on stderr, raw JSON to bench/results/idle-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch idle.py "jupyter_server websocket" "$@"
