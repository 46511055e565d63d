"""The tiny CLIP against the verifier gate in the two worlds it serves (issue 60, item 1): the demo's (the tiny SFT
recipe's 600-900 px images) and the learning-curve experiment's (768 px squares). Each world's held-out rows are made
by the demo's stages; the gate is `evaluation.verifier_check.check_verifier` with the tool and budget of the kit's
policy, as `research.experiment.verifier_gate` runs it, under both scorings.

    python -m research.clip_gate --clip outputs/tiny/clip_trained --output outputs/clip_lab/kit.json
    python -m research.clip_gate --train outputs/clip_lab/base --train_args steps=300
    python -m research.clip_gate --world --train outputs/clip_lab/W2 --train_args rows=1000 steps=600

`--train` trains a CLIP first and gates it: `tiny.clip.train_clip` (`make clip`'s drawn crops), or with `--world`
`train_on_world` (crops the tool cuts from the worlds' own rows, as the gate cuts them); keyword overrides as
`key=value`, Python literals. The lever table is research/reports/clip_gate.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from configs import ToolConfig
from data.benchmarks import load_saved_split
from data.synthetic import build_synthetic
from data.trajectories import TrajectoryArguments
from evaluation.verifier_check import check_verifier, gold_crops, miss_crops
from rewards.verifiers import build_verifier
from tiny import stages
from tiny.clip import METRICS_NAME, multi_positive_loss, train_clip
from tiny.kit import build_clip
from tools import make_environment_factory
from utils.models import CLIP_CONFIG_NAME, load_clip, load_processor, pixel_budget, save_clip

WORLDS = {"demo": {}, "curves": {"min_size": 768, "max_size": 768}}  # `build_synthetic` keywords over the SFT recipe's
SCORES = ("cosine", "contrastive")


def world_data(root: Path, world: str, rows: int) -> Path:
    """The world's held-out rows (test split, seed 0), made once under `root`."""
    path = root / f"data_{world}_{rows}"
    if not (path / "dataset_dict.json").exists():
        stages.make_data(path, 1, rows, **WORLDS[world])
    return path


def gate_world(clip: Path, data: Path, rows: int) -> dict:
    """`check_verifier` of `clip` on `data`'s first `rows` test rows, per scoring, as plain dicts."""
    kit = stages.tiny_kit()
    budget = pixel_budget(load_processor(kit["policy"]))
    tool = ToolConfig(clip_model=str(clip)).resolved(budget)
    test = list(load_saved_split(str(data), "test").select(range(rows)))
    results = check_verifier(
        build_verifier("clip", tool), test, make_environment_factory(tool, budget), semantic_scores=SCORES
    )
    return {how: r.as_dict() for how, r in results.items()}


def world_pool(rows: int, seed: int) -> tuple[list, list[str], list]:
    """Training crops cut as the gate cuts them, from `rows` fresh rows per world (train split, `seed`, never the
    gate's test rows): each row's gold region crop with its target label, and its miss crop as (row index, crop)."""
    kit = stages.tiny_kit()
    budget = pixel_budget(load_processor(kit["policy"]))
    tool = ToolConfig(clip_model=str(kit["clip"])).resolved(budget)
    make_env = make_environment_factory(tool, budget)
    crops, labels, misses = [], [], []
    for world in WORLDS:
        data = build_synthetic(rows, seed=seed, split="train", **(stages.recipe_world() | WORLDS[world]))
        calls, scenes = gold_crops(list(data), make_env, TrajectoryArguments(gold_box="region"))
        crops += [c.crop for c in calls]
        labels += [c.label for c in calls]
        offset = len(crops) - len(calls)
        misses += [(offset + i, m.crop) for i, m in enumerate(miss_crops(calls, scenes, make_env)) if m is not None]
    return crops, labels, misses


