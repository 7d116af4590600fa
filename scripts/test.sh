#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit + integration).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KGATE_BUILD_DIR:-$here/build}"
"$here/scripts/build.sh" "$build"
cd "$build"
ctest --output-on-failure --timeout 1500 -j 2
