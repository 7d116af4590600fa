#!/usr/bin/env bash
# kgate load benchmark: N kernels, M websocket clients round-robin over them, K cells each, all at once;
# counts lost, crossed and duplicated replies; kgate beside jupyter_server in the same run.
# usage: bench/load.sh [--kernels 50] [--clients 200] [--cells 20] [--servers kgate,jupyter_server]
#                      [--cell-timeout 120] [--start-concurrency 8] [--out FILE] [--strict-peer]
#                      [--ipython-history] [--keep-tmp]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate)
# Prints a table on stdout, progress on stderr, raw JSON to bench/results/load-latest.json.
# Exit status: 0 kgate lost/crossed/duplicated nothing, 1 it did or a step failed, 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch --args load.py "jupyter_server tornado.websocket ipykernel" "$@"
