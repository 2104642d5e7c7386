"""docs/estimation.md's Python example prints what the guide says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "estimation.md"


def test_the_guide_s_example_prints_what_it_shows():
    text = DOC.read_text("utf-8")
    code, shown = re.search(
        r"From Python.*?```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", text, re.S
    ).groups()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(DOC), "exec"), {})
    assert printed.getvalue() == shown
