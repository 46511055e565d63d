"""The statistics of `research.gradient_claims`, pure and model-free: how close batch policy gradients lie to the
gradient of the true quality Q*, and how much they vary, computed from the Gram matrix of score vectors.

Every estimator's batch gradient is linear in the same score vectors s_j (one per step of a rollout: the gradient of
the trainer's loss term without its advantage): g_b = sum_{j in b} A_j s_j / n_b. So every inner product this module
needs is a quadratic form of the Gram matrix K = S S^T, and collapses to the prompt level: with M_a the (steps x
prompts) matrix holding step j's coefficient a_j in its prompt's column, h_p = sum_{j in p} a_j s_j is prompt p's
gradient contribution and H_ab = M_a^T K M_b their products (`prompt_products`). Everything below then works on
(prompts x prompts) matrices: a bootstrap over prompts costs nothing next to the gradients.

Prompts are independent draws, so an inner product of two expectations is estimated without the noise's bias by
pairing different prompts only (`pair_mean`, `disjoint_product_mean`: U-statistics). Conventions: rollouts are ordered
group by group (G consecutive rollouts per prompt), as TRL orders them; a batch is `batch_prompts` consecutive prompts
of one fold; a batch's cosine is taken against the reference on the other folds' prompts (cross-fitting).
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


def variance_trace(own: np.ndarray, draw: Draw, batch_prompts: int, group: int) -> float:
    """The trace of the covariance of batch gradients across all batches of every fold (unbiased, ddof 1). A batch
    gradient is its prompts' contributions summed over its rollouts' number (`batch_prompts` x `group`): the loss's
    mean over sequences."""
    batches = [b for members in draw.folds for b in batches_of(members, batch_prompts)]
    u = batch_indicators(batches, own.shape[0]) / (batch_prompts * group)
    grams = u @ own @ u.T  # <g_b, g_c>
    n = len(batches)
    return float((np.trace(grams) - grams.sum() / n) / (n - 1))


def pair_mean(c: np.ndarray, w: np.ndarray | None = None) -> float:
    """The mean of C_ab over ordered pairs of different units, unit a counted w_a times (a bootstrap's repeats; None:
    once each): for C_ab = <x_a, y_b> over independent units with E x_a = X and E y_b = Y, an unbiased estimate of
    <X, Y> (a unit with itself, or a repeat of itself, would add its noise)."""
    w = np.ones(c.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    return float((w @ c @ w - (w**2 * np.diag(c)).sum()) / (w.sum() ** 2 - (w**2).sum()))


def _disjoint_sum(c: np.ndarray) -> float:
    """sum of C_ab C_cd over ordered quadruples of distinct indices: all pairs of off-diagonal entries minus those
    sharing an index, by inclusion-exclusion (two shared indices: the same pair or its transpose)."""
    off = c - np.diag(np.diag(c))
    rows, cols = off.sum(axis=1), off.sum(axis=0)
    shared = (rows**2).sum() + 2 * (rows * cols).sum() + (cols**2).sum() - (off**2).sum() - (off * off.T).sum()
    return float(off.sum() ** 2 - shared)


def disjoint_product_mean(c: np.ndarray, w: np.ndarray | None = None) -> float:
    """The mean of C_ab C_cd over ordered quadruples of four different units (an order-4 U-statistic), unit a counted
    w_a times as in `pair_mean`: with C_ab = <x_a, y_b> over independent units, an unbiased estimate of <X, Y>^2,
    where squaring `pair_mean` would add its variance."""
    w = np.ones(c.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    if np.count_nonzero(w) < 4:
        raise ValueError(f"an unbiased square needs at least 4 independent units; got {np.count_nonzero(w)}")
    ww = np.outer(w, w)
    return _disjoint_sum(ww * c) / _disjoint_sum(ww)


@dataclass(frozen=True)
class Arm:
    """One estimator's prompt-level products (`prompt_products`): `own` = H_gg and `cross` = H_g,ref against a
    reference's coefficients. For a randomised control, their mean over its draws, which are independent from prompt
    to prompt: every statistic of `moments` is linear in `own` and `cross` for one prompt and multiplies different
    prompts', so the mean products give them for the control's expected gradient and second moment exactly."""

    own: np.ndarray
    cross: np.ndarray


def counts(draw: Draw, prompts: int) -> np.ndarray:
    """How many times each prompt is in the draw (a bootstrap's repeats)."""
    return np.bincount([p for m in draw.folds for p in m], minlength=prompts).astype(np.float64)


class DrawWeights:
    """What `moments` and `batch_figures` need of one draw, computed once for every arm: the prompts' counts `w` and the normalisers of
    `pair_mean` and `disjoint_product_mean` under them; every batch's weights over prompts (`batches`: its prompts
    over its rollouts' number, the loss's mean over sequences) and its fold's reference weights (`references`: the
    other folds' prompts)."""

    def __init__(self, draw: Draw, prompts: int, batch_prompts: int, group: int):
        self.group = group
        self.w = counts(draw, prompts)
        self.pairs = self.w.sum() ** 2 - (self.w**2).sum()
        if np.count_nonzero(self.w) < 4:
            raise ValueError(
                f"an unbiased square needs at least 4 independent prompts; got {np.count_nonzero(self.w)}"
            )
        self.quads = _disjoint_sum(np.outer(self.w, self.w))
        batches, references = [], []
        for f, members in enumerate(draw.folds):
            own = batches_of(members, batch_prompts)
            batches += own
            references += [draw.reference_weights(f, prompts)] * len(own)
        self.batches = batch_indicators(batches, prompts) / (batch_prompts * group)
        self.references = np.stack(references)

    def pair_mean(self, c: np.ndarray) -> float:
        return float((self.w @ c @ self.w - (self.w**2 * np.diag(c)).sum()) / self.pairs)

    def disjoint_product_mean(self, c: np.ndarray) -> float:
        return _disjoint_sum(np.outer(self.w, self.w) * c) / self.quads


def moments(arm: Arm, ref: np.ndarray, weights: DrawWeights) -> dict[str, float]:
    """The U-statistics every figure of an arm is formed from, on one draw (`weights`), for the direction grad J that
    the reference contributions estimate (`ref` = H_ref,ref). g_1 is one prompt's gradient (its contribution over its
    `group` rollouts: the loss's mean over sequences); a batch of B prompts averages B independent ones, so
    E|g_B|^2 = |E g|^2 + tr Cov_1 / B and every batch size's figures come from the same statistics:

    - `inner`: <grad J, E g> by `pair_mean` (unbiased); its sign says whether the step climbs J at all.
    - `along`: <grad J, E g>^2 by `disjoint_product_mean` (unbiased: the square of `inner` would add its variance).
    - `ref2`: |grad J|^2 by `pair_mean`, so the reference's own noise inflates no denominator.
    - `mean2`: |E g|^2 by `pair_mean`; `single2`: E|g_1|^2, the mean of the prompts' own products.
    """
    g2 = weights.group**2
    w = weights.w
    return {
        "inner": weights.pair_mean(arm.cross) / weights.group,
        "along": weights.disjoint_product_mean(arm.cross) / g2,
        "ref2": weights.pair_mean(ref),
        "mean2": weights.pair_mean(arm.own) / g2,
        "single2": float(w @ np.diag(arm.own) / w.sum()) / g2,
    }


def batch_figures(arm: Arm, ref: np.ndarray, weights: DrawWeights) -> dict[str, float]:
    """Descriptive figures of the draw's own batches (`weights.batches`, the run's batch size):

    - `with_gradient`: the fraction of batches whose gradient is not zero (a batch whose groups all tie has none).
    - `cosine_given_gradient` and `cosine` (0 for a batch without one): each batch's <g_b, r_f> / (|g_b| |grad J|),
      r_f the reference on the other folds' prompts and |grad J| from `pair_mean`. Dividing by |r_f| instead would
      shrink every cosine by |grad J| / |r_f|, the reference's noise.
    """
    ref2 = weights.pair_mean(ref)
    u = weights.batches
    norms2 = ((u @ arm.own) * u).sum(axis=1)
    dots = ((u @ arm.cross) * weights.references).sum(axis=1)
    has = norms2 > 1e-12 * max(float(norms2.max()), 1e-300)
    cos = np.zeros_like(dots)
    if ref2 > 0:
        cos[has] = dots[has] / np.sqrt(norms2[has] * ref2)
    return {
        "with_gradient": float(has.mean()),
        "cosine_given_gradient": float(cos[has].mean()) if has.any() and ref2 > 0 else math.nan,
        "cosine": float(cos.mean()) if ref2 > 0 else math.nan,
    }


def pool(parts: Sequence[dict], weights: Sequence[float]) -> dict:
    """Independent runs' statistics of the same quantities (`moments`, `batch_figures`: floats or arrays of bootstrap
    replicates), weighted by `weights` (their prompts): each unbiased statistic stays unbiased, and the figures are
    then formed from the pooled ones, as from one run's."""
    total = float(sum(weights))
    return {k: sum(w * np.asarray(p[k], dtype=np.float64) for p, w in zip(parts, weights)) / total for k in parts[0]}


def _signal(m: dict):
    """The signed projected signal sign(<grad J, E g>) <grad J, E g>^2 / |grad J|^2 (NaN where |grad J|^2 <= 0: the
    reference is not measurable)."""
    ref2 = np.asarray(m["ref2"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ref2 > 0, np.sign(m["inner"]) * np.asarray(m["along"]) / ref2, np.nan)


def expected_gain(m: dict, batch: float):
    """The signed expected gain of one normalised SGD step on a batch of `batch` prompts, from `moments` `m`:
    sign(<grad J, E g>) <grad J, E g>^2 / (|grad J|^2 E|g_B|^2), E|g_B|^2 = |E g|^2 + tr Cov_1 / B. Unsigned, it is
    the fraction of |grad J|^2 / 2L that the step eta g at its best size gains on J (E[eta <grad J, g> - L eta^2
    |g|^2 / 2]); the sign of the pair sum says whether the step climbs J or descends it, which the square loses.
    NaN where |grad J|^2 or E|g_B|^2 is not positive."""
    second = np.asarray(m["mean2"]) + (np.asarray(m["single2"]) - np.asarray(m["mean2"])) / batch
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(second > 0, _signal(m) / second, np.nan)
    return float(out) if out.ndim == 0 else out


def noise_over_signal(m: dict):
    """tr Cov_1 over the signed projected signal (one prompt's noise over its signal along grad J): +inf where the
    signal is not positive (the step does not climb J measurably), NaN where grad J is not measurable. A batch of B
    prompts divides it by B, so a ratio of two arms' is free of the batch size."""
    noise = np.asarray(m["single2"]) - np.asarray(m["mean2"])
    s = _signal(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isnan(s), np.nan, np.where(s > 0, noise / np.where(s > 0, s, 1.0), np.inf))
    return float(out) if out.ndim == 0 else out


def log_ratio(a, b):
    """log(a / b) of two positive figures that may be +inf (`noise_over_signal`): +-inf where one is, NaN where both
    are or where either is not positive."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where((a > 0) & (b > 0), np.log(np.where(a > 0, a, 1.0)) - np.log(np.where(b > 0, b, 1.0)), np.nan)
    return float(out) if out.ndim == 0 else out


def crossing(a: dict, b: dict) -> float:
    """The batch size B* (prompts) where arms a and b (`moments`) gain the same: with S the signed projected signal,
    m = |E g|^2 and v = tr Cov_1, gain(B) = S B / (m B + v), so S_a (m_b B + v_b) = S_b (m_a B + v_a) at
    B* = (S_b v_a - S_a v_b) / (S_a m_b - S_b m_a). NaN when no positive B* exists (one arm gains more at every B)."""
    sa, sb = float(_signal(a)), float(_signal(b))
    va, vb = a["single2"] - a["mean2"], b["single2"] - b["mean2"]
    den = sa * b["mean2"] - sb * a["mean2"]
    if not den or math.isnan(den):
        return math.nan
    out = (sb * va - sa * vb) / den
    return float(out) if out > 0 and math.isfinite(out) else math.nan


def projection_coefficient(qv: np.ndarray, vv: np.ndarray, weights: DrawWeights) -> float:
    """c = <grad Q, grad V> / |grad V|^2 from the references' prompt products (`qv` = H_Q,V, `vv` = H_V,V), each inner
    product over different prompts (`pair_mean`)."""
    vv2 = weights.pair_mean(vv)
    return weights.pair_mean(qv) / vv2 if vv2 > 0 else 0.0


def framing_products(qq: np.ndarray, qv: np.ndarray, vv: np.ndarray, c: float) -> np.ndarray:
    """H_d,d for d = grad Q - c grad V (grad Q with grad V projected out when c = `projection_coefficient`): the
    products are bilinear, so d's contributions h_Q - c h_V need no new gradients."""
    return qq - c * (qv + qv.T) + c**2 * vv


def rollout_split(coefficients: np.ndarray, rollout_gram: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """For scalar advantages A_i per rollout and the rollouts' score products <S_i, S_k> (`rollout_gram`, rollouts
    ordered group by group): the prompt-level products H (`prompt_products`) and, per prompt, the part of its diagonal
    entry made of each rollout with itself, sum_i A_i^2 |S_i|^2."""
    a = np.asarray(coefficients, dtype=np.float64)
    prompts = len(a) // group
    blocks = (a[:, None] * rollout_gram * a[None, :]).reshape(prompts, group, prompts, group)
    return blocks.sum(axis=(1, 3)), np.einsum("pipi->p", blocks)


def trace_split(own: np.ndarray, self_part: np.ndarray, draw: Draw, batch_prompts: int, group: int):
    """`variance_trace` split exactly into its per-rollout part (the terms A_i^2 |S_i|^2 of each batch's |g_b|^2) and
    the rest: products of different rollouts, and the mean's. `own`, `self_part` from `rollout_split`. Returns
    (trace, per_rollout, cross)."""
    batches = [b for members in draw.folds for b in batches_of(members, batch_prompts)]
    u = batch_indicators(batches, own.shape[0]) / (batch_prompts * group)
    trace = variance_trace(own, draw, batch_prompts, group)
    per_rollout = float((u**2 @ self_part).sum() / (len(batches) - 1))
    return trace, per_rollout, trace - per_rollout


# --------------------------------------------------------------------------------------------------- controls
def zoom_constant_scores(
    valid: Sequence[Sequence[bool]], zoom: Sequence[Sequence[bool]], c: float
) -> list[list[float]]:
    """`C_zoom`'s z_t: `c` on every valid call whose box is a zoom, 0 on every other call."""
    return [[c if ok and z else 0.0 for ok, z in zip(v, zs, strict=True)] for v, zs in zip(valid, zoom, strict=True)]


def valid_constant_scores(valid: Sequence[Sequence[bool]], c: float) -> list[list[float]]:
    """`C_valid`'s z_t: `c` on every valid call, 0 on failed ones."""
    return [[c if ok else 0.0 for ok in v] for v in valid]


def noise_scores(calls: Sequence[int], rate: float, rng: np.random.Generator) -> list[list[float]]:
    """`C_noise`'s z_t: for each of a rollout's calls (valid or not), 1 with probability `rate`, drawn independently
    of the calls."""
    return [(rng.random(n) < rate).astype(float).tolist() for n in calls]


def permuted_within_groups(values: np.ndarray, group: int, rng: np.random.Generator) -> np.ndarray:
    """`C_all`'s R_sem: each group's values permuted among its `group` rollouts, no-call ones included."""
    v = np.asarray(values, dtype=np.float64).reshape(-1, group)
    return np.take_along_axis(v, rng.permuted(np.tile(np.arange(group), (len(v), 1)), axis=1), axis=1).reshape(-1)


def garbled_scores(
    walk: Sequence[Sequence[float | None]], zoom: Sequence[Sequence[bool]], quality: float, rng: np.random.Generator
) -> list[list[float]]:
    """A walk verifier of quality q among valid zoom calls: each such call keeps its verdict with probability q and
    otherwise gets a fresh draw at the verdicts' own rate among those calls, so E[z | valid] is the same at every q
    (q = 0: pure noise at that rate). Other valid calls keep their verdict; failed calls score 0. One pair of draws
    per call for every q (common random numbers when `rng` is seeded alike)."""
    verdicts = [v for calls, zs in zip(walk, zoom) for v, z in zip(calls, zs) if v is not None and z]
    rate = float(np.mean(verdicts)) if verdicts else 0.0
    out = []
    for calls, zs in zip(walk, zoom, strict=True):
        keep, fresh = rng.random(len(calls)), rng.random(len(calls))
        out.append([
            0.0 if v is None else (float(fresh[i] < rate) if z and keep[i] >= quality else v)
            for i, (v, z) in enumerate(zip(calls, zs))
        ])  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------- verdicts
def percentile_interval(values: np.ndarray, sigmas: float = SIGMAS) -> tuple[float, float]:
    """The bootstrap percentile interval of `values` (replicates; NaN ones left out) whose coverage is a normal's
    within `sigmas` SE (95.4% at 2), so it stands beside the SE bar; order statistics, so +-inf replicates (a figure
    without signal) keep their place."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size < 2:
        return math.nan, math.nan
    tail = (1 - math.erf(sigmas / math.sqrt(2))) / 2
    lo, hi = np.quantile(v, [tail, 1 - tail], method="inverted_cdf")
    return float(lo), float(hi)


@dataclass(frozen=True)
class Difference:
    """A paired difference (estimator minus the reference arm, on the same batches), its bootstrap standard error,
    its percentile interval (`percentile_interval`: `lo`, `hi`) and how many replicates defined neither side
    (`undefined`: the reference not measurable there)."""

    value: float
    se: float
    lo: float = math.nan
    hi: float = math.nan
    undefined: int = 0

    def above(self, sigmas: float = SIGMAS) -> bool:
        return self.value > sigmas * self.se

    def below(self, sigmas: float = SIGMAS) -> bool:
        return self.value < -sigmas * self.se


def paired_difference(value: float, reference: float, replicates: np.ndarray, reference_replicates: np.ndarray):
    """`Difference` of `value - reference`, its SE the std (ddof 1) and its interval the percentiles of the same
    difference over bootstrap replicates (each replicate computes both on the same draw, so the pairing is kept)."""
    diffs = np.asarray(replicates, dtype=np.float64) - np.asarray(reference_replicates, dtype=np.float64)
    undefined = int(np.isnan(diffs).sum())  # a replicate without a measurable reference defines neither side
    diffs = diffs[~np.isnan(diffs)]
    se = float(diffs.std(ddof=1)) if diffs.size > 1 else float("nan")
    lo, hi = percentile_interval(diffs)
    return Difference(value - reference, se, lo, hi, undefined)


def better_verdict(difference: Difference, sigmas: float = SIGMAS) -> str:
    """Three-valued: `HOLDS` when the difference is above `sigmas` SE, `FAILS` when below -`sigmas` SE (the
    opposite holds measurably), else `INCONCLUSIVE` (the smallest difference the run could have detected is
    `sigmas` SE)."""
    if difference.above(sigmas):
        return HOLDS
    if difference.below(sigmas):
        return FAILS
    return INCONCLUSIVE


POWER_Z = 0.84  # a one-sided 80% power on top of the SIGMAS bar


def detectable(se: float, sigmas: float = SIGMAS) -> float:
    """The smallest true difference the run detects with 80% power at the `sigmas` bar: (sigmas + 0.84) SE."""
    return (sigmas + POWER_Z) * se


def prompts_needed(se: float, prompts: int, effect: float, sigmas: float = SIGMAS) -> int:
    """The prompts a run needs to detect `effect` with 80% power, from an SE measured on `prompts` prompts (an SE
    shrinks as 1 / sqrt(prompts))."""
    return math.ceil(prompts * (detectable(se, sigmas) / abs(effect)) ** 2) if effect else math.inf


def prop2a_verdict(
    information: Difference, walk_minus_grpo: Difference, walk_gain: float, sigmas: float = SIGMAS
) -> str:
    """Proposition 2 (a), stated before the numbers, on signed expected gains towards grad Q* at one batch size:
    `HOLDS` when the walk verifier's framing information (its gain minus that of the same verifier with its verdicts
    drawn at random at their own rate, `garbled_scores` at q = 0: the same density of bonus, no information) is above
    `sigmas` SE, the walk arm beats GRPO by more than `sigmas` SE, and its own step climbs J* (`walk_gain` > 0);
    `FAILS` when the information is below -`sigmas` SE or the walk arm is below GRPO by more than `sigmas` SE; else
    `INCONCLUSIVE`, reported with `detectable` of the information's SE."""
    if information.above(sigmas) and walk_minus_grpo.above(sigmas) and walk_gain > 0:
        return HOLDS
    if information.below(sigmas) or walk_minus_grpo.below(sigmas):
        return FAILS
    return INCONCLUSIVE


def interval_verdict(lo: float, hi: float) -> str:
    """Three-valued from a `percentile_interval` of a figure that should be above 0: `HOLDS` when it lies above 0,
    `FAILS` below, else `INCONCLUSIVE` (for figures whose replicates reach +-inf, where an SE means nothing)."""
    if lo > 0:
        return HOLDS
    if hi < 0:
        return FAILS
    return INCONCLUSIVE


def break_even(qualities: Sequence[float], differences: Sequence[float]) -> float:
    """The verifier quality q* where an arm's difference from GRPO (ascending `qualities`) first reaches 0, by linear
    interpolation: `-inf` when it is already at or above 0 at the lowest quality (a verifier with no information
    does as well: the gain is the bonus's, not the verdicts'), `inf` when it never is."""
    if differences[0] >= 0:
        return -math.inf
    for (q0, d0), (q1, d1) in zip(zip(qualities, differences), zip(qualities[1:], differences[1:])):
        if d1 >= 0:
            return float(q0 + (q1 - q0) * (0 - d0) / (d1 - d0))
    return math.inf


def z_score(difference: float, se: float) -> str:
    """A difference in standard errors, in words."""
    return f"{difference / se:+.1f} SE" if se > 0 else "an unknown number of SE"
