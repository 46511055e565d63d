"""`python -m data.convert --format FORMAT --input PATH --output DIR [--preview N]`: a public zoom-trajectory SFT set
as a dataset `sft.py` trains on by name (`dataset_name: DIR` in a recipe).

Reads the dataset's folder as downloaded with the reader `--format` names (`data.converters.FORMATS`), and writes to
DIR the dataset (`save_to_disk`, split `train`, `data.rows.TRAJECTORY_FEATURES`: every box in the original's pixels,
the prompt the `pixels` one), `stats.json` (rows read, converted, skipped by reason with the first of each, calls by
label source, the crop check, the calls that failed upstream) and, with `--preview N`, `preview/index.html` showing the
first N rows replayed through the tool in the frame of `--box_convention`. What each holds: docs/data.md.

A row that cannot be converted is skipped and counted (`data.converters.common.SKIP_REASONS`); an input that is not in
the format's layout fails at once, naming what was expected and found.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import datasets

from data.converters import FORMATS
from data.converters.common import SKIP_REASONS, SkipRow
from data.converters.labels import LABEL_SOURCES
from data.rows import TRAJECTORY_FEATURES, Trajectory, as_row
from data.task import in_box_convention
from data.trajectories import replay_calls
from tools import BOX_CONVENTIONS, ToolConfig, make_environment_factory
from tools.config import PixelBudget
from utils.recipes import real_recipe_budget

logger = logging.getLogger(__name__)

SKIP_EXAMPLES = 3  # per reason, the first skipped rows `stats.json` names (file, row and why), to look them up


def convert(fmt: str, source: Path, tool: ToolConfig) -> tuple[list[Trajectory], dict]:
    """Every convertible row of `source` in `fmt`, its labels held to `tool`'s label limits, and `stats.json`."""
    if fmt not in FORMATS:
        raise ValueError(f"--format: unknown format {fmt!r}; known: {sorted(FORMATS)}")
    if not source.is_dir():
        raise ValueError(f"--input: {source} is not a folder (give the dataset's folder as downloaded)")
    kept, skipped, examples = [], Counter(), {}
    for item in FORMATS[fmt](source, tool):
        if isinstance(item, SkipRow):
            skipped[item.reason] += 1
            if len(examples.setdefault(item.reason, [])) < SKIP_EXAMPLES:
                examples[item.reason].append(f"{item.where}: {item.detail}" if item.detail else item.where)
            logger.debug("skipped %s: %s", item.where, item)
        else:
            kept.append(item)
    calls = Counter(call["label_source"] for t in kept for call in t.calls)
    stats = {
        "format": fmt,
        "input": str(source),
        "rows_read": len(kept) + skipped.total(),
        "rows_converted": len(kept),
        "rows_skipped": {reason: skipped[reason] for reason in SKIP_REASONS if skipped[reason]},
        "skipped_examples": {reason: examples[reason] for reason in SKIP_REASONS if reason in examples},
        "calls_by_label_source": {source: calls[source] for source in LABEL_SOURCES},
        # every kept call agreed with the crop the release ships (`data.converters.crop_check`)
        "crop_check": {
            "calls_checked": sum(t.crops_checked for t in kept),
            "calls_checked_by_content": sum(t.content_checked for t in kept),
            "rows_mismatched": skipped["crop_mismatch"],
        },
        "calls_failed_upstream": sum(t.failed_calls for t in kept),
        # where the format's convention is chosen per row by its crops (docs/data.md): the rows converted under each
        "rows_by_reading": dict(sorted(Counter(t.reading for t in kept if t.reading).items())),
    }
    return kept, stats


