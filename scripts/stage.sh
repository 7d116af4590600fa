#!/usr/bin/env bash
# Runs one stage of the test suite and prints its wall-clock duration, pass or fail.
# Usage: scripts/stage.sh NAME COMMAND [ARGS...]   (exit status: the command's)
name="$1"
shift
start=$(date +%s)
echo "stage $name: start" >&2
status=0
"$@" || status=$?
secs=$(( $(date +%s) - start ))
printf 'stage %s: %s in %dm%02ds\n' "$name" "$([ "$status" = 0 ] && echo ok || echo "FAILED ($status)")" \
  $((secs / 60)) $((secs % 60)) >&2
exit "$status"
