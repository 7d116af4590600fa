# Sourced by every bench/*.sh wrapper, after the wrapper's comment block (which is its -h):
#   . "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
#   bench_launch [--args] [--command CMD] SCRIPT.py "MODULE ..." "$@"
# -h or --help prints the wrapper's comment block: from line 2 up to its first line that is not
# a comment. Without --args any other argument is refused, since the settings are environment
# variables; with --args the arguments go on to SCRIPT.py. --command CMD: CMD must be on PATH.
# SCRIPT.py runs under Debian's /usr/bin/python3, once that imports every MODULE: the python3
# first on PATH may be a pyenv build without jupyter_server, ipykernel and the rest.
# Exit status: 2 for a wrong argument or a missing command or module, else SCRIPT.py's.
bench_launch() {
  local pass=0 command=""
  while true; do
    case "${1:-}" in
      --args) pass=1; shift ;;
      --command) command=$2; shift 2 ;;
      *) break ;;
    esac
  done
  local script=$1 modules=$2
  shift 2
  local self=${BASH_SOURCE[1]}
  local name
  name=$(basename "$self" .sh)
  case "${1:-}" in
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$self" | sed 's/^# \{0,1\}//'; exit 0 ;;
  esac
  if [ "$pass" = 0 ] && [ $# -gt 0 ]; then
    echo "usage: bench/$name.sh [-h]   (settings via environment; see -h)" >&2
    exit 2
  fi
  if [ -n "$command" ] && ! command -v "$command" >/dev/null; then
    echo "$name: $command is not installed (apt-get install -y $command; scripts/bootstrap.sh)" >&2
    exit 2
  fi
  local py=/usr/bin/python3
  if [ -n "$modules" ] && ! "$py" -c "import ${modules// /, }" 2>/dev/null; then
    echo "$name: $py cannot import all of $modules (run scripts/bootstrap.sh)" >&2
    exit 2
  fi
  exec "$py" "$(cd "$(dirname "$self")" && pwd)/$script" "$@"
}
