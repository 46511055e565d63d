"""The verifier gate (docs/evaluation.md, "The verifier gate"): does z_t reward the right label where it is, or a
label that fits everything? **Talk**: on a crop, is the right label preferred to wrong ones and to any fixed label (a
fixed label that wins invites label hacking, which the paper's label-length limits do not stop)? **Walk**: is a
label's crop of its target preferred to a crop of the same image that misses it (else z_t pays for naming the target
wherever the policy looks)?

Gold crops are cut by the tool itself with SFT's gold box (`data.trajectories.plan_calls`), so at the sizes RL
produces; on a converted cold-start set (`check_converted`) each labelled call is its own target, replayed as SFT
replays it. Under "contrastive" (`mapo.scale_similarity`) each label's whole-image score is subtracted from its miss
crop's score as from its gold crop's, so the walk axis reads as under "cosine".

`python -m evaluation.verifier_check --data DIR_OR_FILE --clip_model PATH` runs the gate on a saved dataset (a
converted set, or rows with `target_bbox` and `target_label`) and prints the figures (`--output`: as JSON too). It
scores crops x labels pairs, so `--limit` keeps a large set's cost in hand.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import datasets
import numpy as np
import torch

from data.benchmarks import load_saved_split
from data.trajectories import TrajectoryArguments, plan_calls, seen_box
from mapo import SEMANTIC_SCORES, scale_similarity
from rewards.verifiers import Scene, build_verifier
from tools import ZoomCall, ZoomInEnv, boxes_overlap, make_environment_factory
from utils.recipes import real_recipe_budget

MIN_AUC = 0.75
DATA_LABEL_SOURCES = ("dataset",)  # a converted call's `label_source` when the release itself gave the label


@dataclass(frozen=True)
class GateResult:
    """The gate's figures for one `semantic_score`. Ties count half in every comparison."""

    semantic_score: str
    rows: int  # gold crops: one per row, or per labelled call of a converted set
    labels: int
    auc: float  # talk: P(z of the right label > z of a wrong one on the same crop), over every pair; 0.5 is chance
    mean_rank: float  # the right label's mean rank among all labels on its crop (1 = best)
    right_z: float  # the right label's mean z
    best_constant: str  # the label whose mean z over all crops is highest
    best_constant_z: float  # that mean
    constant_wins: float  # the fraction of crops where that fixed label beats the right one
    passed: bool  # auc >= MIN_AUC, right_z > best_constant_z and walk_auc >= MIN_AUC
    # After `passed`, with defaults, so results written before the walk axis (and positional callers) still load.
    # walk: P(z(right label, gold crop) > z(right label, miss crop)), paired within each crop; 0.5 is chance, and for
    # a binary verifier right on each crop with probability q, independently, it is q (q*q + 2q(1 - q)/2).
    walk_auc: float = math.nan
    walk_rows: int = 0  # the crops that have a miss crop
    walk_left_out: int = 0  # those where no same-size box inside the image misses the target

    def as_dict(self) -> dict:
        return asdict(self)


def gold_crops(
    rows: Sequence[dict], make_env: Callable[[], ZoomInEnv], trajectory_args: TrajectoryArguments
) -> tuple[list[ZoomCall], list[Scene]]:
    """Per row, the tool's crop for the row's gold call (one call, `plan_calls`) and the row's `Scene`; a row whose
    call the tool rejects is left out."""
    calls, scenes = [], []
    rng = np.random.default_rng(0)  # plan_calls draws only for misses, which one call never has
    for row in rows:
        env = make_env()
        (call,) = plan_calls(row, row["target_label"], env, 1, rng, trajectory_args)
        env.image_zoom_in_tool(**call)
        if env.calls[-1].ok:
            calls.append(env.calls[-1])
            scenes.append(Scene(env.image, row["target_bbox"], row["target_label"]))
    return calls, scenes


def miss_box(
    image_size: tuple[int, int], target_bbox: Sequence[float], gold_box: Sequence[int]
) -> tuple[int, int, int, int] | None:
    """A box of `gold_box`'s size inside the image that shares no area with `target_bbox` (one frame, exclusive ends):
    of the corner placements that miss the target, the one whose centre is farthest from the target's (ties: top-left,
    top-right, bottom-left, bottom-right); None when none misses. Corners lose nothing: a box misses the target when it
    lies wholly left, right, above or below it, which holds at the extreme of one coordinate if anywhere."""
    width, height = image_size
    w, h = gold_box[2] - gold_box[0], gold_box[3] - gold_box[1]
    if w > width or h > height:
        return None
    centre = ((target_bbox[0] + target_bbox[2]) / 2, (target_bbox[1] + target_bbox[3]) / 2)
    corners = [(x, y, x + w, y + h) for y in (0, height - h) for x in (0, width - w)]
    misses = [box for box in corners if not boxes_overlap(box, target_bbox)]
    if not misses:
        return None
    # max keeps the first of equals, so the tie order above holds
    return max(misses, key=lambda b: ((b[0] + b[2]) / 2 - centre[0]) ** 2 + ((b[1] + b[3]) / 2 - centre[1]) ** 2)


