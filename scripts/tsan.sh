#!/usr/bin/env bash
# ThreadSanitizer run of the threaded parts: a clang -fsanitize=thread build (./build-tsan),
# then the unit tests and the whole integration suite with the instrumented kgate and kgate-mcp.
# A third full build does not fit CI's time on two cores, so it is run by hand; README
# "Hardening" has the last result.  Suppressions (uninstrumented libzmq): tests/tsan.supp.
# Usage: scripts/tsan.sh [pytest -k expression]   (env: KGATE_TSAN_BUILD_DIR)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KGATE_TSAN_BUILD_DIR:-$here/build-tsan}"
"$here/scripts/bootstrap.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" -DKGATE_ENABLE_TSAN=ON >&2
fi
cmake --build "$build" --parallel "$(nproc)" >&2

reports="$build/tsan-reports"
rm -rf "$reports"
mkdir -p "$reports"
symbolizer="$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)"
export TSAN_OPTIONS="suppressions=$here/tests/tsan.supp:log_path=$reports/tsan:second_deadlock_stack=1:history_size=4${symbolizer:+:external_symbolizer_path=$symbolizer}"
# TSan's shadow memory multiplies RSS; the tests that bound kgate's memory skip that bound.
export KGATE_SANITIZED=1
status=0
(cd "$build" && ctest --output-on-failure --timeout 1500 -j 2 -E '^integration$') || status=1
KGATE_BIN="$build/gateway/kgate" KGATE_MCP_BIN="$build/translator/kgate-mcp" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider --timeout=300 "$here/tests/integration" \
  ${1:+-k "$1"} || status=1
if compgen -G "$reports/*" >/dev/null; then
  echo "tsan: reports:" >&2
  for f in "$reports"/*; do echo "==== $f" >&2; head -n 60 "$f" >&2; done
  status=1
fi
[ "$status" = 0 ] && echo "tsan: no reports" >&2
exit "$status"
