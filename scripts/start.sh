#!/usr/bin/env bash
# Installs what is missing, builds, and runs `kgate serve` on its defaults (127.0.0.1:8787).
# Extra arguments go to `kgate serve` (for example --port 0). kgate makes its own token at its
# first start and keeps it in its state dir (a token of yours belongs in kgate.toml's token_file
# or $KGATE_TOKEN). Once kgate listens, this prints the address it really bound and
# how to point Claude Code at kgate-mcp for it.
set -euo pipefail
# KGATE_NO_BUILD=1 runs what ./build already holds (the test of this script sets it).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${KGATE_NO_BUILD:-0}" != 1 ]; then
  # Only the two programs: the tests are scripts/test.sh's to build.
  KGATE_TARGETS="kgate kgate-mcp" "$here/scripts/build.sh" "$here/build"
fi
mcp="$here/build/translator/kgate-mcp"

# kgate's log goes through this filter unchanged. kgate's "listening on URL" line gives the URL
# (and the file of kgate's own token); at the "observe page:" line after it (with ?token= when
# kgate keeps its own token), the filter adds the instructions for that URL. It ends when kgate
# closes its stderr.
announce() {
  local line url="" token_file="" observe gw_token
  while IFS= read -r line; do
    printf '%s\n' "$line" >&2
    case "$line" in
      *"listening on http://"* | *"listening on https://"*)
        url="${line##*listening on }"
        url="${url%% *}"
        url="${url%/}"
        token_file=""
        case "$line" in
          *"token kgate's own, in "*)
            token_file="${line##*"own, in "}"
            token_file="${token_file%%;*}"
            ;;
        esac
        ;;
      *"observe page: "*)
        [ -n "$url" ] || continue
        observe="${line##*observe page: }"
        if [ "$url" = "http://127.0.0.1:8787" ]; then
          env_part=""
        else
          env_part=" -e KGATE_URL=$url"
        fi
        gw_token=""
        if [ -n "$token_file" ]; then
          gw_token=" --GatewayClient.auth_token=\$(cat $token_file)"
        fi
        cat >&2 <<MSG

kgate is serving on $url (Ctrl-C stops it and every kernel it owns).
Watch its kernels and the agent's cells in a browser:
    $observe
Point Claude Code at it with the MCP translator (it finds kgate's token by itself):
    claude mcp add kernel$env_part -- $mcp
Any Jupyter client can use it too, e.g.
    jupyter server --gateway-url=$url$gw_token

MSG
        url=""
        ;;
    esac
  done
}

exec "$here/build/gateway/kgate" serve "$@" 2> >(announce)
