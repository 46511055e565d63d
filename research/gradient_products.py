"""The products every figure of `make experiment` is formed from: each arm's batch gradient against the reference
directions (grad E[Q*], grad E[V] and the framing direction) on the recorded score vectors (`Directions`), and their
statistics on the sample and on bootstrap replicates over prompts (`measure_arms`, `Measured`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from research import gradient_stats as gs
from research.gradient_rollouts import Rollouts

DIRECTIONS = ("q", "framing")  # grad Q*, and grad Q* with grad E[V] projected out


@dataclass
class ArmProducts:
    """One arm's prompt-level products: with itself, with grad Q*'s and with grad E[V]'s contributions."""

    own: np.ndarray
    q: np.ndarray
    v: np.ndarray
    randomised: bool = False


class Directions:
    """The reference directions of one measurement: per step, the coefficients of grad E[Q*] and grad E[V] on the
    recorded score vectors, and every product an arm needs with them.

    The score vectors are the trainer's loss terms, divided by the rollout's trained-token count |tau|, whose mean
    under the policy is the gradient of E[1 / |tau|], not 0. The references multiply them back by |tau| (unnormalised
    sequence scores, mean 0), with a leave-one-out baseline, so they are unbiased for the gradients of E[Q*] and E[V];
    the arms keep the trainer's own terms."""

    def __init__(self, r: Rollouts, group: int):
        self.group, self.prompts = group, len(r.rollout_prompt) // group
        self.step_rollout, self.step_prompt = r.step_rollout, r.step_prompt
        self.gram = r.gram
        self.rollout_gram = r.rollout_gram()
        coef = {d: gs.loo_advantages(values, group) * r.tokens for d, values in (("q", r.q_star), ("v", r.valid_call))}
        self.qq = self._rollout_products(coef["q"], coef["q"])
        self.qv = self._rollout_products(coef["q"], coef["v"])
        self.vv = self._rollout_products(coef["v"], coef["v"])
        self.rollout_coef = coef

    def _rollout_products(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """H_ab for coefficients constant over each rollout's steps (`a`, `b`: one per rollout)."""
        p, g = self.prompts, self.group
        return (a[:, None] * self.rollout_gram * b[None, :]).reshape(p, g, p, g).sum(axis=(1, 3))

    def arm(self, coefficients: np.ndarray) -> ArmProducts:
        """The products of the batch gradients with per-step `coefficients` (advantages); through the rollouts' Gram
        matrix when they are one value per rollout (an episode advantage), else through the steps'."""
        a = np.asarray(coefficients, dtype=np.float64)
        per_rollout = np.zeros(len(self.rollout_gram))
        per_rollout[self.step_rollout] = a
        if np.array_equal(per_rollout[self.step_rollout], a):
            return ArmProducts(*(self._rollout_products(per_rollout, b) for b in
                                 (per_rollout, self.rollout_coef["q"], self.rollout_coef["v"])))  # fmt: skip
        q, v = (self.rollout_coef[d][self.step_rollout] for d in ("q", "v"))
        return ArmProducts(*(gs.prompt_products(self.gram, self.step_prompt, a, b, self.prompts) for b in (a, q, v)))

    def mean_arm(self, draws: Sequence[np.ndarray]) -> ArmProducts:
        """A randomised arm's products averaged over its draws (`gs.Arm` says why that is exact)."""
        arms = [self.arm(a) for a in draws]
        if len(arms) == 1:
            return arms[0]
        mean = ArmProducts(*(np.mean([getattr(x, f) for x in arms], axis=0) for f in ("own", "q", "v")))
        mean.randomised = True
        return mean


def gain_key(batch: int) -> str:
    """The name of the signed expected gain at `batch` prompts a batch (`gs.expected_gain`)."""
    return f"gain_b{batch}"


def figure_of(stats: dict, figure: str):
    """A figure from an arm's statistics (`gs.moments`, floats or arrays of replicates): `gain_b<B>`
    (`gs.expected_gain` at B prompts), `noise_over_signal` (`gs.noise_over_signal`), or a statistic itself."""
    if figure.startswith("gain_b"):
        return gs.expected_gain(stats, float(figure.removeprefix("gain_b")))
    if figure == "noise_over_signal":
        return gs.noise_over_signal(stats)
    return stats[figure]


@dataclass
class Run:
    """One measurement ready for the statistics: its arms' products by (name, scaling), its reference directions and
    each prompt's fold."""

    arms: dict
    d: Directions
    fold_of: np.ndarray


def draw_statistics(runs: Sequence[Run], draws: Sequence[gs.Draw], bp: int, group: int, describe: bool) -> list:
    """Every arm's `gs.moments` (with `describe`, also `gs.batch_figures`) on one draw of each run, towards grad Q*
    and towards the framing direction; the framing direction's projection coefficient pools the runs' products
    (`gs.projection_coefficient` on one run). Per run: {"projection": c, key: {direction: statistics}}."""
    weights = [gs.DrawWeights(draw, run.d.prompts, bp, group) for run, draw in zip(runs, draws, strict=True)]
    shares = [run.d.prompts for run in runs]
    products = gs.pool(
        [{"qv": w.pair_mean(run.d.qv), "vv": w.pair_mean(run.d.vv)} for run, w in zip(runs, weights)], shares
    )
    c = float(products["qv"] / products["vv"]) if products["vv"] > 0 else 0.0
    out = []
    for run, w in zip(runs, weights):
        framing = gs.framing_products(run.d.qq, run.d.qv, run.d.vv, c)
        stats = {"projection": c}
        for key, arm in run.arms.items():
            towards = {
                "q": (gs.Arm(arm.own, arm.q), run.d.qq),
                "framing": (gs.Arm(arm.own, arm.q - c * arm.v), framing),
            }
            stats[key] = {}
            for x, (a, ref) in towards.items():
                stats[key][x] = gs.moments(a, ref, w) | (gs.batch_figures(a, ref, w) if describe else {})
        out.append(stats)
    return out


@dataclass
class Measured:
    """An arm set's statistics on the sample (`point`: key -> direction -> statistic) and on every bootstrap replicate
    (`replicates`, arrays); every figure (`figure_of`) is formed from them."""

    point: dict
    replicates: dict

    def value(self, key, direction: str = "q", figure: str = "gain_b2") -> float:
        return float(figure_of(self.point[key][direction], figure))

    def reps(self, key, direction: str = "q", figure: str = "gain_b2") -> np.ndarray:
        return np.asarray(figure_of(self.replicates[key][direction], figure), dtype=np.float64)

    def se(self, key, direction: str = "q", figure: str = "gain_b2") -> float:
        reps = self.reps(key, direction, figure)
        reps = reps[np.isfinite(reps)]
        return float(reps.std(ddof=1)) if reps.size > 1 else math.nan

    def interval(self, key, direction: str = "q", figure: str = "gain_b2") -> list[float]:
        return list(gs.percentile_interval(self.reps(key, direction, figure)))

    def undefined(self, direction: str = "q") -> int:
        """Replicates whose reference (grad Q* by default) had no measurable norm (|grad J|^2 <= 0): they define no
        figure towards it and are left out of its SEs."""
        first = next(iter(self.replicates.values()))
        return int((~(np.asarray(first[direction]["ref2"]) > 0)).sum())

    def measurable(self, direction: str = "q") -> bool:
        """Whether the sample itself measures |grad J*|^2 > 0 (else no figure towards it is defined)."""
        first = next(v for k, v in self.point.items() if k != "projection")
        return bool(first[direction]["ref2"] > 0)

    def diff(self, a, b, direction: str = "q", figure: str = "gain_b2") -> gs.Difference:
        """a minus b, paired over replicates."""
        return gs.paired_difference(
            self.value(a, direction, figure),
            self.value(b, direction, figure),
            self.reps(a, direction, figure),
            self.reps(b, direction, figure),
        )


def _stack(per_replicate: list[dict]) -> dict:
    """Replicates' statistics (key -> direction -> statistic -> float) as arrays."""
    first = per_replicate[0]
    return {
        key: {x: {k: np.asarray([r[key][x][k] for r in per_replicate]) for k in first[key][x]} for x in DIRECTIONS}
        for key in first
        if key != "projection"
    }


def measure_arms(runs: Sequence[Run], bp: int, group: int, bootstrap: int, seed: int) -> tuple[Measured, list]:
    """`draw_statistics` on the sample and on `bootstrap` replicates, each drawing every run's prompts with
    replacement within its folds (`gs.Draw.of`); the runs' statistics pooled by their prompts (`gs.pool`). Returns the
    pooled `Measured` and each run's."""
    shares = [run.d.prompts for run in runs]

    def pooled(per_run: list[dict]) -> dict:
        keys = [k for k in per_run[0] if k != "projection"]
        out = {key: {x: gs.pool([p[key][x] for p in per_run], shares) for x in DIRECTIONS} for key in keys}
        return out | {"projection": per_run[0]["projection"]}

    points = draw_statistics(runs, [gs.Draw.of(run.fold_of) for run in runs], bp, group, describe=True)
    rngs = [np.random.default_rng([seed, k]) for k in range(len(runs))]
    replicates = [[] for _ in runs]
    pooled_replicates = []
    for _ in range(bootstrap):
        stats = draw_statistics(runs, [gs.Draw.of(run.fold_of, rng) for run, rng in zip(runs, rngs)], bp, group, False)
        for k, s in enumerate(stats):
            replicates[k].append(s)
        pooled_replicates.append(pooled(stats))
    per_run = [Measured(p, _stack(r)) for p, r in zip(points, replicates)]
    return Measured(pooled(points), _stack(pooled_replicates)), per_run
