"""Render the aggregator's settings table into docs/aggregator.md.

The table (setting, environment variable, type, default, description) comes
from the fields of :class:`aggregator.settings.Settings` and replaces the
lines between the two marker comments of the doc's "Settings" section. A test
compares the doc with :func:`render_table`, so the table cannot drift from the
code. Run from anywhere::

    python scripts/render_settings.py          # rewrite the table
    python scripts/render_settings.py --check  # exit 1 if the doc's table is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.settings import setting_rows  # noqa: E402

DOC = ROOT / "docs" / "aggregator.md"
START = "<!-- settings table: start (rendered by scripts/render_settings.py) -->"
END = "<!-- settings table: end -->"
_BLOCK = re.compile(re.escape(START) + r"\n(.*?)" + re.escape(END), re.DOTALL)


def render_table() -> str:
    """The Markdown table of every setting, one row each, in the fields' order."""
    lines = [
        "| Setting | Variable | Type | Default | Meaning |",
        "|---|---|---|---|---|",
    ]
    for row in setting_rows():
        cells = [
            f"`{row['env'].removeprefix('LDP_')}`",
            f"`{row['env']}`",
            row["type"],
            f"`{row['default']}`" if row["default"] != "unset" else "unset",
            row["description"].replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def doc_table(text: str) -> str:
    """The table between the markers of ``text`` (ValueError if the markers are missing)."""
    match = _BLOCK.search(text)
    if match is None:
        raise ValueError(f"the settings table's markers are missing: {START} ... {END}")
    return match.group(1)


def with_table(text: str, table: str) -> str:
    """``text`` with the table between its markers replaced by ``table``."""
    doc_table(text)  # the markers must be there
    return _BLOCK.sub(lambda _: f"{START}\n{table}{END}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the doc is current")
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown file to update")
    args = parser.parse_args(argv)
    text = args.doc.read_text(encoding="utf-8")
    table = render_table()
    if args.check:
        if doc_table(text) != table:
            print(f"{args.doc}: the settings table is stale; run {Path(__file__).name}")
            return 1
        print(f"{args.doc}: the settings table is current")
        return 0
    print(table, end="")
    args.doc.write_text(with_table(text, table), encoding="utf-8")
    print(f"written to {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
