#!/usr/bin/env bash
# Installs what is missing (scripts/bootstrap.sh), then configures and builds kgate.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# KGATE_TARGETS="kgate kgate-mcp" builds only those targets (scripts/start.sh does); the default
# is everything, the tests included.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build}"
shift || true
"$here/scripts/bootstrap.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >&2
fi
targets=()
for t in ${KGATE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" --parallel "$(nproc)" "${targets[@]}" >&2
