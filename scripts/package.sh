#!/usr/bin/env bash
# Builds the Debian package: installs what is missing, builds kgate (scripts/build.sh), packs it
# with CPack (cmake/Package.cmake) and checks it with lintian.  Prints the .deb's path.
# Usage: scripts/package.sh [--version-suffix +TAG|~TAG] [--build DIR] [--no-lintian]
#   --version-suffix  a package of this tree with another version, 0.1.0+TAG (after 0.1.0 in
#                     Debian's order) or 0.1.0~TAG (before it), built in its own folder beside
#                     build/ (the compiler cache makes it a relink); the upgrade test uses it
#   --build DIR       the build folder (default: build/, or build-pkg-TAG with a suffix)
# lintian must report no error and no warning; the package's own overrides
# (config/debian/lintian-overrides) say why each tag they hide does not apply.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
suffix="" build="" lint=1
while [ $# -gt 0 ]; do
  case "$1" in
    --version-suffix) suffix="${2:?--version-suffix needs a value}"; shift 2 ;;
    --build) build="${2:?--build needs a folder}"; shift 2 ;;
    --no-lintian) lint=0; shift ;;
    *) echo "package.sh: unknown argument $1 (see the usage at the top of scripts/package.sh)" >&2; exit 2 ;;
  esac
done
if [ -n "$suffix" ] && ! [[ "$suffix" =~ ^[+~][A-Za-z0-9.+~]+$ ]]; then
  echo "package.sh: --version-suffix $suffix: expected + or ~ then letters, digits, '.', '+' or '~'" >&2
  exit 2
fi
if [ -z "$build" ]; then
  build="$here/build"
  # Beside build/, at the same depth, so the compiler cache finds build/'s objects (base_dir).
  [ -n "$suffix" ] && build="$here/build-pkg-$(tr -c 'A-Za-z0-9.\n' '-' <<<"${suffix:1}")"
fi
args=(-DKGATE_VERSION_SUFFIX="$suffix")
[ -n "$suffix" ] && args+=(-DKGATE_BUILD_TESTS=OFF)
# The suffix asked for, whatever the folder had; no reconfigure when it is the same (tests may
# be running from that folder).
if [ -f "$build/CMakeCache.txt" ] && ! grep -qxF "KGATE_VERSION_SUFFIX:STRING=$suffix" "$build/CMakeCache.txt"; then
  cmake -B "$build" "${args[@]}" >&2
fi
"$here/scripts/build.sh" "$build" "${args[@]}"
rm -rf "$build/package"
cpack --config "$build/CPackConfig.cmake" >&2
deb="$(ls "$build"/package/kgate_*.deb)"
if [ "$lint" = 1 ]; then
  # --fail-on: an error or a warning fails the package; info and pedantic tags are printed.
  lintian --fail-on error,warning --info "$deb" >&2
fi
echo "$deb"
