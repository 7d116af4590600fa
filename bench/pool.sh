#!/usr/bin/env bash
# kgate kernel-start benchmark: POST /api/kernels to the first execute_reply with the
# warm pool, cold, and on jupyter_server; POOL_CONCURRENT concurrent cold creates against one.
# usage: bench/pool.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), POOL_N=10, POOL_N_COLD=5, POOL_CONCURRENT=20,
#        POOL_BUDGET=280 (s), POOL_OUT=bench/results/pool-latest.json, POOL_KEEP_TMP=1
# Prints tables on stdout, progress on stderr, raw JSON to bench/results/pool-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch pool.py "jupyter_server websocket" "$@"
