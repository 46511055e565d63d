"""The statistics of `research.gradient_claims`, pure and model-free: how close batch policy gradients lie to the
gradient of the true quality Q*, and how much they vary, computed from the Gram matrix of score vectors.

Every estimator's batch gradient is linear in the same score vectors s_j (one per step of a rollout: the gradient of
the trainer's loss term without its advantage): g_b = sum_{j in b} A_j s_j / n_b. So every inner product this module
needs is a quadratic form of the Gram matrix K = S S^T, and collapses to the prompt level: with M_a the (steps x
prompts) matrix holding step j's coefficient a_j in its prompt's column, h_p = sum_{j in p} a_j s_j is prompt p's
gradient contribution and H_ab = M_a^T K M_b their products (`prompt_products`). Everything below then works on
(prompts x prompts) matrices: a bootstrap over prompts costs nothing next to the gradients.

Conventions: rollouts are ordered group by group (G consecutive rollouts per prompt), as TRL orders them; a batch is
`batch_prompts` consecutive prompts of one fold; the reference gradient of a fold is built from the other folds'
prompts only (cross-fitting), so a batch is never scored against a reference that contains it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A verdict is one of these, decided by the rules in `better_verdict` and `prop2_cosine_verdict`.
HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
SIGMAS = 2.0  # a difference counts when it exceeds this many (bootstrap) standard errors


# --------------------------------------------------------------------------------------------------- rewards
def loo_advantages(rewards: np.ndarray, group: int) -> np.ndarray:
    """The leave-one-out baseline's advantages, no std division: r_i - mean_{j != i} r_j over each group of `group`
    consecutive rollouts (unbiased for the policy gradient of E[r], since the baseline does not depend on r_i)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group)
    others = (r.sum(axis=1, keepdims=True) - r) / (group - 1)
    return (r - others).reshape(-1)


def group_advantages(rewards: np.ndarray, group: int) -> np.ndarray:
    """A_i = r_i - mean of its group (r-bar includes r_i), no std division: the paper's group baseline."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group)
    return (r - r.mean(axis=1, keepdims=True)).reshape(-1)


@dataclass(frozen=True)
class RewardMoments:
    """Proposition 1 at the reward level, on sampled rewards in groups of `group`: `mu` and `sigma2` (the plug-in
    mean and variance over all rollouts), `rho` (the intra-group correlation: the mean product of two different
    rollouts' deviations from `mu` in one group, over `sigma2`), `lhs` = mean (r_i - r-bar)^2 and `rhs` = (1 - 1/G)
    (1 - rho) sigma^2. With these plug-in moments the two sides are equal as an identity: `lhs == rhs` checks the
    formula, not the data."""

    group: int
    mu: float
    sigma2: float
    rho: float
    lhs: float
    rhs: float

    @property
    def predicted_ratio(self) -> float:
        """The variance of group-baseline advantages over that of the raw rewards (no baseline), (1 - 1/G)(1 - rho)
        sigma^2 / (sigma^2 + mu^2): the gradient variance ratio if score vectors were independent of the rewards
        and of equal size."""
        second = self.sigma2 + self.mu**2
        return self.rhs / second if second > 0 else float("nan")


def reward_moments(rewards: np.ndarray, group: int) -> RewardMoments:
    """`RewardMoments` of `rewards` (rollouts ordered group by group)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group)
    mu = float(r.mean())
    dev = r - mu
    sigma2 = float((dev**2).mean())
    pairs = (dev.sum(axis=1) ** 2 - (dev**2).sum(axis=1)).sum() / (r.shape[0] * group * (group - 1))
    rho = float(pairs / sigma2) if sigma2 > 0 else float("nan")
    lhs = float(((r - r.mean(axis=1, keepdims=True)) ** 2).mean())
    rhs = (1 - 1 / group) * (1 - rho) * sigma2 if sigma2 > 0 else 0.0
    return RewardMoments(group, mu, sigma2, rho, lhs, rhs)


