"""Text from elsewhere (titles, labels, server messages), made safe to print on a terminal.

A campaign title or label may hold any character, and a terminal obeys the
control characters it is sent: ``ESC [ 2 J`` clears the screen, ``ESC ] 0 ;``
sets the window title, a right-to-left override reverses what follows. The
command lines print such text through :func:`printable` (control and format
characters written as Python escapes, ``\\x1b``) or :func:`json_text` (the same
characters as JSON ``\\u`` escapes, so the JSON still parses to the same data).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

# Control, format (bidirectional overrides, zero-width marks), surrogate, line and
# paragraph separator characters.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# The zero-width joiners are format characters that compose emoji and Indic scripts.
_KEPT = frozenset({"\u200c", "\u200d"})
_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _ESCAPED_CATEGORIES and char not in _KEPT


def _python_escape(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable(text: Any) -> str:
    """``text`` with every control or format character written as a Python escape.

    Examples
    --------
    >>> printable("red\\x1b[31m")
    'red\\\\x1b[31m'
    """
    shown = str(text)
    if shown.isprintable():  # no control or format character: the usual case
        return shown
    return "".join(_python_escape(char) if _unsafe(char) else char for char in shown)


def json_text(
    data: Any, *, indent: int | None = None, separators: tuple[str, str] | None = None
) -> str:
    """``data`` as JSON (non-ASCII kept readable) with no character a terminal would obey.

    ``json.dumps`` escapes only C0 controls; DEL, C1 controls, bidirectional
    overrides and line separators in strings are written as ``\\u`` escapes too.
    """
    text = json.dumps(data, indent=indent, separators=separators, ensure_ascii=False)
    return "".join(_json_escape(char) if char != "\n" and _unsafe(char) else char for char in text)
