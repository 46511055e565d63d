"""The tiny CLIP against the verifier gate in the two worlds it serves (issue 60, item 1): the demo's (the tiny SFT
recipe's 600-900 px images) and the learning-curve experiment's (768 px squares). Each world's held-out rows are made
by the demo's stages; the gate is `evaluation.verifier_check.check_verifier` with the tool and budget of the kit's
policy, as `research.experiment.verifier_gate` runs it, under both scorings.

    python -m research.clip_gate --clip outputs/tiny/clip_trained --output outputs/clip_lab/kit.json
    python -m research.clip_gate --train outputs/clip_lab/base --train_args steps=300
    python -m research.clip_gate --world --train outputs/clip_lab/W2 --train_args rows=1000 steps=600
    python -m research.clip_gate --world --walk --by_kind --train outputs/clip_lab/Y7 --train_args rows=1000 \
        steps=900 shifted=2 flip=True ignore_implied=True
    python -m research.clip_gate --world --gold_box tight --train outputs/clip_lab/T1 --train_args miss_per_batch=8

`--train` trains a CLIP first and gates it: `tiny.clip.train_clip` (`make clip`'s drawn crops), or with `--world`
`train_on_world` (crops the tool cuts from the worlds' own rows, as the gate cuts them; `--walk`:
`train_walk_on_world`, the walk within each image too); keyword overrides as `key=value`, Python literals.
`--by_kind` adds the walk per label kind beside a reader of pixels. `--gold_box tight` trains and gates on the crops
of the target's own box, which the tiny policy does not cut: a probe of where the gate fails, not the gate. The lever
table is research/reports/clip_gate.md.
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
from data.synthetic import COLOURS, SHAPES, SIGN_LABEL, build_synthetic, referent_label
from data.trajectories import TrajectoryArguments, seen_box
from evaluation.verifier_check import gold_crops, miss_crops, score_gate
from rewards.verifiers import Scene, build_verifier
from tiny import stages
from tiny.clip import multi_positive_loss, save_trained, train_clip, warmup_cosine
from tiny.kit import build_clip
from tools import boxes_overlap, make_environment_factory
from utils.models import CLIP_CONFIG_NAME, load_clip, load_processor, pixel_budget

WORLDS = {"demo": {}, "curves": {"min_size": 768, "max_size": 768}}  # `build_synthetic` keywords over the SFT recipe's
SCORES = ("cosine", "contrastive")


def world_data(root: Path, world: str, rows: int) -> Path:
    """The world's held-out rows (test split, seed 0), made once under `root`."""
    path = root / f"data_{world}_{rows}"
    if not (path / "dataset_dict.json").exists():
        stages.make_data(path, 1, rows, **WORLDS[world])
    return path


def gate_world(clip: Path, data: Path, rows: int, gold_box: str = "region") -> dict:
    """`check_verifier` of `clip` on `data`'s first `rows` test rows, per scoring, as plain dicts; the gold crops cut
    with `gold_box` (`TrajectoryArguments`: the tiny SFT recipe's `region`, or `tight` to ask what a target filling
    the crop would change)."""
    kit = stages.tiny_kit()
    budget = pixel_budget(load_processor(kit["policy"]))
    tool = ToolConfig(clip_model=str(clip)).resolved(budget)
    test = list(load_saved_split(str(data), "test").select(range(rows)))
    make_env = make_environment_factory(tool, budget)
    calls, scenes = cut_gold(test, make_env, gold_box)
    results = score_gate(build_verifier("clip", tool), calls, scenes, make_env, SCORES, None)
    return {how: r.as_dict() for how, r in results.items()}


def cut_gold(rows: list[dict], make_env, gold_box: str) -> tuple[list, list]:
    """Per row, the tool's gold crop and its `Scene`, as `gold_crops` cuts them: `gold_box` "region" (the tiny SFT
    recipe's) or "tight" (`TrajectoryArguments`), or a number: a square of that many original pixels centred on the
    target, grown to hold it and moved inside the image (the crop a finer hint grid would have the policy cut)."""
    if not gold_box.isdigit():
        return gold_crops(rows, make_env, TrajectoryArguments(gold_box=gold_box))
    calls, scenes = [], []
    for row in rows:
        env = make_env()
        env.reset(**row)
        box = framing_box(row["target_bbox"], env.image.size, int(gold_box))
        env.image_zoom_in_tool(bbox_2d=seen_box(box, env.image.size, env.box_frame), label=row["target_label"])
        if env.calls[-1].ok:
            calls.append(env.calls[-1])
            scenes.append(Scene(env.image, row["target_bbox"], row["target_label"]))
    return calls, scenes


