#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite, each test once:
#   1. the plain build (Release, g++): the unit tests and the integration files of the plain
#      stage (ctest `integration`);
#   2. scripts/sanitize.sh: a clang build under ASan+UBSan (LeakSanitizer included): the unit
#      tests, the fuzz corpora and the integration files of the sanitizer stage (ctest
#      `integration_san`, listed in tests/CMakeLists.txt), then each libFuzzer target for
#      KGATE_FUZZ_SECONDS (default 30).
# Each stage prints its wall-clock duration (scripts/stage.sh).
# Usage: scripts/test.sh [--no-sanitize]   (--no-sanitize: every test in the plain build, no
#   sanitizers, for a quick local run)
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
# With the sanitizer stage to follow, integration_san's files run there and not here.
skip=()
[ "$sanitize" = 1 ] && skip=(-E '^integration_san$')
"$stage" tests bash -c 'cd "$1" && shift && ctest --output-on-failure --timeout 1500 -j 2 "$@"' _ "$build" "${skip[@]}"
if [ "$sanitize" = 1 ]; then
  "$here/scripts/sanitize.sh"
fi