# --------------------------------------------------------------------------------------------------- gradients
def prompt_products(
    gram: np.ndarray, step_prompt: np.ndarray, a: np.ndarray, b: np.ndarray, prompts: int
) -> np.ndarray:
    """H_ab = M_a^T K M_b (prompts x prompts): the inner products of every prompt's gradient contribution under
    coefficients `a` with every prompt's under `b` (`a`, `b`: one coefficient per step; `step_prompt`: each step's
    prompt; `gram`: K, the score vectors' Gram matrix)."""
    steps = len(step_prompt)
    mb = np.zeros((steps, prompts))
    mb[np.arange(steps), step_prompt] = b
    kb = gram @ mb
    out = np.zeros((prompts, prompts))
    np.add.at(out, step_prompt, a[:, None] * kb)
    return out


@dataclass(frozen=True)
class Products:
    """One estimator's prompt-level products: `own` = H_aa and `cross` = H_a,ref (with the reference's
    coefficients), and the reference's own `ref` = H_ref,ref."""

    own: np.ndarray
    cross: np.ndarray
    ref: np.ndarray


def cosine(dot: float, norm2_a: float, norm2_b: float) -> float:
    """dot / (|a| |b|); 0 when either vector is zero (a zero step makes no progress)."""
    return dot / math.sqrt(norm2_a * norm2_b) if norm2_a > 0 and norm2_b > 0 else 0.0


