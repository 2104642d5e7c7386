"""Text printed on a terminal: control and format characters escaped, everything else kept."""

from __future__ import annotations

import json
import unicodedata

import pytest

from shared.terminal import json_text, printable

HOSTILE = "a\x1b]0;owned\x07b\x1b[2J\x9b31m\x7f\u202egnp.exe\u2028\r\n\t\x00"


def terminal_controls(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def test_printable_escapes_every_control_and_format_character():
    shown = printable(HOSTILE)
    assert terminal_controls(shown) == []
    assert shown == ("a\\x1b]0;owned\\x07b\\x1b[2J\\x9b31m\\x7f\\u202egnp.exe\\u2028\\r\\n\\t\\x00")


@pytest.mark.parametrize(
    "text", ["Favourite fruit", "Café? Ünïcödé", "家族 👨\u200d👩\u200d👧", ""]
)
def test_printable_keeps_ordinary_text(text):
    assert printable(text) == text


def test_json_text_parses_back_to_the_same_data():
    data = {"title": HOSTILE, "label": "\U000e0001 tag", "n": [1, 2.5]}
    for indent in (None, 2):
        text = json_text(data, indent=indent)
        assert terminal_controls(text.replace("\n", "")) == []
        assert json.loads(text) == data
    assert json_text({"t": "Café"}) == '{"t": "Café"}'