def miss_crops(
    calls: Sequence[ZoomCall], scenes: Sequence[Scene], make_env: Callable[[], ZoomInEnv]
) -> list[ZoomCall | None]:
    """Per gold crop, the tool's crop of its `miss_box` (placed around the scene's `target_bbox`, the size of the
    gold crop's box, original pixels), called with the gold call's label; None where no box misses the target, or
    where the tool's rounding into the frame the model sees grows the box onto it."""
    env, out = make_env(), []
    for call, scene in zip(calls, scenes, strict=True):
        box = miss_box(scene.image.size, scene.target_bbox, call.box)
        if box is None:
            out.append(None)
            continue
        env.reset(image=scene.image)
        env.image_zoom_in_tool(bbox_2d=seen_box(box, env.image.size, env.box_frame), label=call.label)
        miss = env.calls[-1]
        out.append(miss if miss.ok and not boxes_overlap(miss.box, scene.target_bbox) else None)
    return out


def _score(verifier, calls: Sequence[ZoomCall], scenes: Sequence[Scene], batch_size: int | None) -> torch.Tensor:
    """`verifier.score` in batches of `batch_size` pairs (None: one batch), so a large gate never stacks every crop
    in memory at once."""
    step = batch_size or max(len(calls), 1)
    parts = [verifier.score(calls[i : i + step], scenes[i : i + step]) for i in range(0, len(calls), step)]
    return torch.cat([torch.as_tensor(p).reshape(-1) for p in parts]).double() if parts else torch.zeros(0).double()


def score_matrix(
    verifier, calls: Sequence[ZoomCall], scenes: Sequence[Scene], labels: Sequence[str], whole: bool, batch_size=None
):
    """z of every label (columns) against every crop (rows), or against each crop's whole image when `whole`; the
    verifier scores `batch_size` pairs at a time (None: all at once)."""
    pairs = [
        (s.whole_image_call(relabelled) if whole else relabelled, s)
        for c, s in zip(calls, scenes)
        for relabelled in (replace(c, label=label) for label in labels)
    ]
    values = _score(verifier, [p for p, _ in pairs], [s for _, s in pairs], batch_size)
    return values.reshape(len(calls), len(labels))


def walk_auc(framing: torch.Tensor, miss: torch.Tensor) -> float:
    """P(z on the crop that frames the target > z on the miss crop), paired element by element, a tie counting half;
    NaN when there are no pairs."""
    if len(framing) == 0:
        return float("nan")
    return float(((framing > miss).double() + 0.5 * (framing == miss).double()).mean())


def gate(
    z: torch.Tensor, right: Sequence[int], labels: Sequence[str], semantic_score: str,
    walk: tuple[torch.Tensor, torch.Tensor] | None = None, walk_left_out: int = 0,
) -> GateResult:  # fmt: skip
    """The gate's figures from a (crops x labels) matrix of z and each crop's right-label column; `walk` is (z of the
    right label on its gold crop, on its miss crop) for the crops that have a miss crop. Without `walk` the walk
    axis is unmeasured (NaN) and the gate does not pass."""
    n, k = z.shape
    right = torch.as_tensor(right)
    right_z = z[torch.arange(n), right]
    others = torch.ones_like(z, dtype=torch.bool)
    others[torch.arange(n), right] = False
    wins = (right_z[:, None] > z).double() + 0.5 * (right_z[:, None] == z).double()
    auc = float(wins[others].mean()) if k > 1 else float("nan")
    rank = 1 + (z > right_z[:, None]).sum(dim=1).double() + 0.5 * ((z == right_z[:, None]) & others).sum(dim=1)
    constant = int(z.mean(dim=0).argmax())
    constant_wins = float((z[:, constant] > right_z).double().mean())
    best_z, mean_right = float(z[:, constant].mean()), float(right_z.mean())
    walked = walk_auc(*walk) if walk is not None else float("nan")
    return GateResult(
        semantic_score=semantic_score, rows=n, labels=k, auc=auc, mean_rank=float(rank.mean()), right_z=mean_right,
        best_constant=labels[constant], best_constant_z=best_z, constant_wins=constant_wins,
        passed=bool(auc >= MIN_AUC and mean_right > best_z and walked >= MIN_AUC),
        walk_auc=walked, walk_rows=len(walk[0]) if walk is not None else 0, walk_left_out=walk_left_out,
    )  # fmt: skip


