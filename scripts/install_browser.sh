#!/usr/bin/env bash
# Make sure Debian's chromium is at /usr/bin/chromium for the dashboard's browser tests.
# Idempotent and quiet: does nothing when it is already there; otherwise installs it with
# apt-get (as root, or through sudo).
set -euo pipefail
BROWSER=/usr/bin/chromium
[ -x "$BROWSER" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
else
    echo "install_browser.sh: $BROWSER is missing and this user cannot run apt-get" >&2
    exit 1
fi
echo "install_browser.sh: installing chromium with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
[ -x "$BROWSER" ] || { echo "install_browser.sh: $BROWSER still missing" >&2; exit 1; }
