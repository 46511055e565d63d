"""What the research reports share: their tables in Markdown, the sections every report opens with, and the check that
every number of a headline is one of its results."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; `|` inside a cell is escaped so it cannot split the row."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row needs {len(header)} cells: {[len(row) for row in rows]}")

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def verdict_sections(criteria: str, shows: Sequence[str], command: str) -> list[str]:
    """The lines of "What would count", "What it shows" (which the demo reads, `tiny.stages.experiment_verdict`)
    and "Command", up to the "## Setup" heading each report continues under."""
    return [
        "## What would count",
        "",
        criteria,
        "",
        "## What it shows",
        "",
        *shows,
        "",
        "## Command",
        "",
        "```bash",
        command,
        "```",
        "",
        "## Setup",
    ]


# A number in a report's prose: an optional sign, digits (thousands may be comma-grouped), decimals, an exponent, a
# percent sign; not part of a word (`sft-round2`, `x^2`).
NUMBER = re.compile(r"(?<![\w.^*])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?%?(?![\w^])")
# Text whose digits are names, not figures: code spans and the propositions' numbers.
NAMES = re.compile(r"`[^`]*`|Proposition [12](?: \([ab]\))?|Prop\. [12](?: \([ab]\))?")


def _leaves(data) -> list[float]:
    if isinstance(data, dict):
        return [v for x in data.values() for v in _leaves(x)]
    if isinstance(data, (list, tuple)):
        return [v for x in data for v in _leaves(x)]
    if isinstance(data, (int, float)) and not isinstance(data, bool) and math.isfinite(data):
        return [float(data)]
    return []


def unbacked_numbers(text: str, data) -> list[str]:
    """The numbers written in `text` that no number in `data` (results.json, loaded) rounds to, as written: a figure
    with d decimals must be a value within half a unit of its last decimal (a percentage: its value times 100). Digits
    inside code spans and the propositions' numbers are names, not figures. Empty when every figure is backed."""
    leaves = np.asarray(_leaves(data))
    unbacked = []
    for token in NUMBER.findall(NAMES.sub(" ", text)):
        percent = token.endswith("%")
        body = token.rstrip("%").replace(",", "")
        value = float(body)
        mantissa, _, exponent = body.lower().partition("e")
        decimals = len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)
        candidates = leaves * 100 if percent else leaves
        if not np.any(np.abs(candidates - value) <= 0.5 * 10.0**-decimals * (1 + 1e-9) + 1e-12):
            unbacked.append(token)
    return unbacked
