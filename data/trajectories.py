"""Gold multi-turn trajectories for the SFT cold start: planned from rows that carry a target box and label, or a
converted trajectory's own calls, replayed through the real tool; what they hold and why in two stages: docs/data.md,
"Gold trajectories"."""

from __future__ import annotations

import logging
import math
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import datasets
import numpy as np

from data.synthetic import region_cell, region_of
from data.task import in_box_convention
from tools import TOOL_NAME, ToolError, ZoomInEnv, boxes_overlap, crop_box, replay_call, validate_label

logger = logging.getLogger(__name__)

CALLS_FEATURE = datasets.List(
    {
        "bbox_2d": datasets.List(datasets.Value("int32"), length=4),
        "label": datasets.Value("string"),
        "thought": datasets.Value("string"),
    }
)
GOLD_BOXES = ("tight", "grid", "region")
MISS_ATTEMPTS = 32  # random placements tried for the first, missed call before settling for one call

# Thoughts are fixed sentences: the cold start teaches the format and the zoom-then-answer behaviour, and varied
# wording invented here would only be noise for RL to unlearn.
# They are short and do not repeat the label: every token is generated at each RL rollout, and the label already
# says what the call expects to see.
THINK_ZOOM = "It is too small to see here, so I zoom in."
THINK_MISSED = "This view does not show it, so I zoom in elsewhere."
THINK_SEEN = "The zoomed view shows it clearly."
THINK_NO_ZOOM = "I can answer from the image as it is."


@dataclass
class TrajectoryArguments:
    """How gold trajectories are synthesised (`data.trajectories`)."""

    call_mix: list[float] = field(
        default_factory=lambda: [0.1, 0.7, 0.2],
        metadata={
            "help": "Fractions of gold trajectories with 0, 1 and 2 zoom-in calls (2: a miss, then the target)."
        },
    )
    trajectory_seed: int = field(default=0, metadata={"help": "Seed of the per-row choice of variant and miss box."})
    gold_box: str = field(
        default="tight",
        metadata={
            "help": "The box of a gold call, in the model's frame (pixels of the image it sees, or thousandths of it "
            "with box_convention relative_1000). 'tight': the target box, rounded outwards. "
            "'grid': a gold_box_size-unit square centred on the gold_box_grid-unit grid cell that holds the "
            "target's centre (grown if the target sticks out): a few distinct boxes a small policy can learn to "
            "choose between, at a fixed zoom factor. 'region': the cell of the image's 3x3 grid that holds the "
            "target's centre, grown by gold_box_margin (the cell a `region_hint` question names).",
            "choices": list(GOLD_BOXES),
        },
    )
    gold_box_grid: int = field(
        default=14, metadata={"help": "'grid' gold boxes: cell side, in units of the model's frame."}
    )
    gold_box_size: int = field(default=28, metadata={"help": "'grid' gold boxes: box side, in units of the frame."})
    gold_box_margin: int = field(
        default=6, metadata={"help": "'region' gold boxes: units of the model's frame added to each side of the cell."}
    )

    def __post_init__(self):
        if len(self.call_mix) != 3 or min(self.call_mix) < 0 or not math.isclose(sum(self.call_mix), 1.0):
            raise ValueError(
                f"call_mix must be 3 non-negative fractions summing to 1 (0, 1, 2 calls); got {self.call_mix}"
            )
        if self.gold_box not in GOLD_BOXES:
            raise ValueError(f"gold_box must be one of {GOLD_BOXES}; got {self.gold_box!r}")
        if not 0 < self.gold_box_grid <= self.gold_box_size:
            raise ValueError(
                f"need 0 < gold_box_grid <= gold_box_size; got {self.gold_box_grid}, {self.gold_box_size}"
            )
        if self.gold_box_margin < 0:
            raise ValueError(f"gold_box_margin must be >= 0; got {self.gold_box_margin}")


@dataclass
class SynthesisStats:
    """What `build_gold_trajectories` made of a dataset."""

    calls: Counter = field(default_factory=Counter)  # kept rows by number of zoom-in calls
    skipped: Counter = field(default_factory=Counter)  # rows left out, by the column at fault


