#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite.
#   - a virtual environment in .venv with the package and its `test` extra;
#   - Debian's chromium for the dashboard tests (apt-get, only if missing).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
bash scripts/install_browser.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
exec .venv/bin/python -m pytest "$@"
