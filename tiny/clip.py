"""Train the tiny CLIP verifier on synthetic (crop, referent label) pairs, so that its z_t means something in the demo
(a random CLIP scores every pair alike, which makes R_sem noise). About a minute on a CPU.

Crops are drawn by `data.synthetic`'s own code and labelled as zoom-in calls label them: with the question's
*referent*, what the model expects to see before it zooms ("the diamond", "the green object", "the sign", "the yellow
squares", "the red star and the blue circle"), never the answer. One crop can match several labels and a missed
zoom's none, so a batch holds each label once (a caption repeated in a contrastive batch makes its own crops negatives
of each other), one crop drawn for each, plus bare-background crops that are only ever negatives (no label rewards
zooming at nothing); which crops match which labels is known (`Referent.matches`, distractors included); and the loss
is a multi-positive InfoNCE. The objects fill 10-70% of a crop's side (the tiny recipes' grid box frames a target at
~15%, a tight box at ~70%).

    python -m scripts.train_clip --output_dir outputs/tiny/clip_trained --steps 300   (make clip)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from data import synthetic
from tiny.kit import kit_paths
from utils.models import CLIP_CONFIG_NAME, load_clip, save_clip

KIT_CLIP = kit_paths("outputs/tiny")["clip"]  # the random-weight CLIP `make tiny` builds: where training starts
METRICS_NAME = "training_metrics.json"
CANVAS = 768  # one cluttered background per batch, every crop of the batch a window of it
OBJECT_SIZE = (12, 32)  # object side in canvas pixels before the CLIP transform resizes the crop
EXTENT = (0.1, 0.7)  # the objects' extent as a fraction of the crop side
MAX_DISTRACTORS = 2  # per crop
KINDS = ("shape", "colour", "sign", "group", "pair")

Obj = tuple[str, str | None]  # (shape, colour), or (word, None) for a sign


@dataclass(frozen=True)
class Referent:
    """A zoom label and the objects it names: `shape` and/or `colour` (None: any), a sign, or two of them."""

    kind: str  # one of KINDS
    shape: str | None = None
    colour: str | None = None
    other: Referent | None = None  # the second object of a pair

    @property
    def label(self) -> str:
        if self.kind == "sign":
            return synthetic.SIGN_LABEL
        if self.kind == "pair":
            return f"{_single(self).label} and {self.other.label}"
        return synthetic.referent_label(self.shape, self.colour, plural=self.kind == "group")

    def names(self, obj: Obj) -> bool:
        """Whether this (single-object) referent names `obj`."""
        shape, colour = obj
        if self.kind == "sign":
            return colour is None
        return colour is not None and self.shape in (None, shape) and self.colour in (None, colour)

    def matches(self, objects: Sequence[Obj]) -> bool:
        """Whether a crop holding `objects` shows this referent (a pair: both of its objects)."""
        if self.kind == "pair":
            return any(_single(self).names(o) for o in objects) and any(self.other.names(o) for o in objects)
        return any(self.names(o) for o in objects)

    def objects(self, rng: np.random.Generator, colours: Sequence[str], shapes: Sequence[str], words) -> list[Obj]:
        """Objects to draw for this referent, the unnamed attributes drawn at random."""
        if self.kind == "sign":
            return [(str(words[int(rng.integers(len(words)))]), None)]
        if self.kind == "pair":
            return _single(self).objects(rng, colours, shapes, words) + self.other.objects(rng, colours, shapes, words)
        shape = self.shape or str(shapes[int(rng.integers(len(shapes)))])
        colour = self.colour or str(colours[int(rng.integers(len(colours)))])
        return [(shape, colour)] * (int(rng.integers(2, 7)) if self.kind == "group" else 1)


def _single(pair: Referent) -> Referent:
    """The first object of a pair, as a referent of its own."""
    return Referent("single", pair.shape, pair.colour)


def referents(colours: Sequence[str], shapes: Sequence[str]) -> dict[str, list[Referent]]:
    """Every referent the synthetic questions use, by kind: "the <shape>" (colour questions), "the <colour> object"
    (shape questions), the sign (reading questions), "the <colour> <shape>s" (counting) and "the <colour> <shape>
    and the <colour> <shape>" (position)."""
    singles = [Referent("single", s, c) for c in colours for s in shapes]
    return {
        "shape": [Referent("shape", shape=s) for s in shapes],
        "colour": [Referent("colour", colour=c) for c in colours],
        "sign": [Referent("sign")],
        "group": [Referent("group", s, c) for c in colours for s in shapes],
        "pair": [Referent("pair", a.shape, a.colour, b) for a in singles for b in singles if a.colour != b.colour],
    }


