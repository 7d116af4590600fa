#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite:
#   1. the plain build (Release, g++): unit and integration tests;
#   2. scripts/sanitize.sh: the same suite built with clang under ASan+UBSan (LeakSanitizer
#      included), then each libFuzzer target for KGATE_FUZZ_SECONDS (default 30).
# Each stage prints its wall-clock duration (scripts/stage.sh).
# Usage: scripts/test.sh [--no-sanitize]   (--no-sanitize: only step 1, for a quick local run)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KGATE_BUILD_DIR:-$here/build}"
sanitize=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitize) sanitize=0 ;;
    *) echo "test.sh: unknown argument $arg (expected --no-sanitize)" >&2; exit 2 ;;
  esac
done
stage="$here/scripts/stage.sh"
"$stage" build "$here/scripts/build.sh" "$build"
"$stage" tests bash -c 'cd "$1" && ctest --output-on-failure --timeout 1500 -j 2' _ "$build"
if [ "$sanitize" = 1 ]; then
  "$here/scripts/sanitize.sh"
fi