def write_preview(
    rows: Sequence[dict], out: Path, tool: ToolConfig, budget: PixelBudget, skipped: dict[str, list[str]] | None = None
) -> Path:
    """`out/<i>/image.png`, `crop_<k>.png` (the tool's crops on replay), `trajectory.json`, and `out/index.html`, which
    also lists the first `skipped` rows of each reason (`stats.json`'s examples: code the reader could not read
    quotes its statement)."""
    env = make_environment_factory(tool, budget)()
    cards = []
    for i, row in enumerate(rows):
        folder = out / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        row["image"].save(folder / "image.png")
        calls = replay_calls(row, env)
        for k, call in enumerate(env.calls, start=1):
            call.crop.save(folder / f"crop_{k}.png")
        record = {
            "id": row["id"],
            "source": row["source"],
            "messages": [
                {"role": m["role"], "content": m["content"]}
                for m in in_box_convention(row["prompt"], env.box_convention)
            ],
            "answer": row["answer"],
            "final_thought": row["final_thought"],
            "calls": [
                {
                    **gold,
                    "bbox_2d": seen["bbox_2d"],
                    "seen_size": list(env.seen_size),
                    "box_frame": list(env.box_frame),
                }
                for gold, seen in zip(row["gold_calls"], calls)
            ],
        }
        (folder / "trajectory.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        cards.append(_card(i, record, row["image"].size))
    skips = "".join(
        f"<li><b>{reason}</b> ({html.escape(SKIP_REASONS[reason])})<ul>"
        + "".join(f"<li><code>{html.escape(example)}</code></li>" for example in examples)
        + "</ul></li>"
        for reason, examples in (skipped or {}).items()
    )
    skips = f"<h2>Skipped rows, the first of each reason</h2><ul>{skips}</ul>" if skips else ""
    page = out / "index.html"
    page.write_text(_PAGE.format(count=len(cards), cards="\n".join(cards), skipped=skips), encoding="utf-8")
    return page


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>converted trajectories</title><style>
body{{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}}
.card{{background:#fff;border:1px solid #ddd;border-radius:6px;margin:1em 0;padding:1em}}
.row{{display:flex;gap:1em;flex-wrap:wrap;align-items:flex-start}}.src{{color:#777}}
.frame{{position:relative;display:inline-block;line-height:0}}.frame svg{{position:absolute;inset:0;width:100%;height:100%}}
figure{{margin:0}}figcaption{{font-size:12px;color:#555;max-width:480px}}.crop{{border:3px solid #2a9d8f;padding:2px}}
pre{{white-space:pre-wrap;background:#f3f3f3;padding:.5em;margin:.3em 0}}
</style></head><body><h1>{count} converted trajectories</h1>
{cards}
{skipped}
</body></html>
"""


def _card(i: int, record: dict, size: tuple[int, int]) -> str:
    width, height = size
    boxes = "".join(
        f'<rect x="{x1}" y="{y1}" width="{x2 - x1}" height="{y2 - y1}" fill="none" stroke="#2a9d8f" '
        f'stroke-width="{max(2, width // 200)}"/>'
        for x1, y1, x2, y2 in (call["box"] for call in record["calls"])
    )
    crops = "".join(
        f'<figure><img class="crop" src="{i}/crop_{k}.png" style="max-width:240px;max-height:240px">'
        f"<figcaption>{k}. {html.escape(call['label'])} ({call['label_source']}); box {call['box']}</figcaption>"
        f"<pre>{html.escape(call['thought'])}</pre></figure>"
        for k, call in enumerate(record["calls"], start=1)
    )
    question = html.escape(record["messages"][-1]["content"])
    return (
        f'<div class="card" id="row-{i}"><h2>{i}. {html.escape(record["id"])} '
        f'<span class="src">{html.escape(record["source"])}</span></h2><pre>{question}</pre><div class="row">'
        f'<figure class="frame"><img src="{i}/image.png" style="max-width:480px;max-height:480px">'
        f'<svg viewBox="0 0 {width} {height}" preserveAspectRatio="none">{boxes}</svg></figure>{crops}</div>'
        f"<pre>{html.escape(record['final_thought'])}</pre><p>answer: <b>{html.escape(record['answer'])}</b></p></div>"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", required=True, choices=sorted(FORMATS))
    parser.add_argument("--input", required=True, type=Path, help="the dataset's folder as downloaded")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--preview", type=int, default=0, help="write a preview of the first N converted rows")
    parser.add_argument("--max_pixels", type=int, default=None, help="preview budget (default: the RL recipes')")
    parser.add_argument(
        "--box_convention", choices=BOX_CONVENTIONS, default="pixels", help="the preview's frame of bbox_2d"
    )
    tool = ToolConfig()  # the label limits: the tool's, unless given here
    parser.add_argument("--max_label_words", type=int, default=tool.max_label_words)
    parser.add_argument("--max_label_chars", type=int, default=tool.max_label_chars)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    tool = ToolConfig(max_label_words=args.max_label_words, max_label_chars=args.max_label_chars)
    trajectories, stats = convert(args.format, args.input, tool)
    if not trajectories:
        raise SystemExit(f"no row of {args.input} converted: {stats['rows_skipped']}")
    dataset = datasets.Dataset.from_list([as_row(t) for t in trajectories], features=TRAJECTORY_FEATURES)
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(args.output))
    (args.output / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    if args.preview:
        tool, budget = real_recipe_budget(args.max_pixels)  # the crops training will show
        tool = dataclasses.replace(tool, box_convention=args.box_convention)
        rows = [as_row(t) for t in trajectories[: args.preview]]
        page = write_preview(rows, args.output / "preview", tool, budget, stats["skipped_examples"])
        stats["preview"] = str(page)
    print(json.dumps(stats, indent=1))
    return stats


if __name__ == "__main__":
    main()
