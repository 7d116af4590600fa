#!/usr/bin/env bash
# kgate session-records benchmark: recording on vs off, and memory under 10,000 1 MB cells.
# usage: bench/records.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), REC_PARTS=overhead,memory, REC_COMPARE=records|persist, REC_N=200, REC_MB=20,
#        REC_REPS=5, REC_CELLS=10000, REC_CELL_BYTES=1000000, REC_BUDGET=420 (s, overhead part),
#        REC_OUT=bench/results/records-latest.json, REC_KEEP_TMP=1
# Prints tables on stdout, progress on stderr, raw JSON to bench/results/records-latest.json.
# Exit status: 0 all steps ran and checks held, 1 a step or check failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch records.py "jupyter_server jupyter_client ipykernel websocket zmq" "$@"
