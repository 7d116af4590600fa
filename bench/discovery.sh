#!/usr/bin/env bash
# kgate kernel-discovery benchmark: a warm GET /api/kernelspecs on kgate vs jupyter_server
# (and jupyter_server --gateway-url kgate), a cold `kgate kernelspecs` vs `jupyter kernelspec list`, and
# `kgate serve` spawn to its first full catalog.
# usage: bench/discovery.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), DISC_PARTS=cold,start,warm, DISC_N=1000, DISC_COLD=5,
#        DISC_STARTS=5, DISC_PEER_STARTS=3, DISC_GATEWAY=1 (0: no --gateway-url column), DISC_BUDGET=110 (s),
#        DISC_OUT=bench/results/discovery-latest.json, DISC_KEEP_TMP=1
# Prints tables on stdout, progress on stderr, raw JSON to bench/results/discovery-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch discovery.py "jupyter_server jupyter_client" "$@"
