#!/usr/bin/env bash
# kgate side-by-side benchmark: raw ZMQ floor vs jupyter_server vs kgate.
# usage: bench/run.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), BENCH_N=200, BENCH_MB=20,
#        BENCH_ROUNDS=5, BENCH_PRINTS=100000,
#        BENCH_REPS=2, BENCH_PAIRS=4, BENCH_COLD=5, BENCH_PEER_COLD=3, BENCH_BUDGET=900 (s),
#        BENCH_OUT=bench/results/latest.json, BENCH_KEEP_TMP=1
# The clients are bench/wsclient.py; every default path is relative to this checkout.
# Prints a table on stdout, progress on stderr, raw JSON to bench/results/latest.json.
# Exit status: 0 all steps ran, 1 some step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch bench.py "jupyter_server jupyter_client ipykernel websocket zmq" "$@"