def framing_box(target: list[float], image_size: tuple[int, int], side: int) -> tuple[int, int, int, int]:
    """A square of `side` pixels (each side at least the target's, at most the image's) centred on `target`, moved
    inside the image."""
    (width, height), (x1, y1, x2, y2) = image_size, target
    w, h = min(max(side, math.ceil(x2 - x1)), width), min(max(side, math.ceil(y2 - y1)), height)
    left = min(max(round((x1 + x2 - w) / 2), 0), width - w)
    top = min(max(round((y1 + y2 - h) / 2), 0), height - h)
    return left, top, left + w, top + h


def world_pool(
    rows: int, seed: int, own_misses: int = 0, shifted: int = 0, gold_box: str = "region"
) -> tuple[list, list[str], list, list]:
    """Training crops cut as the gate cuts them, from `rows` fresh rows per world (train split, `seed`, never the
    gate's test rows): each row's gold region crop with its target label; its miss crops as (row index, crop), the
    gate's corner miss first, then `own_misses` more of the same size at random places that miss the target; and
    per row `shifted` crops of the gold box's size at random places that hold the whole target (its label's positives
    in other surroundings). `gold_box` as the gate's (`gate_world`)."""
    kit = stages.tiny_kit()
    budget = pixel_budget(load_processor(kit["policy"]))
    tool = ToolConfig(clip_model=str(kit["clip"])).resolved(budget)
    make_env = make_environment_factory(tool, budget)
    rng = np.random.default_rng(seed)
    crops, labels, misses, variants = [], [], [], []
    for world in WORLDS:
        data = build_synthetic(rows, seed=seed, split="train", **(stages.recipe_world() | WORLDS[world]))
        calls, scenes = cut_gold(list(data), make_env, gold_box)
        for call, scene, corner in zip(calls, scenes, miss_crops(calls, scenes, make_env), strict=True):
            row = len(crops)
            crops.append(call.crop)
            labels.append(call.label)
            variants.append([c.crop for c in same_size_crops(call, scene, make_env, shifted, rng, hold=True)])
            extra = same_size_crops(call, scene, make_env, own_misses, rng, hold=False)
            misses += [(row, c.crop) for c in ([corner] if corner is not None else []) + extra]
    return crops, labels, misses, variants


def same_size_crops(call, scene, make_env, count: int, rng: np.random.Generator, hold: bool) -> list:
    """Up to `count` tool calls cutting crops of `call`'s box size at uniform random places in `scene`'s image that hold the whole
    target (`hold`) or share no area with it; a miss gets 40 draws to find its places."""
    (width, height), (w, h) = scene.image.size, (call.box[2] - call.box[0], call.box[3] - call.box[1])
    target = [int(v) for v in scene.target_bbox]
    if hold:  # the box's left edge between the target's right edge minus w and its left edge, inside the image
        xs, ys = (
            (max(0, target[2] - w), min(target[0], width - w)),
            (max(0, target[3] - h), min(target[1], height - h)),
        )
    else:
        xs, ys = (0, width - w), (0, height - h)
    out, env = [], make_env()
    if count == 0 or xs[0] > xs[1] or ys[0] > ys[1]:
        return out
    for _ in range(count if hold else 40):
        if len(out) >= count:
            break
        x, y = int(rng.integers(xs[0], xs[1] + 1)), int(rng.integers(ys[0], ys[1] + 1))
        box = (x, y, x + w, y + h)
        if not hold and boxes_overlap(box, scene.target_bbox):
            continue
        env.reset(image=scene.image)
        env.image_zoom_in_tool(bbox_2d=seen_box(box, env.image.size, env.box_frame), label=call.label)
        cut = env.calls[-1]
        if cut.ok and (hold or not boxes_overlap(cut.box, scene.target_bbox)):
            out.append(cut)
    return out


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
    gold_box: str = "region",
) -> dict:
    """The kit's CLIP trained on `world_pool` crops: each step `batch` gold crops and `miss_per_batch` miss crops
    against the batch's distinct labels, a crop positive for exactly the labels equal to its own (as the gate
    counts), by `multi_positive_loss`; warm-up then cosine decay, as `train_clip`."""
    start = time.perf_counter()
    crops, labels, misses, _ = world_pool(rows, seed + 1, gold_box=gold_box)
    pool_seconds = time.perf_counter() - start
    model, preprocess, tokenizer, config = trainable_clip(output_dir, resize, image_size, width)
    pixels = torch.stack([preprocess(c) for c in crops])
    miss_pixels = torch.stack([preprocess(c) for _, c in misses])
    miss_of = {row: k for k, (row, _) in enumerate(misses)}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = np.random.default_rng([seed, 0])
    losses = []
    for step in range(steps):
        done = step / steps
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(lr, done, warmup)
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
    save_trained(model, output_dir, config, metrics)
    return metrics


