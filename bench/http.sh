#!/usr/bin/env bash
# kgate HTTP throughput: wrk against GET /api/kernels/{id} on kgate and on jupyter_server, same run,
# one kernel each, both with token auth; requests/s, latency p50/p99 and kgate/jupyter_server.
# usage: bench/http.sh [--threads 2] [--connections 32] [--duration 10] [--reps 2] [--warmup 2]
#                      [--profile auto|always|never] [--out FILE] [--keep-tmp]
#   env: KGATE_BIN (default <repo>/build/gateway/kgate)
# Prints a table on stdout, progress on stderr, raw JSON (with wrk's output) to bench/results/http-latest.json.
# Exit status: 0 every wrk run clean (target reported), 1 a run failed, 2 usage/setup (no wrk), 130 interrupted.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
if ! command -v wrk >/dev/null; then
  echo "http: wrk is not installed (apt-get install -y wrk; scripts/bootstrap.sh)" >&2
  exit 2
fi
py=/usr/bin/python3   # Debian's python has jupyter_server; pyenv's does not
if ! "$py" -c 'import jupyter_server, tornado.websocket' 2>/dev/null; then
  echo "http: $py lacks jupyter_server (run scripts/bootstrap.sh)" >&2
  exit 2
fi
exec "$py" "$here/httpbench.py" "$@"