def grid_box(target: Sequence[int], frame: tuple[int, int], grid: int, size: int) -> list[int]:
    """A `size`-unit square centred on the centre of the `grid`-unit cell that holds the centre of `target` (all in
    the model's frame), shifted to lie inside `frame` (width, height), then grown to hold all of `target`."""
    box = []
    for axis, (lo, hi) in enumerate(((target[0], target[2]), (target[1], target[3]))):
        limit = frame[axis]
        centre = (int((lo + hi) / 2 // grid) + 0.5) * grid
        start = max(0, min(round(centre - size / 2), limit - size))
        box.append((min(start, lo), min(max(start + size, hi), limit)))
    (x1, x2), (y1, y2) = box
    return [x1, y1, x2, y2]


def region_box(target: Sequence[int], frame: tuple[int, int], margin: int) -> list[int]:
    """The cell of the 3x3 grid of `frame` (width, height) that holds the centre of `target` (`data.synthetic`'s
    `region_of`, the cell a `region_hint` question names), grown by `margin` on each side and cut to `frame`, then
    grown to hold all of `target` (all in the model's frame)."""
    width, height = frame
    x1, y1, x2, y2 = region_cell(region_of(target, width, height), width, height)
    return [
        min(max(x1 - margin, 0), target[0]),
        min(max(y1 - margin, 0), target[1]),
        max(min(x2 + margin, width), target[2]),
        max(min(y2 + margin, height), target[3]),
    ]


def seen_box(box: Sequence[int], image_size: tuple[int, int], seen: tuple[int, int]) -> list[int]:
    """A box in original pixels mapped into the model's frame `seen` (`ZoomInEnv.box_frame`: the image it sees, or
    the 1000 x 1000 relative grid), rounded outwards, so the crop the tool maps it back to always holds the whole box.
    Integer products divided once: exact, so a box touching the image's edge maps onto the frame's edge."""
    (width, height), (seen_w, seen_h) = image_size, seen
    return [
        math.floor(box[0] * seen_w / width),
        math.floor(box[1] * seen_h / height),
        math.ceil(box[2] * seen_w / width),
        math.ceil(box[3] * seen_h / height),
    ]


def replay_calls(row: dict, env: ZoomInEnv) -> list[dict]:
    """The calls of a converted trajectory (`row["gold_calls"]`, boxes in original pixels) in the model's frame
    (`seen_box` into `env.box_frame`), each replayed through the tool and kept with the dataset's own thought; a call
    the tool rejects (a label over its limits, a box it cannot crop) raises `ToolError`."""
    env.reset(**row)
    calls = []
    for call in row["gold_calls"]:
        bbox = seen_box(call["box"], env.image.size, env.box_frame)
        replay_call(env, TOOL_NAME, {"bbox_2d": bbox, "label": call["label"]})  # ToolError when refused
        calls.append({"bbox_2d": bbox, "label": env.calls[-1].label, "thought": call["thought"]})
    return calls


def plan_calls(
    row: dict,
    label: str,
    env: ZoomInEnv,
    num_calls: int,
    rng: np.random.Generator,
    args: TrajectoryArguments | None = None,
) -> list[dict]:
    """The gold zoom-in calls of `row` (`bbox_2d` in the model's frame, `env.box_frame`), at most `num_calls` of them:
    the target box mapped by `seen_box` (or its `grid_box` / `region_box`, by `args.gold_box`), after, for two calls,
    a miss of the same size whose crop does not touch the target (one call when there is no room for one). A missing
    or unusable `row["target_bbox"]` raises `ToolError`, as the tool would."""
    env.reset(**row)
    seen_w, seen_h = env.box_frame
    # min_side=0: the target as given, clamped to the image; the tool expands small boxes itself when it crops.
    target = crop_box(env.image.size, row.get("target_bbox"), min_side=0, max_aspect=env.config.max_aspect)
    gold = seen_box(target, env.image.size, env.box_frame)
    args = args or TrajectoryArguments()
    if args.gold_box == "grid":
        gold = grid_box(gold, (seen_w, seen_h), args.gold_box_grid, args.gold_box_size)
    elif args.gold_box == "region":
        gold = region_box(gold, (seen_w, seen_h), args.gold_box_margin)
    calls = [{"bbox_2d": gold, "label": label}]
    if num_calls < 2:
        return calls[:num_calls]
    box_w, box_h = gold[2] - gold[0], gold[3] - gold[1]
    for _ in range(MISS_ATTEMPTS):
        x, y = int(rng.integers(0, seen_w - box_w + 1)), int(rng.integers(0, seen_h - box_h + 1))
        miss = [x, y, x + box_w, y + box_h]
        seen = crop_box(
            env.image.size,
            miss,
            seen_size=env.box_frame,
            min_side=env.config.min_side,
            max_aspect=env.config.max_aspect,
        )
        if not boxes_overlap(seen, target):
            return [{"bbox_2d": miss, "label": label}, *calls]
    return calls


def build_gold_trajectories(
    dataset: datasets.Dataset,
    environment_factory: Callable[[], ZoomInEnv],
    args: TrajectoryArguments | None = None,
) -> tuple[datasets.Dataset, SynthesisStats]:
    """A gold trajectory planned for every usable row, and the counts. Each example is `{"messages", "images"}` (TRL's
    conversational vision format), rendered on access by `GoldTrajectoryRenderer` from the stored columns, `dataset`'s
    plus `calls` (read them through `.with_format(None)`): trainers must keep them (`remove_unused_columns=False`)."""
    args = args or TrajectoryArguments()
    env = environment_factory()
    stats, keep, plans = SynthesisStats(), [], []
    for index, row in enumerate(dataset):
        if "gold_calls" in row:  # a converted public trajectory: its own calls and thoughts, replayed
            try:
                plans.append(replay_calls(row, env))
            except ToolError:
                stats.skipped["gold_calls"] += 1
                continue
            stats.calls[len(plans[-1])] += 1
            keep.append(index)
            continue
        try:
            label = validate_label(row.get("target_label"), env.config.max_label_words, env.config.max_label_chars)
        except ToolError:
            stats.skipped["target_label"] += 1
            continue
        rng = np.random.default_rng([args.trajectory_seed, zlib.crc32(str(row["id"]).encode())])
        try:
            calls = plan_calls(row, label, env, int(rng.choice(3, p=args.call_mix)), rng, args)
        except ToolError:
            stats.skipped["target_bbox"] += 1
            continue
        stats.calls[len(calls)] += 1
        keep.append(index)
        plans.append([{**call, "thought": THINK_ZOOM if k == 0 else THINK_MISSED} for k, call in enumerate(calls)])
    logger.info("gold trajectories by number of zoom-in calls: %s", dict(sorted(stats.calls.items())))
    if stats.skipped:
        logger.warning(
            "skipped %d rows without a usable target, by column: %s", stats.skipped.total(), dict(stats.skipped)
        )
    if not keep:
        raise ValueError(f"no row of the dataset has a usable target box and label ({dict(stats.skipped)})")
    planned = dataset.select(keep).add_column("calls", plans, feature=CALLS_FEATURE)
    return planned.with_transform(GoldTrajectoryRenderer(environment_factory)), stats


class GoldTrajectoryRenderer:
    """`Dataset.with_transform` callable: planned rows in, `{"messages", "images"}` out, crops from the real tool."""

    def __init__(self, environment_factory: Callable[[], ZoomInEnv]):
        self.env = environment_factory()

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
        return {"messages": [self.messages(row) for row in rows], "images": [[row["image"]] for row in rows]}

    def messages(self, row: dict) -> list[dict]:
        """The row's prompt followed by its gold completion (assistant and tool turns, as TRL's tool loop writes them)."""
        self.env.reset(**row)
        messages = in_box_convention(row["prompt"], self.env.box_convention, self.env.config.tools)
        for call in row["calls"]:
            arguments = {"bbox_2d": call["bbox_2d"], "label": call["label"]}
            tool_call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
            content = f"<think>{call['thought']}</think>"
            messages.append({"role": "assistant", "content": content, "tool_calls": [tool_call]})
            try:
                observation = replay_call(self.env, TOOL_NAME, arguments)
            except ToolError as err:  # planning validated the call: a failure here is a bug, not bad data
                raise RuntimeError(f"gold call {call} of row {row.get('id')} failed: {err}") from err
            messages.append({"role": "tool", "name": TOOL_NAME, "content": observation})
        think = row.get("final_thought") or (THINK_SEEN if row["calls"] else THINK_NO_ZOOM)
        messages.append({"role": "assistant", "content": f"<think>{think}</think><answer>{row['answer']}</answer>"})
        return messages
