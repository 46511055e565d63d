"""`python -m data.convert --format FORMAT --input PATH --output DIR [--preview N]`: a public zoom-trajectory SFT set
as a dataset `sft.py` trains on by name (`dataset_name: DIR` in a recipe).

Reads the dataset's folder as downloaded with the reader `--format` names (`data.converters.FORMATS`), and writes to
DIR the dataset (`save_to_disk`, split `train`, `data.rows.TRAJECTORY_FEATURES`: every box in the original's pixels,
the prompt the `pixels` one), `stats.json` (rows read, converted, skipped by reason with the first of each, calls by
label source, the crop check, the calls that failed upstream, calls per row, thoughts naming Mini-o3's observations,
each crop's size as SFT shows it) and, with `--preview N`, `preview/index.html` showing the first N rows replayed
through the tool in the frame of `--box_convention`. What each holds: docs/data.md.

Rows with more calls than `--max_calls` (by default `--rl_recipe`'s `max_tool_calling_iterations`; the real RL
recipes' base, `recipes/mapo_paper.yaml`, unless named) are skipped: SFT would teach what RL always cuts short.

A row that cannot be converted is skipped and counted (`data.converters.common.SKIP_REASONS`), whatever it holds (a
field of another type, nesting or numbers past the parser's limits, text that is not UTF-8); so is a record file that
cannot be read from a row on (`unreadable_file`: a truncated parquet shard), the other files converted. Nothing outside
`--input` is read (`outside_input`). An input that is not in the format's layout fails at once, naming what was
expected and found.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import logging
import math
import re
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import datasets
from datasets.exceptions import DatasetGenerationError

from data.converters import FORMATS
from data.converters.common import SKIP_REASONS, SkipRow
from data.converters.labels import LABEL_SOURCES
from data.rows import TRAJECTORY_FEATURES, Trajectory, as_row, percentiles
from data.task import in_box_convention
from data.trajectories import replay_calls, seen_box
from tools import BOX_CONVENTIONS, ToolConfig, crop_box, make_environment_factory, seen_size
from tools.config import PixelBudget
from tools.zoom_in import box_frame, crop_size
from utils.recipes import REAL_RECIPE_BASE, load_recipe, real_recipe_budget

logger = logging.getLogger(__name__)

# An image named as Mini-o3's conversation numbers them ("observation_1" in a call's source, "Observation 2" in a turn).
OBSERVATION_NAME = re.compile(r"\bobservation[ _]?\d+", re.IGNORECASE)
SKIP_EXAMPLES = 3  # per reason, the first skipped rows `stats.json` names (file, row and why), to look them up
WRITER_BATCH = 64  # rows buffered before they are written: ~64 originals' file bytes


def convert(
    fmt: str, source: Path, tool: ToolConfig, max_calls: int | None = None, budget: PixelBudget | None = None
) -> tuple[list[Trajectory], dict]:
    """Every convertible row of `source` in `fmt` with at most `max_calls` calls, and `stats.json`, in memory, for
    small sets and tests (`main` streams: `convert_rows`)."""
    stats: dict = {}
    kept = list(convert_rows(fmt, source, tool, stats, max_calls, budget))
    return kept, stats


def convert_rows(
    fmt: str,
    source: Path,
    tool: ToolConfig,
    stats: dict,
    max_calls: int | None = None,
    budget: PixelBudget | None = None,
) -> Iterator[Trajectory]:
    """The convertible rows of `source` in `fmt` with at most `max_calls` calls, their labels held to `tool`'s label
    limits, one at a time, so that a release of any size converts in bounded memory; `stats` is filled once the last
    row has been read; with `budget` (the processor's), it also sizes each call's crop as SFT's replay through the
    tool shows it (`CropSizes`). A bad `fmt` or `source` fails at once."""
    if fmt not in FORMATS:
        raise ValueError(f"--format: unknown format {fmt!r}; known: {sorted(FORMATS)}")
    if not source.is_dir():
        raise ValueError(f"--input: {source} is not a folder (give the dataset's folder as downloaded)")
    return _convert_rows(fmt, source, tool, stats, max_calls, budget)


def _convert_rows(
    fmt: str, source: Path, tool: ToolConfig, stats: dict, max_calls: int | None, budget: PixelBudget | None
) -> Iterator[Trajectory]:
    skipped, examples, calls, calls_per_row, readings = Counter(), {}, Counter(), Counter(), Counter()
    kept = crops_checked = content_checked = failed_calls = naming = 0
    crops = CropSizes(tool, budget) if budget is not None else None

    def skip(reason: str, where: str, detail: str = "") -> None:
        skipped[reason] += 1
        if len(examples.setdefault(reason, [])) < SKIP_EXAMPLES:
            examples[reason].append(f"{where}: {detail}" if detail else where)

    for item in FORMATS[fmt](source, tool):
        if isinstance(item, SkipRow):
            skip(item.reason, item.where, item.detail)
            # a lost file is said as it happens, not only counted: its rows are missing from the set
            logger.log(logging.ERROR if item.reason == "unreadable_file" else logging.DEBUG, "skipped %s: %s",
                       item.where, item)  # fmt: skip
            continue
        calls_per_row[len(item.calls)] += 1
        if max_calls is not None and len(item.calls) > max_calls:  # SFT would teach what RL always cuts short
            skip("too_many_calls", f"row {item.id}", f"{len(item.calls)} calls, over max_calls={max_calls}")
            continue
        kept += 1
        readings.update([item.reading] if item.reading else [])
        calls.update(call["label_source"] for call in item.calls)
        crops_checked, content_checked = crops_checked + item.crops_checked, content_checked + item.content_checked
        failed_calls += item.failed_calls
        thoughts = [call["thought"] for call in item.calls] + [item.final_thought]
        naming += sum(bool(OBSERVATION_NAME.search(thought)) for thought in thoughts)
        if crops is not None:
            crops.add(item)
        yield item
    # every row converted (the ones over max_calls too) or skipped; an unreadable file is one skip and no row read
    rows_read = calls_per_row.total() + skipped.total() - skipped["too_many_calls"] - skipped["unreadable_file"]
    stats |= {
        "format": fmt,
        "input": str(source),
        "rows_read": rows_read,
        "rows_converted": kept,
        "rows_skipped": {reason: skipped[reason] for reason in SKIP_REASONS if skipped[reason]},
        "skipped_examples": {reason: examples[reason] for reason in SKIP_REASONS if reason in examples},
        "calls_by_label_source": {source: calls[source] for source in LABEL_SOURCES},
        # every kept call agreed with the crop the release ships (`data.converters.crop_check`)
        "crop_check": {
            "calls_checked": crops_checked,
            "calls_checked_by_content": content_checked,
            "rows_mismatched": skipped["crop_mismatch"],
        },
        "calls_failed_upstream": failed_calls,
        # every converted row, the ones over max_calls included; `too_many_calls` counts those dropped
        "calls_per_row": {str(n): calls_per_row[n] for n in sorted(calls_per_row)},
        "max_calls": max_calls,
        # thoughts that name an image as `observation_1` or "Observation 2" (Mini-o3's conversation numbers every
        # crop it shows; this repo's tool responses name none), over the kept rows
        "thoughts_naming_observations": naming,
        # where the format's convention is chosen per row by its crops (docs/data.md): the rows converted under each
        "rows_by_reading": dict(sorted(readings.items())),
    }
    if crops is not None:
        stats["crops"] = crops.summary()


class CropSizes:
    """Each kept call's crop as SFT's replay shows it (`data.trajectories.replay_calls`: the box mapped into the
    model's frame, the region the tool cuts for it, resized to `tool.crop_budget`), by arithmetic on sizes alone,
    gathered row by row: its tokens natively (the crop budget without `crop_min_pixels`) and as shown, how many are
    under the floor (upscaled to it), and the pixels of the crop the release ships (what its thoughts were written
    against)."""

    def __init__(self, tool: ToolConfig, budget: PixelBudget):
        self.tool, self.budget = tool, budget
        self.floored = tool.crop_budget(budget)
        self.native_budget = dataclasses.replace(self.floored, min_pixels=budget.min_pixels)
        self.native, self.shown, self.release, self.larger = [], [], [], 0

    def add(self, trajectory: Trajectory) -> None:
        tool, budget = self.tool, self.budget
        size = trajectory.image.size
        frame = box_frame(seen_size(size, budget), tool.box_convention)
        for call, shipped in zip(trajectory.calls, trajectory.release_crops, strict=True):
            x1, y1, x2, y2 = crop_box(size, seen_box(call["box"], size, frame), seen_size=frame,
                                      min_side=tool.min_side, max_aspect=tool.max_aspect)  # fmt: skip
            ours = crop_size((x2 - x1, y2 - y1), self.floored)
            self.native.append(math.prod(crop_size((x2 - x1, y2 - y1), self.native_budget)) // budget.factor**2)
            self.shown.append(math.prod(ours) // budget.factor**2)
            self.release.append(math.prod(shipped))
            self.larger += math.prod(shipped) > math.prod(ours)

    def summary(self) -> dict:
        factor = self.budget.factor
        return {
            "crop_min_pixels": self.floored.min_pixels,
            "calls": len(self.native),
            "under_floor": sum(n * factor**2 < self.floored.min_pixels for n in self.native),
            "tokens_native": percentiles(self.native),
            "tokens_shown": percentiles(self.shown),
            "release_pixels": percentiles(self.release),
            "release_larger_than_shown": self.larger,
        }


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
    parser.add_argument(
        "--max_pixels", type=int, default=None, help="preview and crop statistics' budget (default: the RL recipes')"
    )
    parser.add_argument(
        "--crop_min_pixels", type=int, default=None, help="the crops' floor there (default: the RL recipes')"
    )
    parser.add_argument(
        "--rl_recipe",
        type=Path,
        default=REAL_RECIPE_BASE,
        help="the RL recipe the converted rows are trained before (default: the real RL recipes' base); its "
        "max_tool_calling_iterations is --max_calls' default",
    )
    parser.add_argument(
        "--max_calls", type=int, default=None, help="drop rows with more calls (default: --rl_recipe's limit)"
    )
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
    tool, budget = real_recipe_budget(args.max_pixels, args.crop_min_pixels)  # the crops training will show
    labels = {"max_label_words": args.max_label_words, "max_label_chars": args.max_label_chars}
    tool = dataclasses.replace(tool, box_convention=args.box_convention, **labels)
    max_calls = args.max_calls
    if max_calls is None:
        max_calls = load_recipe(args.rl_recipe).values.get("max_tool_calling_iterations")
        logger.info("max_calls %s: %s's max_tool_calling_iterations", max_calls, args.rl_recipe)
    stats, preview = {}, []
    trajectories = convert_rows(args.format, args.input, tool, stats, max_calls=max_calls, budget=budget)

    def rows() -> Iterator[dict]:
        for trajectory in trajectories:
            if len(preview) < args.preview:  # the preview draws on the decoded original
                preview.append(as_row(dataclasses.replace(trajectory, image_bytes=None)))
            yield as_row(trajectory)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    # Rows go to disk WRITER_BATCH at a time, each holding its original's file bytes only: memory does not grow with
    # the release (docs/benchmarks.md, "Converting a release"). A fresh cache folder and fingerprint: nothing cached.
    with tempfile.TemporaryDirectory(dir=args.output.parent, prefix=".convert-") as cache:
        try:
            dataset = datasets.Dataset.from_generator(
                rows, features=TRAJECTORY_FEATURES, cache_dir=cache, writer_batch_size=WRITER_BATCH,
                fingerprint=uuid.uuid4().hex,
            )  # fmt: skip
        except DatasetGenerationError as err:  # a bad layout, raised by the reader: say it, not the writer's wrap
            raise err.__cause__ or err from None
        except ValueError:  # `datasets` refuses a split with no row: every row was skipped
            if stats.get("rows_converted") != 0:
                raise
        if not stats.get("rows_converted"):
            raise SystemExit(
                f"no row of {args.input} converted: {stats.get('rows_skipped')}; the first of each: "
                f"{stats.get('skipped_examples')}"
            )
        datasets.DatasetDict({"train": dataset}).save_to_disk(str(args.output))
    (args.output / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    if args.preview:
        page = write_preview(preview, args.output / "preview", tool, budget, stats["skipped_examples"])
        stats["preview"] = str(page)
    print(json.dumps(stats, indent=1))
    return stats


if __name__ == "__main__":
    main()
