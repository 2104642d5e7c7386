#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite.
#   - a virtual environment in .venv with the package and its `test` extra;
#   - Debian's chromium for the dashboard tests (apt-get, only if missing).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# pip's log goes to a file and is shown only if the install fails.
.venv/bin/python -m pip install --disable-pip-version-check -e '.[test]' > .venv/pip.log 2>&1 \
    || { cat .venv/pip.log; exit 1; }
bash scripts/install_browser.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
