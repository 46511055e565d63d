"""Ground-truth verifiers of z_t for the experiment's world, where every row knows its target: controlled upper bounds
and their information controls, named by import path (`semantic_verifier: research.verifiers:exact_walk`). Each
factory takes `(tool_config, device, seed)`, as `rewards.verifiers.VERIFIERS` entries do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from data.task import normalize
from research.rewards import target_in_view
from rewards.verifiers import Scene, build_verifier
from tools import ZoomCall
from utils.registry import reads_columns

GROUND_TRUTH = ("target_bbox", "target_label")


class ExactVerifier:
    """A controlled upper bound for experiments, not a model: z_t = 1 when the label names the row's target (its
    `target_label`, compared by `data.task.normalize`) and the crop frames that target (`target_in_view`: the box holds
    it and is a zoom), else 0. It reads only the call's label and box and the scene's ground truth, never the answer.
    A label other than the target's scores 0 even if it names something else in the crop: the scene's ground truth
    is the target alone."""

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = []
        for call, scene in zip(calls, scenes, strict=True):
            named = normalize(call.label) == normalize(scene.target_label or "")
            values.append(float(named and target_in_view(call, scene.target_bbox, scene.image.size)))
        return torch.tensor(values, dtype=torch.float32)


class WalkVerifier:
    """The walk half of `ExactVerifier`, a control for a policy that cannot yet name what it looks for: z_t = 1 when
    the call's crop frames the row's target (`target_in_view`), whatever the label says, else 0. It reads only the
    call's box and the scene's target box. It tells MAPO where the policy looked, not whether the label grounded, so
    an experiment that gains with it shows that the coupling uses an informative z_t, not that labels ground."""

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = [float(target_in_view(c, s.target_bbox, s.image.size)) for c, s in zip(calls, scenes, strict=True)]
        return torch.tensor(values, dtype=torch.float32)


class ShuffledVerifier:
    """The information control: another verifier's scores, permuted across the calls of each scored batch. The
    batch holds the same z_t values (so the same advantage sizes) but a rollout's z_t no longer says anything about
    its own calls. The permutation is seeded by (seed, how many batches were scored), so a rerun repeats it."""

    def __init__(self, base, seed: int):
        self.base, self.seed, self.batches = base, seed, 0

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = self.base.score(calls, scenes)
        order = np.random.default_rng([self.seed, self.batches]).permutation(len(values))
        self.batches += 1
        return values[torch.from_numpy(order)]


class MeanVerifier:
    """The density control: every scored call gets the mean of another verifier's scores over the scored batch (the
    valid calls of one generation batch; unscorable ones left out and kept NaN). The batch pays the same total bonus as
    the base verifier would, spread as a constant over every valid call: a bonus for calling at all, of the walk
    arm's density, with nothing about which call framed the target (`research.gradient_stats`' `C_valid`, per batch)."""

    def __init__(self, base):
        self.base = base

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = self.base.score(calls, scenes)
        scored = ~torch.isnan(values)
        return torch.where(scored, values[scored].mean(), values) if scored.any() else values


class CentredVerifier:
    """Another verifier's scores minus their mean over the scored batch (the valid calls of one generation batch;
    unscorable ones left out): the same ranking of calls with no bonus or penalty for calling at all. Under
    `semantic_score: contrastive` the trainer scores the crops and the whole images in two batches, and the
    difference of two centred scores is the centred difference."""

    def __init__(self, base):
        self.base = base

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        values = self.base.score(calls, scenes)
        scored = ~torch.isnan(values)
        return values - values[scored].mean() if scored.any() else values


@reads_columns(*GROUND_TRUTH)
def exact(config, device, seed) -> ExactVerifier:
    """z_t = 1 when the label names the target and the crop frames it (`ExactVerifier`)."""
    return ExactVerifier()


@reads_columns(*GROUND_TRUTH)
def shuffled_exact(config, device, seed) -> ShuffledVerifier:
    """`exact`'s scores permuted across each batch's calls: same sizes, no information."""
    return ShuffledVerifier(ExactVerifier(), seed)


@reads_columns("target_bbox")
def exact_walk(config, device, seed) -> WalkVerifier:
    """z_t = 1 when the crop frames the target, whatever the label (`WalkVerifier`)."""
    return WalkVerifier()


@reads_columns("target_bbox")
def shuffled_exact_walk(config, device, seed) -> ShuffledVerifier:
    """`exact_walk`'s scores permuted across each batch's calls: same sizes, no information."""
    return ShuffledVerifier(WalkVerifier(), seed)


@reads_columns("target_bbox")
def walk_density(config, device, seed) -> MeanVerifier:
    """`exact_walk`'s batch mean on every valid call (`MeanVerifier`): the walk arm's density, no information."""
    return MeanVerifier(WalkVerifier())


def clip_centred(config, device, seed) -> CentredVerifier:
    """The recipe's CLIP verifier (`clip_model`), centred on each scored batch (`CentredVerifier`)."""
    return CentredVerifier(build_verifier("clip", config, device, seed))
