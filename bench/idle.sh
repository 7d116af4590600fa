#!/usr/bin/env bash
# kgate idle-kernel benchmark: the gateway's own CPU with IDLE_N idle kernels, kgate beside
# jupyter_server, and the round trip with them held against one kernel alone.
# usage: bench/idle.sh [-h]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate), IDLE_N=60, IDLE_SECONDS=60, IDLE_SETTLE=10,
#        IDLE_RT=200, IDLE_BUDGET=900 (s), IDLE_OUT=bench/results/idle-latest.json, IDLE_KEEP_TMP=1
# Prints tables on stdout, progress on stderr, raw JSON to bench/results/idle-latest.json.
# Exit status: 0 all steps ran, 1 a step failed (listed under "errors"), 2 usage/setup, 130 interrupted.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bench/idle.sh [-h]   (settings via environment; see -h)" >&2; exit 2 ;;
esac
py=/usr/bin/python3   # Debian's python has jupyter_server/websocket-client; pyenv's does not
if ! "$py" -c 'import jupyter_server, websocket' 2>/dev/null; then
  echo "idle: $py lacks jupyter_server/websocket-client (run scripts/bootstrap.sh)" >&2
  exit 2
fi
exec "$py" "$here/idle.py"
