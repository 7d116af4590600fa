#!/usr/bin/env bash
# Installs what is missing, builds, and runs `kgate serve` on its defaults (127.0.0.1:8787).
# Extra arguments go to `kgate serve` (for example --port 0, --token-file is in kgate.toml).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/build.sh" "$here/build"
cat >&2 <<MSG

kgate is starting on http://127.0.0.1:8787 (Ctrl-C stops it and every kernel it owns).
Point Claude Code at it with the MCP translator:
    claude mcp add kernel -- $here/build/translator/kgate-mcp
(kgate-mcp lands with issue 4; until then any Jupyter client can use the gateway, e.g.
    jupyter server --gateway-url=http://127.0.0.1:8787 )

MSG
exec "$here/build/gateway/kgate" serve "$@"
