#!/usr/bin/env bash
# kgate re-adoption benchmark: a new kgate giving back N kernels that outlived the old one
# (SIGTERM, then kill -9), each answering an execute with its state.
# usage: bench/readopt.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate; kgate-supervise beside it), READOPT_N=20,
#        READOPT_BUDGET=280 (s), READOPT_OUT=bench/results/readopt-latest.json, READOPT_KEEP_TMP=1
# Prints a table on stdout, progress on stderr, raw JSON to bench/results/readopt-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch readopt.py "websocket" "$@"
