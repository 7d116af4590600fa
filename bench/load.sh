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
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
py=/usr/bin/python3   # Debian's python has jupyter_server/tornado/ipykernel; pyenv's does not
if ! "$py" -c 'import jupyter_server, tornado.websocket, ipykernel' 2>/dev/null; then
  echo "load: $py lacks jupyter_server/tornado/ipykernel (run scripts/bootstrap.sh)" >&2
  exit 2
fi
exec "$py" "$here/load.py" "$@"