def score_gate(
    verifier, calls: Sequence[ZoomCall], scenes: Sequence[Scene], make_env: Callable[[], ZoomInEnv],
    semantic_scores: Sequence[str], batch_size: int | None,
) -> dict[str, GateResult]:  # fmt: skip
    """The gate of `verifier` on gold crops `calls` (each scene's `target_label` its right label, every scene's label a
    wrong one for the others) and their `miss_crops`, per `semantic_score`."""
    misses = miss_crops(calls, scenes, make_env)
    labels = sorted({s.target_label for s in scenes})
    right = torch.tensor([labels.index(s.target_label) for s in scenes])
    crop_z = score_matrix(verifier, calls, scenes, labels, whole=False, batch_size=batch_size)
    contrastive = "contrastive" in semantic_scores
    whole_z = score_matrix(verifier, calls, scenes, labels, whole=True, batch_size=batch_size) if contrastive else None
    walked = torch.tensor([i for i, miss in enumerate(misses) if miss is not None], dtype=torch.long)
    miss_z = _score(verifier, [misses[i] for i in walked], [scenes[i] for i in walked], batch_size)
    results = {}
    for how in semantic_scores:
        z = scale_similarity(crop_z, how, whole_z if how == "contrastive" else None)
        # the miss crop's label is its gold crop's right label: the same whole-image score is subtracted from both
        whole = whole_z[walked, right[walked]] if how == "contrastive" else None
        framing, miss = z[walked, right[walked]], scale_similarity(miss_z, how, whole)
        results[how] = gate(z, right, labels, how, walk=(framing, miss), walk_left_out=len(calls) - len(walked))
    return results


def check_verifier(
    verifier, rows: Sequence[dict], make_env: Callable[[], ZoomInEnv],
    trajectory_args: TrajectoryArguments | None = None, semantic_scores: Sequence[str] = ("cosine", "contrastive"),
    batch_size: int | None = None,
) -> dict[str, GateResult]:  # fmt: skip
    """The gate of `verifier` on `rows` (with `image`, `target_bbox`, `target_label`), per `semantic_score`; the
    verifier scores `batch_size` pairs at a time (None: each matrix at once)."""
    calls, scenes = gold_crops(rows, make_env, trajectory_args or TrajectoryArguments(gold_box="region"))
    if not calls:
        raise ValueError("check_verifier: the tool rejected every row's gold call; nothing to score")
    return score_gate(verifier, calls, scenes, make_env, semantic_scores, batch_size)


def converted_crops(
    rows: Sequence[dict], make_env: Callable[[], ZoomInEnv], label_sources: Sequence[str] = DATA_LABEL_SOURCES
) -> tuple[list[ZoomCall], list[Scene], dict]:
    """Per call of converted rows (`gold_calls`, `data.convert`) whose `label_source` is in `label_sources`, the
    tool's crop of the call's box, mapped into the frame the model sees as SFT maps it (`replay_calls`), and a
    `Scene` taking that box and label as the target. Also the counts: `rows_read`, `calls_read`, `calls_used`,
    `calls_rejected` (the tool rejects the call), and `calls_skipped` by label source (`"none"`: an empty label)."""
    env, calls, scenes = make_env(), [], []
    counts = {"rows_read": 0, "calls_read": 0, "calls_used": 0, "calls_rejected": 0}
    skipped = Counter()
    for row in rows:
        counts["rows_read"] += 1
        env.reset(**row)
        for given in row["gold_calls"]:
            counts["calls_read"] += 1
            label = given.get("label") or ""
            source = (given.get("label_source") or "unknown") if label.strip() else "none"
            if source not in label_sources:
                skipped[source] += 1
                continue
            env.image_zoom_in_tool(bbox_2d=seen_box(given["box"], env.image.size, env.box_frame), label=label)
            if not env.calls[-1].ok:
                counts["calls_rejected"] += 1
                continue
            counts["calls_used"] += 1
            calls.append(env.calls[-1])
            scenes.append(Scene(env.image, tuple(given["box"]), env.calls[-1].label))
    counts["calls_skipped"] = dict(sorted(skipped.items()))
    return calls, scenes, counts


def check_converted(
    verifier, rows: Sequence[dict], make_env: Callable[[], ZoomInEnv],
    semantic_scores: Sequence[str] = ("cosine", "contrastive"), label_sources: Sequence[str] = DATA_LABEL_SOURCES,
    batch_size: int | None = None,
) -> tuple[dict[str, GateResult], dict]:  # fmt: skip
    """The gate of `verifier` on a converted cold-start set's calls (`converted_crops`: each call's own box is its
    target, its dataset label its right label, the other calls' labels its wrong ones), per `semantic_score`; and
    `converted_crops`' counts."""
    calls, scenes, counts = converted_crops(rows, make_env, label_sources)
    if not calls:
        raise ValueError(f"check_converted: no call with a label from {list(label_sources)} to score ({counts})")
    return score_gate(verifier, calls, scenes, make_env, semantic_scores, batch_size), counts


