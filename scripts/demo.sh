#!/usr/bin/env bash
# Install the aggregator and run the demo: a server on an embedded Redis, demo
# campaigns filled with a simulated population through the real client, and
# the dashboard's address. Extra arguments go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# pip's log goes to a file and is shown only if the install fails.
.venv/bin/python -m pip install --disable-pip-version-check -e '.[simulate]' > .venv/pip.log 2>&1 \
    || { cat .venv/pip.log; exit 1; }
exec .venv/bin/python scripts/demo.py "$@"
