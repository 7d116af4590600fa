#!/usr/bin/env bash
# Installs the Debian packages kgate's build and tests need, only those that are missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config ninja-build
  libzmq3-dev cppzmq-dev nlohmann-json3-dev libboost-dev libboost-system-dev
  libssl-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libtomlplusplus-dev libxml2-dev
  python3-ipykernel python3-jupyter-client python3-jupyter-server python3-websocket
  python3-zmq python3-pytest python3-pytest-timeout python3-pytest-xdist python3-nbformat python3-matplotlib python3-venv
  jupyter-console python3-notebook chromium libstb-dev libsimdjson-dev procps
  python3-qtconsole python3-qtpy python3-pyqt5  # qtconsole: the attach command, and its widget test (offscreen)
  libsystemd-dev systemd openssl
  clang libclang-rt-14-dev llvm wrk
  liburiparser-dev  # URL parsing (src/client/endpoint.cpp)
  python3-prometheus-client  # parses /metrics in tests/integration/test_metrics.py
  ccache mold lld  # the compiler cache and the fast linkers (cmake/BuildSpeed.cmake)
  slurmctld slurmd slurm-client munge openssh-server  # the remote launchers' test engines (tests/integration/engines.py)
  tmux  # the interactive Claude Code in tests/integration/test_claude_code.py
  help2man  # the man pages kgate.1 and kgate-mcp.1, from the programs' --help (cmake/ManPages.cmake)
  dpkg-dev lintian  # the package: dpkg-shlibdeps (CPack), and its check (scripts/package.sh, tests/integration/test_package.py)
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm (the end-to-end tests with the MCP TypeScript SDK and @jupyterlab/services): any install will do. A NodeSource
# nodejs bundles npm and conflicts with Debian's npm package, so only look for the commands.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# From npm, exactly as each package-lock.json pins them: the MCP TypeScript SDK and
# @jupyterlab/services for the end-to-end tests (tests/e2e), the MCP conformance suite with
# the Node 22 it needs (tests/conformance), and the Claude Code CLI (tests/claude).
npm_deps() {
  local dir
  for dir in "$here/tests/e2e" "$here/tests/conformance" "$here/tests/claude"; do
    if [ -f "$dir/package-lock.json" ] && { [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules" ]; }; then
      echo "bootstrap: npm ci in ${dir#$here/}" >&2
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2 && touch node_modules)
    fi
  done
}

if [ ${#missing[@]} -eq 0 ]; then
  npm_deps
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
npm_deps
