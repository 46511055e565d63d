"""How a message quotes a value from a row: at a cost and a length that do not grow with the value (a list nested
100,000 deep, a number of 5,000 digits, a string of megabytes). The converters' skips (`data.converters`) and the
benchmark readers' bad rows (`data.benchmarks`) quote through these two functions (issue 59)."""

from __future__ import annotations

import reprlib
from typing import Any

_BRIEF = reprlib.Repr()  # 3 levels deep, 6 items of each, 60 characters of a string or any other value
_BRIEF.maxlevel = 3
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxset = 6
_BRIEF.maxdict = 4
_BRIEF.maxstring = _BRIEF.maxother = 60


def brief(value: Any) -> str:
    """`repr(value)` in a few dozen characters, built without recursion past 3 levels (`reprlib`)."""
    try:
        return _BRIEF.repr(value)
    except ValueError:  # an int past Python's 4,300 digits has no repr
        return f"<an {type(value).__name__} too large to show>"


def cut(text: str, limit: int) -> str:
    """`text`, or its start and its length in at most `limit` characters."""
    if len(text) <= limit:
        return text
    suffix = f"... ({len(text)} characters)"
    return text[: max(limit - len(suffix), 0)] + suffix
