#!/usr/bin/env bash
# kgate re-adoption benchmark: a new kgate giving back N kernels that outlived the old one
# (SIGTERM, then kill -9), each answering an execute with its state.
# usage: bench/readopt.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate; kgate-supervise beside it), READOPT_N=20,
#        READOPT_BUDGET=280 (s), READOPT_OUT=bench/results/readopt-latest.json, READOPT_KEEP_TMP=1
# Prints a table on stdout, progress on stderr, raw JSON to bench/results/readopt-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bench/readopt.sh [-h]   (settings via environment; see -h)" >&2; exit 2 ;;
esac
py=/usr/bin/python3   # Debian's python has websocket-client; pyenv's does not
if ! "$py" -c 'import websocket' 2>/dev/null; then
  echo "readopt: $py lacks websocket-client (run scripts/bootstrap.sh)" >&2
  exit 2
fi
exec "$py" "$here/readopt.py"