def batches_of(prompts: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive, disjoint batches of `size` prompts (a remainder is dropped)."""
    return [list(prompts[i : i + size]) for i in range(0, len(prompts) - size + 1, size)]


@dataclass(frozen=True)
class Draw:
    """Which prompts one computation uses: per fold, its prompts in batch order (with repeats in a bootstrap
    replicate). The reference of fold f is the mean over every other fold's prompts."""

    folds: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(fold_of: np.ndarray, rng: np.random.Generator | None = None) -> Draw:
        """The sample itself (`rng` None: each fold's prompts in order), or a stratified bootstrap replicate: each
        fold's prompts drawn with replacement within the fold, in random order (so batches pair at random)."""
        folds = []
        for f in range(int(fold_of.max()) + 1):
            members = np.flatnonzero(fold_of == f)
            if rng is not None:
                members = rng.choice(members, size=len(members), replace=True)
            folds.append(tuple(int(p) for p in members))
        return Draw(tuple(folds))

    def reference_weights(self, f: int, prompts: int) -> np.ndarray:
        """Counts of every prompt outside fold f, over their number: the reference's mean over prompts."""
        w = np.zeros(prompts)
        for g, members in enumerate(self.folds):
            if g != f:
                np.add.at(w, list(members), 1.0)
        return w / w.sum()


def batch_indicators(batches: Sequence[Sequence[int]], prompts: int) -> np.ndarray:
    """(batches x prompts): how many times each prompt is in each batch."""
    return np.stack([np.bincount(b, minlength=prompts) for b in batches]).astype(np.float64)


def batch_cosines(products: Products, draw: Draw, batch_prompts: int) -> np.ndarray:
    """The cosine of every batch's gradient (`batch_prompts` consecutive prompts of a fold) with its fold's reference
    gradient, fold by fold: one value per batch."""
    prompts = products.own.shape[0]
    out = []
    for f, members in enumerate(draw.folds):
        w = draw.reference_weights(f, prompts)
        ref_norm2 = float(w @ products.ref @ w)
        u = batch_indicators(batches_of(members, batch_prompts), prompts)
        dots = u @ (products.cross @ w)  # <g_b, reference>, up to the batch's scale
        norms2 = ((u @ products.own) * u).sum(axis=1)
        out += [cosine(float(d), float(n), ref_norm2) for d, n in zip(dots, norms2)]
    return np.asarray(out)


def variance_trace(own: np.ndarray, draw: Draw, batch_prompts: int, group: int) -> float:
    """The trace of the covariance of batch gradients across all batches of every fold (unbiased, ddof 1). A batch
    gradient is its prompts' contributions summed over its rollouts' number (`batch_prompts` x `group`): the loss's
    mean over sequences."""
    batches = [b for members in draw.folds for b in batches_of(members, batch_prompts)]
    u = batch_indicators(batches, own.shape[0]) / (batch_prompts * group)
    grams = u @ own @ u.T  # <g_b, g_c>
    n = len(batches)
    return float((np.trace(grams) - grams.sum() / n) / (n - 1))


def fold_signal(own: np.ndarray, draw: Draw, group: int) -> float:
    """||E g||^2, g a batch gradient, estimated without the noise's upward bias: the mean over pairs of disjoint folds
    of the inner product of their mean gradients (each the mean over its rollouts, the scale of a batch's)."""
    prompts = own.shape[0]
    means = [np.bincount(m, minlength=prompts) / (len(m) * group) for m in draw.folds]
    pairs = [(f, g) for f in range(len(means)) for g in range(f + 1, len(means))]
    return float(np.mean([means[f] @ own @ means[g] for f, g in pairs]))


# --------------------------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Difference:
    """A paired difference (estimator minus the reference arm, on the same batches) and its bootstrap standard
    error."""

    value: float
    se: float

    def above(self, sigmas: float = SIGMAS) -> bool:
        return self.value > sigmas * self.se

    def below(self, sigmas: float = SIGMAS) -> bool:
        return self.value < -sigmas * self.se


def paired_difference(value: float, reference: float, replicates: np.ndarray, reference_replicates: np.ndarray):
    """`Difference` of `value - reference`, its SE the std (ddof 1) of the same difference over bootstrap
    replicates (each replicate computes both on the same draw, so the pairing is kept)."""
    diffs = np.asarray(replicates) - np.asarray(reference_replicates)
    se = float(diffs.std(ddof=1)) if diffs.size > 1 else float("nan")
    return Difference(value - reference, se)


def better_verdict(difference: Difference, sigmas: float = SIGMAS) -> str:
    """Three-valued: `HOLDS` when the difference is above `sigmas` SE, `FAILS` when below -`sigmas` SE (the
    opposite holds measurably), else `INCONCLUSIVE` (the smallest difference the run could have detected is
    `sigmas` SE)."""
    if difference.above(sigmas):
        return HOLDS
    if difference.below(sigmas):
        return FAILS
    return INCONCLUSIVE


def prop2_cosine_verdict(walk: Difference, shuffled: Difference, sigmas: float = SIGMAS) -> str:
    """Proposition 2 (a), stated before the numbers: MAPO's batch gradient lies closer to the gradient of Q* than
    GRPO's. `HOLDS` when the walk verifier's cosine beats GRPO's by more than `sigmas` SE and its shuffled control's
    (the same z_t values, no information) does not; `FAILS` when the walk verifier's is below GRPO's by more than
    `sigmas` SE; else `INCONCLUSIVE` (including a control that gains as much: sizes, not information, would explain
    the gain)."""
    if walk.above(sigmas) and not shuffled.above(sigmas):
        return HOLDS
    if walk.below(sigmas):
        return FAILS
    return INCONCLUSIVE


def break_even(qualities: Sequence[float], cosines: Sequence[float], baseline: float) -> float:
    """The verifier quality q* above which the cosine reaches `baseline` (GRPO's), by linear interpolation between
    the measured qualities (ascending): `qualities[0]` if it already does there, `inf` if it never does."""
    if cosines[0] >= baseline:
        return float(qualities[0])
    for (q0, c0), (q1, c1) in zip(zip(qualities, cosines), zip(qualities[1:], cosines[1:])):
        if c1 >= baseline:
            return float(q0 + (q1 - q0) * (baseline - c0) / (c1 - c0))
    return math.inf
