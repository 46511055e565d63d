"""`python -m data.convert --format FORMAT --input PATH --output DIR [--preview N]`: a public zoom-trajectory SFT set
as a dataset `sft.py` trains on by name (`dataset_name: DIR` in a recipe).

Reads the dataset's folder as downloaded with the reader `--format` names (`data.converters.FORMATS`: every box
composed into the original image's pixels), and writes to DIR:
- the dataset (`save_to_disk`, split `train`): `id`, `source`, `prompt` (this repo's system prompt and the
  question), `image` (the original), `answer`, `options`, `gold_calls` (per call its `box` in original pixels,
  `thought`, `label`, `label_source`) and `final_thought`. SFT maps each box into the frame the model sees and
  replays it through the real tool (`data.trajectories.replay_calls`): the dataset's own crops are never reused,
  only compared with (a row whose crop disagrees with the release's is skipped, `crop_mismatch`);
- `stats.json`: rows read, converted, skipped by reason (the first rows of each named), calls by `label_source`,
  the crop check against the crops the release ships (`crop_check`), and the calls dropped because the release shows
  they failed upstream (`calls_failed_upstream`);
- with `--preview N`, for the first N rows `preview/<i>/image.png`, `crop_<k>.png` (the tool's crops on replay, at
  the real recipes' pixel budget unless `--max_pixels` says otherwise), `trajectory.json` (each call's `bbox_2d` in
  the model's frame, `--box_convention`: what SFT will train it to write), and `preview/index.html` showing them all.

The dataset itself holds no convention: boxes are original pixels and the prompt is the `pixels` one; SFT maps each
box into the frame of the recipe's `box_convention` and says that frame in the system turn.

A row that cannot be converted is skipped and counted (`data.converters.SKIP_REASONS`); an input that is not in the
format's layout fails at once, naming what was expected and found.
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

from data.converters import FORMATS, LABEL_SOURCES, SKIP_REASONS, SkipRow, Trajectory
from data.synthetic import ROW_FEATURES
from data.task import build_prompt, in_box_convention
from data.trajectories import replay_calls
from tools import BOX_CONVENTIONS, ToolConfig, make_environment_factory
from tools.config import PixelBudget
from utils.recipes import real_recipe_budget

logger = logging.getLogger(__name__)

# A converted SFT trajectory: the columns every row has (`data.synthetic.ROW_FEATURES`), then its calls and the
# thought before its answer, in place of a task row's one target (`data.synthetic.TASK_FEATURES`).
TRAJECTORY_FEATURES = datasets.Features(
    {
        **ROW_FEATURES,
        "gold_calls": datasets.List(
            {
                "box": datasets.List(datasets.Value("int32"), length=4),
                "thought": datasets.Value("string"),
                "label": datasets.Value("string"),
                "label_source": datasets.Value("string"),
            }
        ),
        "final_thought": datasets.Value("string"),
    }
)


def as_row(trajectory: Trajectory) -> dict:
    """A `Trajectory` as a dataset row (`TRAJECTORY_FEATURES`)."""
    return {
        "id": trajectory.id,
        "source": trajectory.source,
        "prompt": build_prompt(trajectory.question, trajectory.options),
        "image": trajectory.image,
        "answer": trajectory.answer,
        "options": list(trajectory.options),
        "gold_calls": [
            {"box": list(c.box), "thought": c.thought, "label": c.label, "label_source": c.label_source}
            for c in trajectory.calls
        ],
        "final_thought": trajectory.final_thought,
    }


SKIP_EXAMPLES = 3  # per reason, the first skipped rows `stats.json` names (file, row and why), to look them up


def convert(fmt: str, source: Path, tool: ToolConfig) -> tuple[list[Trajectory], dict]:
    """Every convertible row of `source` in `fmt`, its labels held to `tool`'s label limits, and the stats: rows read,
    converted, skipped by reason (with the first rows of each), calls by label source, the crop check against the
    release's own crops, and the calls dropped because they failed upstream."""
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
    calls = Counter(call.label_source for t in kept for call in t.calls)
    stats = {
        "format": fmt,
        "input": str(source),
        "rows_read": len(kept) + skipped.total(),
        "rows_converted": len(kept),
        "rows_skipped": {reason: skipped[reason] for reason in SKIP_REASONS if skipped[reason]},
        "skipped_examples": {reason: examples[reason] for reason in SKIP_REASONS if reason in examples},
        "calls_by_label_source": {source: calls[source] for source in LABEL_SOURCES},
        # The check against the crops the release ships (`data.converters.crop_disagreement`), per format: every kept
        # call agreed; `rows_mismatched` rows were skipped (`crop_mismatch`).
        "crop_check": {
            "calls_checked": sum(t.crops_checked for t in kept),
            "calls_checked_by_content": sum(t.content_checked for t in kept),
            "rows_mismatched": skipped["crop_mismatch"],
        },
        "calls_failed_upstream": sum(t.failed_calls for t in kept),
    }
    return kept, stats


def preview_budget(max_pixels: int | None) -> tuple[ToolConfig, PixelBudget]:
    """The tool and pixel budget the preview replays with, so its crops are those training will show: the real RL
    recipes' (`utils.recipes.real_recipe_budget`) unless `max_pixels` is given."""
    return real_recipe_budget(max_pixels)


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
        tool, budget = preview_budget(args.max_pixels)
        tool = dataclasses.replace(tool, box_convention=args.box_convention)
        rows = [as_row(t) for t in trajectories[: args.preview]]
        page = write_preview(rows, args.output / "preview", tool, budget, stats["skipped_examples"])
        stats["preview"] = str(page)
    print(json.dumps(stats, indent=1))
    return stats


if __name__ == "__main__":
    main()