def train_on_world(
    output_dir: Path,
    rows: int = 400,
    steps: int = 600,
    batch: int = 48,
    lr: float = 4e-3,
    warmup: float = 0.1,
    seed: int = 0,
    miss_per_batch: int = 8,
    paired: bool = False,
    walk_margin: float = 0.0,
    resize: str = "pad",
    image_size: int | None = None,
    width: int | None = None,
) -> dict:
    """The kit's CLIP trained on `world_pool` crops: each step `batch` gold crops and `miss_per_batch` miss crops
    against the batch's distinct labels, a crop positive for exactly the labels equal to its own (as the gate
    counts), by `multi_positive_loss`; warm-up then cosine decay, as `train_clip`."""
    start = time.perf_counter()
    crops, labels, misses = world_pool(rows, seed + 1)
    pool_seconds = time.perf_counter() - start
    init = stages.tiny_kit()["clip"]
    if image_size or width:  # a fresh kit-shaped CLIP with another image tower (the kit's seed)
        init = Path(output_dir) / "init"
        build_clip(init, seed=0, image_size=image_size or 64, width=width or 8)
    config = json.loads((Path(init) / CLIP_CONFIG_NAME).read_text(encoding="utf-8"))
    model, preprocess, tokenizer = load_clip(init, resize=resize)
    model.requires_grad_(True).train()
    model.token_embedding.requires_grad_(False)
    pixels = torch.stack([preprocess(c) for c in crops])
    miss_pixels = torch.stack([preprocess(c) for _, c in misses])
    miss_of = {row: k for k, (row, _) in enumerate(misses)}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = np.random.default_rng([seed, 0])
    losses = []
    for step in range(steps):
        done = step / steps
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, done / warmup) * 0.5 * (1 + math.cos(math.pi * done))
        pick = rng.choice(len(crops), size=batch, replace=False)
        names = sorted({labels[i] for i in pick})
        positives = torch.tensor(
            [[labels[i] == n for n in names] for i in pick] + [[False] * len(names)] * miss_per_batch
        )
        if paired:  # the picked rows' own miss crops: a hard negative of a label the batch holds, as the walk scores
            own = [miss_of[i] for i in pick if i in miss_of]
            chosen = [own[j] for j in rng.choice(len(own), size=min(miss_per_batch, len(own)), replace=False)]
        else:
            chosen = list(rng.choice(len(misses), size=miss_per_batch, replace=False))
        positives = positives[: batch + len(chosen)]
        images = torch.cat([pixels[pick], miss_pixels[chosen]])
        image = torch.nn.functional.normalize(model.encode_image(images), dim=-1)
        text = torch.nn.functional.normalize(model.encode_text(tokenizer(names)), dim=-1)
        loss = multi_positive_loss(model.logit_scale.exp() * image @ text.T, positives)
        if walk_margin and paired:  # the walk itself: the own label's cosine on the gold crop above its miss crop's
            where = {int(row): p for p, row in enumerate(pick)}
            rows_ = [misses[k][0] for k in chosen]
            gold = torch.stack([image[where[r]] for r in rows_])
            own = text[[names.index(labels[r]) for r in rows_]]
            gap = (gold * own).sum(-1) - (image[batch:] * own).sum(-1)
            loss = loss + torch.relu(walk_margin - gap).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        losses.append(loss.item())
    model.eval().requires_grad_(False)
    metrics = dict(
        initial_loss=float(np.mean(losses[:10])), final_loss=float(np.mean(losses[-10:])), steps=steps,
        crops=len(crops), misses=len(misses), pool_seconds=round(pool_seconds, 1),
        seconds=round(time.perf_counter() - start, 1), clip_resize=resize,
    )  # fmt: skip
    save_clip(model, output_dir, config["model_cfg"], config["preprocess_cfg"])
    (Path(output_dir) / METRICS_NAME).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def summary_line(name: str, gates: dict) -> str:
    """One line per world and scoring: talk AUC, right z vs best constant, walk AUC, pass."""
    out = []
    for world, results in gates.items():
        for how, r in results.items():
            out.append(
                f"{name} {world:6} {how:11} auc {r['auc']:.3f} right {r['right_z']:+.3f} vs {r['best_constant']!r} "
                f"{r['best_constant_z']:+.3f} walk {r['walk_auc']:.3f} {'PASS' if r['passed'] else 'fail'}"
            )
    return "\n".join(out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip", type=Path, help="a trained CLIP directory to gate")
    parser.add_argument("--train", type=Path, help="train a CLIP into this directory first, then gate it")
    parser.add_argument("--train_args", nargs="*", default=[], help="train_clip keywords, key=value")
    parser.add_argument("--world", action="store_true", help="--train on the worlds' own crops (train_on_world)")
    parser.add_argument("--rows", type=int, default=64, help="held-out rows per world (the experiment's gate_rows)")
    parser.add_argument("--data_root", type=Path, default=Path("outputs/clip_lab"))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report: dict = {}
    clip = args.clip
    if args.train:
        kwargs = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in args.train_args)}
        start = time.perf_counter()
        if args.world:
            report["training"] = train_on_world(args.train, **kwargs)
        else:
            kwargs.setdefault("steps", 300)
            report["training"] = train_clip(args.train, init=stages.tiny_kit()["clip"], **kwargs)
        report["train_seconds"] = round(time.perf_counter() - start, 1)
        report["train_args"] = args.train_args
        clip = args.train
    report["clip"] = str(clip)
    report["gate"] = {w: gate_world(clip, world_data(args.data_root, w, args.rows), args.rows) for w in WORLDS}
    print(summary_line(clip.name, report["gate"]))
    if "training" in report:
        print(f"train {report['train_seconds']} s")
    output = args.output or (clip / "gate.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
