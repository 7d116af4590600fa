#!/usr/bin/env bash
# The sanitizer stage of the test suite (scripts/test.sh runs it after the plain build):
#   1. builds kgate with clang, ASan + UBSan (LeakSanitizer included) and libFuzzer coverage;
#   2. runs the unit tests, the fuzz corpus replays and the integration files of the sanitizer
#      stage (ctest integration_san; the rest run in the plain stage, scripts/test.sh);
#   3. runs each libFuzzer target for KGATE_FUZZ_SECONDS (default 30), two at a time;
#   4. fails if any process of ours wrote a sanitizer report, or any fuzz target crashed.
# Usage: scripts/sanitize.sh [--no-fuzz] [--no-tests]   (env: KGATE_SAN_BUILD_DIR, KGATE_FUZZ_SECONDS)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KGATE_SAN_BUILD_DIR:-$here/build-san}"
fuzz_seconds="${KGATE_FUZZ_SECONDS:-30}"
stage="$here/scripts/stage.sh"
run_tests=1 run_fuzz=1
for arg in "$@"; do
  case "$arg" in
    --no-fuzz) run_fuzz=0 ;;
    --no-tests) run_tests=0 ;;
    *) echo "sanitize.sh: unknown argument $arg (expected --no-fuzz or --no-tests)" >&2; exit 2 ;;
  esac
done

"$here/scripts/bootstrap.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  # -O1 and line tables only: sanitizer reports need lines, not full debug info, and the
  # instrumented suite runs at a usable speed.
  cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" -DKGATE_ENABLE_SANITIZERS=ON -DKGATE_FUZZ=ON >&2
fi
"$stage" sanitize-build cmake --build "$build" --parallel "$(nproc)" >&2

reports="$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
# Every instrumented process (kgate, kgate-mcp, the unit tests, the fuzzers) writes its reports
# to files here (<tool>.<pid>), so a report from a daemon a test started is not lost in a pipe.
symbolizer="$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)"
export ASAN_OPTIONS="detect_leaks=1:log_path=$reports/asan:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:allow_user_segv_handler=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
export LSAN_OPTIONS="log_path=$reports/lsan"
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
# Tests that measure kgate's RSS skip that one check under ASan (its quarantine holds freed memory).
export KGATE_SANITIZED=1

status=0
if [ "$run_tests" = 1 ]; then
  echo "sanitize: the test suite under ASan+UBSan ($build)" >&2
  "$stage" sanitize-tests bash -c 'cd "$1" && ctest --output-on-failure --timeout 2400 -j 2 -E "^integration$"' _ "$build" \
    || status=1
fi

if [ "$run_fuzz" = 1 ]; then
  echo "sanitize: each fuzz target for ${fuzz_seconds}s" >&2
  fuzz_start=$(date +%s)
  work="$build/fuzz-work"
  rm -rf "$work"
  mkdir -p "$work"
  fuzz_one() {
    local name="$1" seeds="$here/tests/fuzz/corpus/$1"
    mkdir -p "$work/$name/corpus" "$work/$name/artifacts"
    # New inputs go to the scratch corpus; the committed seeds are only read.
    "$build/tests/fuzz/fuzz_$name" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$work/$name/artifacts/" "$work/$name/corpus" "$seeds" \
      > "$work/$name/log" 2>&1
  }
  targets=(wire ws_codec http jsonrpc kernel_json toml record)
  pids=()
  for t in "${targets[@]}"; do
    fuzz_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge 2 ]; then
      wait "${pids[0]}" || true
      pids=("${pids[@]:1}")
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  printf '%-12s %12s %10s %8s %s\n' target executions exec/s corpus result >&2
  for t in "${targets[@]}"; do
    log="$work/$t/log"
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)"
    speed="$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)"
    units="$(find "$work/$t/corpus" -type f | wc -l)"
    if compgen -G "$work/$t/artifacts/*" >/dev/null; then
      result="CRASH: $(ls "$work/$t/artifacts" | tr '\n' ' ')"
      status=1
      tail -n 60 "$log" >&2
    else
      result=ok
    fi
    printf '%-12s %12s %10s %8s %s\n' "$t" "$runs" "$speed" "$units" "$result" >&2
  done
  fuzz_secs=$(( $(date +%s) - fuzz_start ))
  printf 'stage fuzz: done in %dm%02ds\n' $((fuzz_secs / 60)) $((fuzz_secs % 60)) >&2
fi

if compgen -G "$reports/*" >/dev/null; then
  echo "sanitize: sanitizer reports:" >&2
  for f in "$reports"/*; do
    echo "==== $f" >&2
    head -n 80 "$f" >&2
  done
  status=1
fi
[ "$status" = 0 ] && echo "sanitize: no sanitizer reports, no fuzz crashes" >&2
exit "$status"
