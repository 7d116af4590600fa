#!/usr/bin/env bash
# kgate soak: kernels created, flooded (a few MB through a websocket client), used and deleted in a loop,
# 2-4 at once, for --minutes; kgate's RSS, fds and children sampled every 10 s and required to come back.
# usage: bench/soak.sh [--minutes 10] [--workers 3] [--flood-mb 4] [--cells 5] [--sample 10] [--settle 60]
#                      [--records-budget-mb 8] [--records on|off] [--max-unseen-jobs 500] [--rss-pct 20] [--rss-mb 20]
#                      [--csv FILE] [--out FILE] [--keep-tmp]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate)
# Prints the samples as a table on stdout, progress on stderr; samples to bench/results/soak-<date>.csv,
# raw JSON to bench/results/soak-latest.json.
# Exit status: 0 fds/children back at baseline, RSS growth within max(20 %, 20 MB), every cycle clean;
#              1 otherwise or a step failed; 2 usage/setup; 130 interrupted.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
bench_launch --args soak.py "tornado.websocket ipykernel" "$@"
