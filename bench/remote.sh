#!/usr/bin/env bash
# Remote launchers benchmark (issue 19): kernels as Slurm jobs on a single-node cluster this
# script starts (as root), next to local kernels of the same kgate and jupyter_server's.
# usage: bench/remote.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), REMOTE_N=20 (kernels at once),
#        REMOTE_RTT=200 (timed `1+1` round trips), REMOTE_OUT=bench/results/remote-latest.json
# Prints a table on stdout, progress on stderr, raw JSON to bench/results/remote-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch remote.py "" "$@"
