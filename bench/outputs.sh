#!/usr/bin/env bash
# What keeping every output costs kgate: OUT_N plots of OUT_KB each against OUT_N prints of the
# same size, in alternating rounds on one kgate and one kernel; kgate's CPU for each, and the ratio.
# usage: bench/outputs.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), OUT_N=200, OUT_KB=50, OUT_ROUNDS=4
# Prints a table on stdout, progress on stderr.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch outputs.py "jupyter_client ipykernel" "$@"
