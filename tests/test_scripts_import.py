"""Every script under scripts/ still imports: a benchmark that names something the product
renamed fails here, not on the day someone runs it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted(path.stem for path in (Path(__file__).parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports(name):
    importlib.import_module(f"scripts.{name}")
