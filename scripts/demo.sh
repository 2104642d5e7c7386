#!/usr/bin/env bash
# Install the aggregator and run the demo: a server on an embedded Redis, demo
# campaigns filled with a simulated population through the real client, and
# the dashboard's address. Extra arguments go to scripts/demo.py; -h or --help
# answers at once, before anything is installed (the demo's options need only
# the standard library).
set -euo pipefail
# The command the demo's help and messages name: this script, as it was called.
export DEMO_COMMAND="bash $0"
cd "$(dirname "$0")/.."
for arg in "$@"; do
    case "$arg" in
        -h | --help)
            if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
            exec "$python" scripts/demo.py --help
            ;;
    esac
done
[ -x .venv/bin/python ] || python3 -m venv .venv
echo "Installing the aggregator into .venv (a minute or two the first time) ..."
# pip's log goes to a file and is shown only if the install fails.
.venv/bin/python -m pip install --disable-pip-version-check -e '.[simulate]' > .venv/pip.log 2>&1 \
    || { cat .venv/pip.log; exit 1; }
exec .venv/bin/python scripts/demo.py "$@"
