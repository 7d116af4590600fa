#!/usr/bin/env bash
# kgate HTTP throughput: wrk against GET /api/kernels/{id} on kgate and on jupyter_server, same run,
# one kernel each, both with token auth; requests/s, latency p50/p99 and kgate/jupyter_server.
# usage: bench/http.sh [--threads 2] [--connections 32] [--duration 10] [--reps 2] [--warmup 2]
#                      [--profile auto|always|never] [--out FILE] [--keep-tmp]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate)
# Prints a table on stdout, progress on stderr, raw JSON (with wrk's output) to bench/results/http-latest.json.
# Exit status: 0 every wrk run clean (target reported), 1 a run failed, 2 usage/setup (no wrk), 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch --args --command wrk httpbench.py "jupyter_server tornado.websocket" "$@"
