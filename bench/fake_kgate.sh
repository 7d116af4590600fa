#!/usr/bin/env bash
# Dev aid for the harness only: accepts kgate's CLI (serve --ip IP --port P --token T) and execs
# a jupyter_server in its place, so bench/run.sh's kgate path can be tested before kgate serves.
#   KGATE_BIN=bench/fake_kgate.sh bench/run.sh
set -euo pipefail
[ "${1:-}" = serve ] || { echo "usage: fake_kgate.sh serve --ip IP --port PORT --token TOKEN" >&2; exit 2; }
shift; ip=127.0.0.1 port=8888 token=
while [ $# -gt 0 ]; do
  case "$1" in --ip) ip=$2; shift 2 ;; --port) port=$2; shift 2 ;; --token) token=$2; shift 2 ;; *) shift ;; esac
done
exec /usr/bin/python3 -m jupyter_server --allow-root --no-browser --ServerApp.ip="$ip" --port="$port" \
  --ServerApp.port_retries=0 --ServerApp.token="$token" --ServerApp.password= --ServerApp.disable_check_xsrf=True \
  --ServerApp.iopub_data_rate_limit=0 --ServerApp.iopub_msg_rate_limit=0