def load_rows(path: str | Path, split: str = "train", limit: int | None = None) -> datasets.Dataset:
    """The first `limit` rows (None: all) of a saved dataset: a `save_to_disk` folder (its `split`), or one Parquet
    or Arrow file written by `datasets`."""
    path = Path(path)
    if path.is_dir():
        data = load_saved_split(path, split)
    elif path.suffix == ".parquet":
        data = datasets.Dataset.from_parquet(str(path))
    elif path.suffix == ".arrow":
        data = datasets.Dataset.from_file(str(path))
    else:
        raise ValueError(f"--data: {path} is neither a save_to_disk folder nor a .parquet or .arrow file")
    return data.select(range(min(limit, len(data)))) if limit is not None else data


# The table's columns: a heading, the `GateResult` field shown and its format; then the verdict.
_COLUMNS = (
    ("semantic_score", "semantic_score", "{}"), ("crops", "rows", "{}"), ("labels", "labels", "{}"),
    ("talk AUC", "auc", "{:.3f}"), ("mean rank", "mean_rank", "{:.2f}"), ("right z", "right_z", "{:.4f}"),
    ("best constant label", "best_constant", "{!r}"), ("its z", "best_constant_z", "{:.4f}"),
    ("it wins", "constant_wins", "{:.2f}"), ("walk AUC", "walk_auc", "{:.3f}"), ("walk crops", "walk_rows", "{}"),
    ("left out", "walk_left_out", "{}"),
)  # fmt: skip


def format_table(results: dict[str, GateResult]) -> str:
    """The figures as a plain-text table, one line per `semantic_score`."""
    table = [[heading for heading, _, _ in _COLUMNS] + ["gate"]]
    for r in results.values():
        table.append([form.format(getattr(r, name)) for _, name, form in _COLUMNS] + ["pass" if r.passed else "FAIL"])
    widths = [max(len(cell) for cell in column) for column in zip(*table)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="save_to_disk folder, or a .parquet/.arrow file")
    parser.add_argument("--split", default="train", help="the folder's split (converted sets: train)")
    parser.add_argument("--clip_model", required=True, help="open_clip model name, or a local directory")
    parser.add_argument("--clip_pretrained", default="openai", help="open_clip tag; ignored for a local directory")
    parser.add_argument("--verifier", default="clip", help="a verifier name or import path (semantic_verifier)")
    parser.add_argument("--semantic_score", nargs="+", default=["cosine", "contrastive"], choices=SEMANTIC_SCORES)
    parser.add_argument("--limit", type=int, default=None, help="score the first N rows only")
    parser.add_argument("--label_sources", nargs="+", default=list(DATA_LABEL_SOURCES),
                        help="converted sets: the label sources scored (derived: thought, question)")  # fmt: skip
    parser.add_argument("--max_pixels", type=int, default=None, help="image budget (default: the RL recipes')")
    parser.add_argument("--batch_size", type=int, default=256, help="pairs the verifier scores at a time")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", type=Path, default=None, help="also write the figures here as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    """`python -m evaluation.verifier_check`: the gate on a saved dataset, printed as a table (and written as JSON
    with `--output`); returns what it writes."""
    args = parse_args(argv)
    tool, budget = real_recipe_budget(args.max_pixels)  # crops at the sizes the real RL recipes show
    tool = replace(tool, clip_model=args.clip_model, clip_pretrained=args.clip_pretrained)
    make_env = make_environment_factory(tool, budget)
    rows = load_rows(args.data, args.split, args.limit)
    verifier = build_verifier(args.verifier, tool, args.device)
    if "gold_calls" in rows.column_names:
        results, counts = check_converted(
            verifier, rows, make_env, args.semantic_score, args.label_sources, args.batch_size
        )
    elif {"target_bbox", "target_label"} <= set(rows.column_names):
        results = check_verifier(
            verifier, rows, make_env, semantic_scores=args.semantic_score, batch_size=args.batch_size
        )
        counts = {"rows_read": len(rows)}
    else:
        raise SystemExit(
            f"--data: {args.data} has neither `gold_calls` (a converted set) nor `target_bbox` and `target_label` "
            f"columns; it has {rows.column_names}"
        )
    report = {"data": str(args.data), "verifier": args.verifier, "clip_model": args.clip_model, "counts": counts,
              "min_auc": MIN_AUC, "results": {how: r.as_dict() for how, r in results.items()}}  # fmt: skip
    print(json.dumps(counts))
    print(format_table(results))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
