#!/usr/bin/env bash
# Runs one stage of the test suite and prints its wall-clock duration, pass or fail. A stage
# whose name ends in "build" also prints what ccache did for it (when ccache is installed).
# Usage: scripts/stage.sh NAME COMMAND [ARGS...]   (exit status: the command's)
name="$1"
shift
cache=0
case "$name" in
  *build) command -v ccache >/dev/null 2>&1 && [ -z "${CCACHE_DISABLE:-}" ] && cache=1 ;;
esac
[ "$cache" = 1 ] && ccache -z >/dev/null 2>&1
start=$(date +%s)
echo "stage $name: start" >&2
status=0
"$@" || status=$?
secs=$(( $(date +%s) - start ))
if [ "$cache" = 1 ]; then
  echo "stage $name: ccache statistics" >&2
  ccache -s 2>&1 | sed 's/^/  /' >&2
fi
printf 'stage %s: %s in %dm%02ds\n' "$name" "$([ "$status" = 0 ] && echo ok || echo "FAILED ($status)")" \
  $((secs / 60)) $((secs % 60)) >&2
exit "$status"