def _paste(crop: Image.Image, sprite: Image.Image, region, boxes: list, rng, gap: int = 0) -> bool:
    """Paste `sprite` at a random place of `region` clear of `boxes` (by `gap`), recording its box; False if 30 tries
    found no such place."""
    x0, y0, x1, y1 = region
    if sprite.width > x1 - x0 or sprite.height > y1 - y0:
        return False
    for _ in range(30):
        x = int(rng.integers(x0, x1 - sprite.width + 1))
        y = int(rng.integers(y0, y1 - sprite.height + 1))
        box = (x, y, x + sprite.width, y + sprite.height)
        if synthetic.is_free(box, boxes, gap):
            crop.paste(sprite, box[:2], sprite)
            boxes.append(box)
            return True
    return False


def render_crops(
    targets: Sequence[Sequence[Obj]], rng: np.random.Generator, distractors: Sequence[Obj] = ()
) -> tuple[list[Image.Image], list[list[Obj]]]:
    """One crop per entry of `targets` (the objects to show; empty: bare background), each a random window of one
    shared background, its objects grouped in a square spanning a random `EXTENT` of the window side, plus up to
    `MAX_DISTRACTORS` objects drawn from `distractors` around them. Returns the crops and the objects really drawn
    in each (targets and distractors)."""
    canvas = synthetic.render_background(CANVAS, CANVAS, rng)
    crops, drawn = [], []
    for objects in targets:
        size = int(rng.integers(*OBJECT_SIZE, endpoint=True))
        sprites = [synthetic.render_object(content, size, colour) for content, colour in objects]
        cell = max([size, *(sprite.width for sprite in sprites)])
        per_side = math.ceil(math.sqrt(max(1, len(sprites))))
        group = cell * (2 * per_side - 1)  # room for a cluster with gaps; one object fills it
        side = min(CANVAS, max(group + 4, round(group / rng.uniform(*EXTENT))))
        x, y = (int(v) for v in rng.integers(0, CANVAS - side, size=2, endpoint=True))
        crop = canvas.crop((x, y, x + side, y + side))
        gx, gy = (int(v) for v in rng.integers(0, side - group, size=2, endpoint=True))
        boxes: list[tuple[int, int, int, int]] = []
        region = (gx, gy, gx + group, gy + group)
        shown = [obj for obj, sprite in zip(objects, sprites) if _paste(crop, sprite, region, boxes, rng)]
        for _ in range(int(rng.integers(0, MAX_DISTRACTORS + 1)) if distractors else 0):
            obj = distractors[int(rng.integers(len(distractors)))]
            sprite = synthetic.render_object(obj[0], size, obj[1])
            if _paste(crop, sprite, (0, 0, side, side), boxes, rng, gap=size // 2):
                shown.append(obj)
        crops.append(crop)
        drawn.append(shown)
    return crops, drawn


@dataclass
class Batch:
    """One training (or evaluation) batch: crops, labels, and which crop shows which label."""

    crops: list[Image.Image]
    labels: list[str]
    kinds: list[str]  # the kind of referent each crop was drawn for ("empty" for bare background)
    positives: torch.Tensor  # (crops, labels) bool: crop i shows label j


def make_batch(
    pool: dict[str, list[Referent]], per_kind: dict[str, int], empty: int, rng: np.random.Generator,
    colours: Sequence[str], shapes: Sequence[str], words: Sequence[str],
) -> Batch:  # fmt: skip
    """A batch of distinct referent labels (`per_kind[k]` of each kind k, all of them when the kind has fewer), one
    crop drawn for each, plus `empty` crops of bare background."""
    chosen = []
    for kind, items in pool.items():
        k = min(per_kind.get(kind, len(items)), len(items))
        chosen += [items[j] for j in sorted(rng.choice(len(items), size=k, replace=False))]
    targets = [r.objects(rng, colours, shapes, words) for r in chosen] + [[]] * empty
    distractors = [(s, c) for c in colours for s in shapes] + [(w, None) for w in words[:4]]
    crops, drawn = render_crops(targets, rng, distractors)
    positives = torch.tensor([[r.matches(objects) for r in chosen] for objects in drawn], dtype=torch.bool)
    kinds = [r.kind for r in chosen] + ["empty"] * empty
    return Batch(crops, [r.label for r in chosen], kinds, positives)


def multi_positive_loss(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE with several positives: -log of the softmax mass on the positives, for every crop that has
    one (over labels) and every label that has one (over crops), averaged over the two directions. Crops and labels
    without a positive only serve as negatives of the others."""
    masked = logits.masked_fill(~positives, float("-inf"))
    rows, cols = positives.any(dim=1), positives.any(dim=0)
    image_loss = (logits.logsumexp(dim=1) - masked.logsumexp(dim=1))[rows].mean()
    text_loss = (logits.logsumexp(dim=0) - masked.logsumexp(dim=0))[cols].mean()
    return (image_loss + text_loss) / 2


def _encode(model, preprocess, tokenizer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([preprocess(crop) for crop in batch.crops])
    return (
        F.normalize(model.encode_image(images), dim=-1),
        F.normalize(model.encode_text(tokenizer(batch.labels)), dim=-1),
    )


@torch.no_grad()
def retrieval_accuracy(model, preprocess, tokenizer, batches: Sequence[Batch]) -> dict[str, float]:
    """Held-out metrics over `batches`: per kind of referent, `top1_<kind>`, the fraction of crops whose most similar
    label of the batch is one they show; `z_pos` / `z_neg`, the mean cosine of (crop, label) pairs that match / do not;
    and `z_empty_max`, the mean over bare-background crops of their highest cosine with any label."""
    was_training = model.training
    model.eval()
    hits: dict[str, list[float]] = {}
    pos, neg, empty = [], [], []
    for batch in batches:
        image, text = _encode(model, preprocess, tokenizer, batch)
        cosine = image @ text.T
        best = cosine.argmax(dim=1)
        for i, kind in enumerate(batch.kinds):
            if kind == "empty":
                empty.append(cosine[i].max().item())
            else:
                hits.setdefault(kind, []).append(float(batch.positives[i, best[i]]))
        pos.append(cosine[batch.positives])
        neg.append(cosine[~batch.positives])
    model.train(was_training)
    metrics = {f"top1_{kind}": float(np.mean(h)) for kind, h in sorted(hits.items())}
    metrics |= {"z_pos": torch.cat(pos).mean().item(), "z_neg": torch.cat(neg).mean().item()}
    if empty:
        metrics["z_empty_max"] = float(np.mean(empty))
    return metrics


def warmup_cosine(lr: float, done: float, warmup: float) -> float:
    """The learning rate `done` of the way through a run: a linear rise to `lr` over the first `warmup` fraction, then
    cosine decay to zero (without the warm-up, 5e-3 collapses)."""
    return lr * min(1.0, done / warmup) * 0.5 * (1 + math.cos(math.pi * done))


def save_trained(model, output_dir: str | os.PathLike, config: dict, metrics: dict) -> None:
    """`model` saved to `output_dir` in `init`'s layout (`config`: its `CLIP_CONFIG_NAME` JSON), with `metrics`."""
    save_clip(model, output_dir, config["model_cfg"], config["preprocess_cfg"])
    (Path(output_dir) / METRICS_NAME).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


def train_clip(
    output_dir: str | os.PathLike, *, init: str | os.PathLike = KIT_CLIP, seconds: float = 60.0,
    steps: int | None = None, seed: int = 0, lr: float = 4e-3, warmup: float = 0.1,
    colours: Sequence[str] = tuple(synthetic.COLOURS), shapes: Sequence[str] = synthetic.SHAPES,
    words: Sequence[str] = synthetic.WORDS, per_kind: dict[str, int] | None = None, empty: int = 4,
    eval_batches: int = 10, resize: str = "pad",
) -> dict[str, float | int]:  # fmt: skip
    """Train the open_clip model in `init` (a `save_clip` directory) and save it to `output_dir` in the same layout.

    Trains for `steps` optimizer steps when given (then bit-reproducible for a given `seed` and thread count), else for
    `seconds` of wall-clock time. Each step is one `make_batch`: `per_kind` referents of each kind (default: all of
    the shape, colour and sign kinds, 8 groups, 4 pairs) and `empty` background crops. AdamW's learning rate rises
    linearly to `lr` over the first `warmup` fraction of the run, then decays to zero. `resize` fits crops to CLIP's
    input (`ToolConfig.clip_resize`), in training and evaluation alike, as the verifier will fit RL's crops. Returns
    (and writes to `output_dir/training_metrics.json`) `retrieval_accuracy` on `eval_batches` fresh batches, the mean
    loss of the first and last ten steps, the steps taken, the seconds and the `clip_resize` used.
    """
    config = json.loads((Path(init) / CLIP_CONFIG_NAME).read_text(encoding="utf-8"))
    model, preprocess, tokenizer = load_clip(init, resize=resize)  # the eval transform the verifier applies to crops
    model.requires_grad_(True).train()
    # The token embedding is 6.3 M of the 7 M parameters, and the labels use a few dozen of its rows: training it
    # costs a tenth of every step and did not speed up learning.
    model.token_embedding.requires_grad_(False)
    pool = referents(colours, shapes)
    per_kind = {"group": 8, "pair": 4} | (per_kind or {})
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = np.random.default_rng([seed, 0])
    losses: list[float] = []
    start = time.perf_counter()

    def progress() -> float:  # the fraction of the run done, in steps when they are given, else in seconds
        return len(losses) / steps if steps is not None else (time.perf_counter() - start) / seconds

    while (done := progress()) < 1:
        # Warm-up, then cosine decay to zero over the run, whatever its length.
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(lr, done, warmup)
        batch = make_batch(pool, per_kind, empty, rng, colours, shapes, words)
        image, text = _encode(model, preprocess, tokenizer, batch)
        loss = multi_positive_loss(model.logit_scale.exp() * image @ text.T, batch.positives)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # as open_clip's trainer does: a temperature past 100 destabilises the loss
            model.logit_scale.clamp_(0, math.log(100))
        losses.append(loss.item())
    elapsed = time.perf_counter() - start
    model.eval().requires_grad_(False)
    eval_rng = np.random.default_rng([seed, 1])
    held_out = [make_batch(pool, per_kind, empty, eval_rng, colours, shapes, words) for _ in range(eval_batches)]
    metrics: dict[str, float | int] = retrieval_accuracy(model, preprocess, tokenizer, held_out)
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    metrics |= dict(
        initial_loss=first, final_loss=last, steps=len(losses), seconds=round(elapsed, 1), clip_resize=resize
    )
    save_trained(model, output_dir, config, metrics)
    return metrics
