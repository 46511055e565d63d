"""What code under reading evaluates to (pictures, images it showed, modules, values it does not follow) and the
bounds that keep any row's reading quick: the numbers, sequences and code sizes
`data.converters.code_reader.CodeReader` reads, and the skips it raises past them."""

from __future__ import annotations

import ast
import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from data.converters.common import SkipRow
from data.quoting import brief, cut

Extent = tuple[float, float, float, float]  # the region of the original an image shows, in original pixels


@dataclass(frozen=True)
class Picture:
    """An image value of code under reading."""

    extent: Extent | None  # None for an image made by an operation that is not a crop, resize or enhancement
    size: tuple[int, int]  # width, height, in its own pixels
    array: bool  # a numpy array (indexed [y, x]), else a PIL image
    made_by: str = "the original"
    cropped: bool = False


@dataclass(frozen=True)
class Shown:
    """An image the code showed the model."""

    picture: Picture
    via: str  # display (`display`, `.show()`, a cell's last value), figure (a matplotlib figure of it) or save


class _Opaque:
    """A value the reader does not follow (a string it built, a file handle): fine until a crop needs it."""

    def __repr__(self):
        return "<not evaluated>"


OPAQUE = _Opaque()


@dataclass(frozen=True)
class Module:
    name: str  # "cv2", "PIL.Image", "matplotlib.pyplot", or a function in one: "cv2.resize"


@dataclass(frozen=True)
class _Bound:
    """A method of a value: `picture.crop`, `enhancer.enhance`."""

    owner: Any
    name: str


@dataclass(frozen=True)
class _Enhancer:
    """`ImageEnhance.Contrast(picture)` or `cv2.createCLAHE()`: an object whose `enhance` / `apply` changes colours."""

    picture: Picture | None


class OriginalPath(str):
    """The path of the original image as the code sees it (Thyme's `image_path`)."""


# Bounds on what the reader computes, so that no row can keep it busy (`x = 10 ** 10 ** 9` before a crop took over 15 s
# and gigabytes): a number over MAX_NUMBER in magnitude is one no image coordinate needs (2**53, the largest whole
# number a float holds exactly: every coordinate becomes a float) and `unsupported_code`; so is a sequence of over
# MAX_ITEMS items built by `+` (`*` on a sequence is not evaluated), and a `round` to more than MAX_ROUND_DIGITS
# digits either way (`round(5, -10**9)` computes 10**(10**9)). Every operation on bounded values is then quick, and
# CODE_SECONDS_PER_ROW (of evaluation, summed over a row's code turns) is the net under whatever else a row could do:
# over it, the row is skipped as `slow_code`.
MAX_NUMBER = 2**53
MAX_ITEMS = 10_000
MAX_ROUND_DIGITS = 20
CODE_SECONDS_PER_ROW = 2.0
# What the clock cannot interrupt is bounded instead (issue 59, item 4). `ast.parse` is one call: a million lines took
# 19 s and 2.9 GB before the first statement's check, so a code turn over MAX_CODE_CHARS or MAX_CODE_LINES is
# `unsupported_code` unparsed (20,000 characters parse in about 25 ms; a code turn of the releases is tens of lines).
# A number function is one call too: `sum(b, [])` over lists of lists built a list of 10**8 items, so the items of
# its arguments, nested ones counted, are bounded by MAX_ITEMS. A skip's message names values by a bounded repr: the
# whole repr of `a = [a, a]` doubled 30 times (2**30 leaves: 60 s, gigabytes, a 201 MB stats.json) is never built.
MAX_CODE_CHARS = 20_000
MAX_CODE_LINES = 1_000
MAX_DETAIL = 300  # characters of a skip's message


def _shown(value: Any) -> str:
    """`value` as a skip's message names it (`data.quoting.brief`), at most 120 characters."""
    return cut(brief(value), 120)


def _unsupported(node: ast.AST | None, what: str) -> SkipRow:
    line = f"line {node.lineno}: " if node is not None and hasattr(node, "lineno") else ""
    return SkipRow("unsupported_code", f"{line}{what}")


QUOTE_CHARS = 160  # of the statement an `unsupported_code` skip quotes


@contextlib.contextmanager
def _quoting(node: ast.stmt) -> Iterator[None]:
    """An `unsupported_code` skip raised inside `node` quotes it (the innermost statement: a compound one, its header),
    so the stats and the preview show the form the reader could not read."""
    try:
        yield
    except SkipRow as skip:
        if skip.reason != "unsupported_code" or skip.statement:
            raise
        header = {ast.If: "if {}:", ast.While: "while {}:"}.get(type(node))
        text = header.format(ast.unparse(node.test)) if header else ast.unparse(node).splitlines()[0]
        text = cut(text, QUOTE_CHARS)
        quoted = SkipRow("unsupported_code", f"{skip.detail} in `{text}`")
        quoted.statement = text
        raise quoted from None


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))  # isfinite(10**400) raises


def _bounded(value: Any, node: ast.AST | None) -> Any:
    """`value`, or `unsupported_code` where it is a number or a sequence over the reader's bounds (`MAX_NUMBER`,
    `MAX_ITEMS`)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and not abs(value) <= MAX_NUMBER:
        shown = f"{value:.3g}" if isinstance(value, float) else f"an integer of {value.bit_length()} bits"
        raise _unsupported(node, f"a number no image coordinate needs ({shown}, over 2**53)")
    if isinstance(value, tuple | list) and len(value) > MAX_ITEMS:
        raise _unsupported(node, f"a sequence of {len(value)} items (over {MAX_ITEMS})")
    return value


def _items_over(values: Sequence[Any], limit: int) -> bool:
    """Whether `values` hold over `limit` items, those of nested sequences counted; the walk stops past `limit`, so a
    structure that shares its parts (`a = [a, a]` doubled: 2**30 leaves) costs no more than `limit` steps."""
    stack, seen = list(values), 0
    while stack:
        value = stack.pop()
        if isinstance(value, tuple | list):
            seen += len(value)
            if seen > limit:
                return True
            stack.extend(value)
    return False


def _power_bits(base: Any, exponent: Any) -> float:
    """About how many bits `base ** exponent` takes, for integers, computed without it."""
    if not (isinstance(base, int) and isinstance(exponent, int)) or abs(base) <= 1 or exponent <= 0:
        return 0.0
    return exponent * math.log2(abs(base))
