"""What the research reports share: their tables in Markdown, and the sections every report opens with."""

from __future__ import annotations

from collections.abc import Sequence


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
