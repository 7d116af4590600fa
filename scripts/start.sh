#!/usr/bin/env bash
# Installs what is missing, builds, and runs `kgate serve` on its defaults (127.0.0.1:8787).
# Extra arguments go to `kgate serve` (for example --port 0; a token belongs in kgate.toml's
# token_file or $KGATE_TOKEN). Once kgate listens, this prints the address it really bound and
# how to point Claude Code at kgate-mcp for it.
set -euo pipefail
# KGATE_NO_BUILD=1 runs what ./build already holds (the test of this script sets it).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${KGATE_NO_BUILD:-0}" != 1 ]; then
  # Only the two programs: the tests are scripts/test.sh's to build.
  KGATE_TARGETS="kgate kgate-mcp" "$here/scripts/build.sh" "$here/build"
fi
mcp="$here/build/translator/kgate-mcp"

# kgate's log goes through this filter unchanged; at kgate's "listening on URL" line the filter
# adds the instructions for that URL. It ends when kgate closes its stderr.
announce() {
  local line url
  while IFS= read -r line; do
    printf '%s\n' "$line" >&2
    case "$line" in
      *"listening on http://"* | *"listening on https://"*)
        url="${line##*listening on }"
        url="${url%% *}"
        url="${url%/}"
        if [ "$url" = "http://127.0.0.1:8787" ]; then
          env_part=""
        else
          env_part=" -e KGATE_URL=$url"
        fi
        cat >&2 <<MSG

kgate is serving on $url (Ctrl-C stops it and every kernel it owns).
Point Claude Code at it with the MCP translator:
    claude mcp add kernel$env_part -- $mcp
Any Jupyter client can use it too, e.g.
    jupyter server --gateway-url=$url

MSG
        ;;
    esac
  done
}

exec "$here/build/gateway/kgate" serve "$@" 2> >(announce)