def train_walk_on_world(
    output_dir: Path,
    rows: int = 400,
    steps: int = 600,
    batch: int = 48,
    lr: float = 4e-3,
    warmup: float = 0.1,
    seed: int = 0,
    miss_per_batch: int = 24,
    own_misses: int = 3,
    walk_rows: int = 16,
    walk_weight: float = 1.0,
    shifted: int = 0,
    flip: bool = False,
    sigmoid: float = 0.0,
    ignore_implied: bool = False,
    constant_margin: float = 0.0,
    resize: str = "pad",
    image_size: int | None = None,
    width: int | None = None,
    gold_box: str = "region",
) -> dict:
    """`train_on_world`'s loss (random miss crops as negatives of every label) plus the walk itself, within one image:
    for `walk_rows` rows a step, the own label's softmax over its gold crop and that row's miss crops (the corner and
    `own_misses` random ones), the gold crop the positive. A gold crop is drawn among the row's own and its `shifted`
    crops; `flip` mirrors half the step's crops; `sigmoid` weighs SigLIP's pairwise sigmoid loss (a learnt temperature
    and bias, every crop-label pair's absolute cosine, as the gate compares them) over the step's crops and labels.
    `ignore_implied` leaves out of the talk loss each pair whose crop's own label implies the label (`implies`: "the
    green crosses" shows a green object and a cross), which the gate counts wrong and the crop shows. `constant_margin`
    hinges each label's mean cosine on the step's gold crops it does not name (nor is implied by) below the crops' own
    labels' mean cosine by that margin: the gate's "no fixed label above the right one", which the softmax leaves free
    (a label's scores over crops can all rise together)."""
    start = time.perf_counter()
    crops, labels, misses, variants = world_pool(rows, seed + 1, own_misses, shifted, gold_box)
    pool_seconds = time.perf_counter() - start
    model, preprocess, tokenizer, config = trainable_clip(output_dir, resize, image_size, width)
    golds = [torch.stack([preprocess(c) for c in [crop, *more]]) for crop, more in zip(crops, variants, strict=True)]
    miss_pixels = torch.stack([preprocess(c) for _, c in misses])
    misses_of: dict[int, list[int]] = {}
    for k, (row, _) in enumerate(misses):
        misses_of.setdefault(row, []).append(k)
    walkable = sorted(misses_of)
    sig_scale, sig_bias = torch.nn.Parameter(torch.tensor(math.log(10.0))), torch.nn.Parameter(torch.tensor(-10.0))
    trained = [p for p in model.parameters() if p.requires_grad] + ([sig_scale, sig_bias] if sigmoid else [])
    optimizer = torch.optim.AdamW(trained, lr=lr)
    rng = np.random.default_rng([seed, 0])
    losses, walk_losses = [], []
    for step in range(steps):
        done = step / steps
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(lr, done, warmup)
        pick = rng.choice(len(crops), size=batch, replace=False)
        walked = rng.choice(walkable, size=walk_rows, replace=False)
        names = sorted({labels[i] for i in pick} | {labels[i] for i in walked})
        negatives = rng.choice(len(misses), size=miss_per_batch, replace=False)
        own = [misses_of[i] for i in walked]
        images = torch.cat([
            torch.stack([golds[i][int(rng.integers(len(golds[i])))] for i in pick]), miss_pixels[negatives],
            torch.stack([golds[i][int(rng.integers(len(golds[i])))] for i in walked]),
            miss_pixels[[k for ks in own for k in ks]],
        ])  # fmt: skip
        if flip:
            mirrored = torch.from_numpy(rng.random(len(images)) < 0.5)
            images = torch.where(mirrored[:, None, None, None], images.flip(-1), images)
        image = torch.nn.functional.normalize(model.encode_image(images), dim=-1)
        text = torch.nn.functional.normalize(model.encode_text(tokenizer(names)), dim=-1)
        talked = batch + miss_per_batch
        positives = torch.tensor(
            [[labels[i] == n for n in names] for i in pick] + [[False] * len(names)] * miss_per_batch
        )
        scale = model.logit_scale.exp()
        logits = scale * image[:talked] @ text.T
        if ignore_implied:
            implied = torch.tensor([[implies(labels[i], n) and labels[i] != n for n in names] for i in pick])
            logits = logits.masked_fill(
                torch.cat([implied, torch.zeros(miss_per_batch, len(names), dtype=torch.bool)]), float("-inf")
            )
        loss = multi_positive_loss(logits, positives)
        if constant_margin:
            cosine = image[:batch] @ text.T
            wrong = ~positives[:batch] & (~implied if ignore_implied else True)
            right = cosine[positives[:batch]].mean()
            named = wrong.any(0)
            off = (cosine * wrong).sum(0)[named] / wrong.sum(0)[named]
            loss = loss + torch.relu(off - right + constant_margin).mean()
        gold, rest, terms, at = image[talked : talked + walk_rows], image[talked + walk_rows :], [], 0
        for r, (i, ks) in enumerate(zip(walked, own, strict=True)):
            logits = scale * torch.cat([gold[r : r + 1], rest[at : at + len(ks)]]) @ text[names.index(labels[i])]
            at += len(ks)
            terms.append(torch.nn.functional.cross_entropy(logits[None], torch.zeros(1, dtype=torch.long)))
        walk = torch.stack(terms).mean()
        loss = loss + walk_weight * walk
        if sigmoid:
            every = torch.cat([
                positives, torch.tensor([[labels[i] == n for n in names] for i in walked]),
                torch.zeros(len(image) - talked - walk_rows, len(names), dtype=torch.bool),
            ])  # fmt: skip
            z = sig_scale.exp() * image @ text.T + sig_bias
            loss = loss + sigmoid * -torch.nn.functional.logsigmoid(torch.where(every, z, -z)).sum(1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        losses.append(loss.item())
        walk_losses.append(walk.item())
    model.eval().requires_grad_(False)
    metrics = dict(
        initial_loss=float(np.mean(losses[:10])), final_loss=float(np.mean(losses[-10:])),
        initial_walk_loss=float(np.mean(walk_losses[:10])), final_walk_loss=float(np.mean(walk_losses[-10:])),
        steps=steps, crops=len(crops), misses=len(misses), pool_seconds=round(pool_seconds, 1),
        seconds=round(time.perf_counter() - start, 1), clip_resize=resize,
    )  # fmt: skip
    save_trained(model, output_dir, config, metrics)
    return metrics


def implies(shown: str, label: str) -> bool:
    """Whether a crop framing `shown`'s objects shows what the generic `label` names: a colour-only label ("the green
    object") by any object of its colour, a shape-only one ("the cross") by any of its shape, one or more."""
    words, kind = set(shown.split()), label_kind(label)
    named = label.split()[1]  # "the green object" -> green, "the cross" -> cross
    if kind == "colour":
        return named in words
    return kind == "shape" and bool({named, referent_label(named, plural=True).split()[-1]} & words)


def trainable_clip(output_dir: Path, resize: str, image_size: int | None, width: int | None):
    """The kit's CLIP, or a fresh kit-shaped one with another image tower (the kit's seed), ready to train; with its
    config, for `save_clip`."""
    init = stages.tiny_kit()["clip"]
    if image_size or width:
        init = Path(output_dir) / "init"
        build_clip(init, seed=0, image_size=image_size or 64, width=width or 8)
    config = json.loads((Path(init) / CLIP_CONFIG_NAME).read_text(encoding="utf-8"))
    model, preprocess, tokenizer = load_clip(init, resize=resize)
    model.requires_grad_(True).train()
    model.token_embedding.requires_grad_(False)
    return model, preprocess, tokenizer, config


def label_kind(label: str) -> str:
    """The kind of a world's zoom label (`data.synthetic.referent_label`): `sign`, `pair` (two objects), `group` (a
    count's plural), `colour` (colour only: "the green object") or `shape` (shape only: "the triangle")."""
    last = label.split()[-1]
    if label == SIGN_LABEL:
        return "sign"
    if " and " in label:
        return "pair"
    return "shape" if last in SHAPES else "colour" if last == "object" else "group"


def pixel_score(crop, label: str) -> float:
    """A verifier that reads pixels, not words: for a label naming colours, the crop's pixels within 60 (RGB distance)
    of a named colour; else its object pixels (a channel below 150, which the background never has). The walk's
    ceiling for a reader of colour alone."""
    pixels = np.asarray(crop.convert("RGB"), dtype=float)
    named = [word for word in label.split() if word in COLOURS]
    if not named:
        return float((pixels.min(-1) < 150).sum())
    return float(sum((np.linalg.norm(pixels - np.array(COLOURS[c]), axis=-1) < 60).sum() for c in named))


def walk_by_kind(
    clip: Path, rows: list[dict], resize: str = "pad", gold_box: str = "region"
) -> dict[str, dict[str, float]]:
    """Per label kind, the walk (P(label's z on its gold crop > on the gate's miss crop), ties half) of `clip` under
    cosine and of `pixel_score`, on `rows` cut as the gate cuts them; with the crops counted."""
    kit = stages.tiny_kit()
    budget = pixel_budget(load_processor(kit["policy"]))
    make_env = make_environment_factory(ToolConfig(clip_model=str(clip)).resolved(budget), budget)
    model, preprocess, tokenizer = load_clip(clip, resize=resize)
    calls, scenes = cut_gold(rows, make_env, gold_box)
    wins: dict[str, dict[str, list[float]]] = {}
    for call, miss in zip(calls, miss_crops(calls, scenes, make_env), strict=True):
        if miss is None:
            continue
        with torch.no_grad():
            image = torch.nn.functional.normalize(
                model.encode_image(torch.stack([preprocess(call.crop), preprocess(miss.crop)])), dim=-1
            )
            text = torch.nn.functional.normalize(model.encode_text(tokenizer([call.label])), dim=-1)[0]
        scores = {
            "clip": (image @ text).tolist(),
            "pixels": [pixel_score(c, call.label) for c in (call.crop, miss.crop)],
        }
        kind = wins.setdefault(label_kind(call.label), {"clip": [], "pixels": []})
        for how, (gold, missed) in scores.items():
            kind[how].append(1.0 if gold > missed else 0.5 if gold == missed else 0.0)
    return {
        kind: {"crops": len(w["clip"]), **{how: round(float(np.mean(v)), 3) for how, v in w.items()}}
        for kind, w in sorted(wins.items())
    }


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
    parser.add_argument(
        "--walk", action="store_true", help="with --world: the walk within each image too (train_walk_on_world)"
    )
    parser.add_argument(
        "--by_kind", action="store_true", help="also the walk per label kind, held-out and training rows"
    )
    parser.add_argument(
        "--gold_box",
        default="region",
        help="the gate's gold crops: the recipes' region; tight, or a square side in pixels round the target, are "
        "probes, not the gate",
    )
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
        if args.world:  # trained on the crops it is gated on
            kwargs.setdefault("gold_box", args.gold_box)
            report["training"] = (train_walk_on_world if args.walk else train_on_world)(args.train, **kwargs)
        else:
            kwargs.setdefault("steps", 300)
            report["training"] = train_clip(args.train, init=stages.tiny_kit()["clip"], **kwargs)
        report["train_seconds"] = round(time.perf_counter() - start, 1)
        report["train_args"] = args.train_args
        clip = args.train
    report["clip"] = str(clip)
    data = {w: world_data(args.data_root, w, args.rows) for w in WORLDS}
    report["gold_box"] = args.gold_box
    report["gate"] = {w: gate_world(clip, data[w], args.rows, args.gold_box) for w in WORLDS}
    print(summary_line(clip.name, report["gate"]))
    if args.by_kind:  # the training rows: the first of the pool's (train split, seed 1), as the trainers draw them
        report["walk_by_kind"] = {
            w: {
                "held_out": walk_by_kind(
                    clip,
                    list(load_saved_split(str(data[w]), "test").select(range(args.rows))),
                    gold_box=args.gold_box,
                ),
                "training": walk_by_kind(
                    clip,
                    list(build_synthetic(args.rows, seed=1, split="train", **(stages.recipe_world() | WORLDS[w]))),
                    gold_box=args.gold_box,
                ),
            }
            for w in WORLDS
        }
        for w, sets in report["walk_by_kind"].items():
            for which, kinds in sets.items():
                print(
                    f"{w:6} {which:8} "
                    + " | ".join(
                        f"{k} n={v['crops']} clip {v['clip']:.2f} pixels {v['pixels']:.2f}" for k, v in kinds.items()
                    )
                )
    if "training" in report:
        print(f"train {report['train_seconds']} s")
    output = args.output or (clip / "gate.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
