"""The statistics of `make experiment-curves`, pure and model-free, and its verdict as the plan committed before the
runs states it (`research/plans/experiment_curves.json`, read by `load_plan`; issue 60, item 3).

Each run's final greedy evaluation is a vector of per-row outcomes (did a valid call frame the target), on the same
held-out rows for every run, so an arm and the reference are paired twice: by seed (same start, same prompts drawn)
and by row. `compare` gives the paired difference over seeds with Student's t (n - 1 degrees of freedom) and a
bootstrap over seeds and, within each, rows; `verdict` applies the plan's three-valued rule. The bar of the earlier
report, one evaluation's binomial SE of a difference, is gone: it counted the row noise a second time (the seeds'
spread already holds it) and no gain under it could pass however many seeds agreed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

PLAN = Path("research/plans/experiment_curves.json")
ACTED, DID_NOT_ACT, INCONCLUSIVE = "acted", "did not act", "inconclusive"
# What one comparison shows (`Comparison.call`), by the plan's rule.
ABOVE, BELOW, SMALL, UNDECIDED = "above", "below", "smaller than the smallest effect", "undecided"
POWER_Z = 0.84  # one-sided 80% power on top of the t bar: the smallest difference a run detects
CHUNK = 500  # bootstrap replicates drawn at once (replicates x seeds x rows indices: ~16 MB at 8 x 512)


@dataclass(frozen=True)
class Plan:
    """The plan's fields the code reads; the rest of the file is its prose."""

    arms: tuple[str, ...]
    primary: str
    reference: str
    density: str
    seeds: tuple[int, ...]
    eval_rows: int
    replicates: int
    bootstrap_seed: int
    alpha: float
    smallest_effect: float


def load_plan(path: str | Path = PLAN) -> Plan:
    """The plan at `path`; a missing field fails naming it."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    analysis = raw["analysis"]
    return Plan(
        arms=tuple(raw["arms"]),
        primary=raw["primary"],
        reference=raw["reference"],
        density=raw["density"],
        seeds=tuple(int(s) for s in raw["seeds"]),
        eval_rows=int(raw["eval_rows"]),
        replicates=int(analysis["replicates"]),
        bootstrap_seed=int(analysis["bootstrap_seed"]),
        alpha=float(analysis["alpha"]),
        smallest_effect=float(analysis["smallest_effect"]),
    )


@dataclass(frozen=True)
class Comparison:
    """An arm minus the reference over the seeds both ran: per-seed differences of their row means, their mean, its
    standard error (sd with ddof 1 over sqrt(n)), t and its degrees of freedom, the t bar (`t_crit`), the bootstrap's
    percentile interval (`lo`, `hi`), what the plan's rule calls it (`call`) and the smallest difference the run
    could detect with 80% power (`detectable`)."""

    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    mean: float
    se: float
    t: float
    df: int
    t_crit: float
    lo: float
    hi: float
    call: str

    @property
    def detectable(self) -> float:
        return (self.t_crit + POWER_Z) * self.se


def t_bar(df: int, alpha: float) -> float:
    """The two-sided 1 - `alpha` quantile of Student's t with `df` degrees of freedom (inf without any)."""
    return float(stats.t.ppf(1 - alpha / 2, df)) if df > 0 else math.inf


def bootstrap_means(differences: np.ndarray, replicates: int, seed: int) -> np.ndarray:
    """The mean difference over seeds of each bootstrap replicate (`differences`: seeds x the paired rows' outcome
    differences): seeds drawn with replacement, then rows with replacement within each drawn seed."""
    n, m = differences.shape
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, replicates, CHUNK):
        size = min(CHUNK, replicates - start)
        seeds = rng.integers(n, size=(size, n))
        rows = rng.integers(m, size=(size, n, m))
        means.append(differences[seeds[:, :, None], rows].mean(axis=(1, 2)))
    return np.concatenate(means)


def bootstrap_interval(differences: np.ndarray, replicates: int, seed: int, alpha: float) -> tuple[float, float]:
    """The 1 - `alpha` percentile interval of `bootstrap_means`."""
    lo, hi = np.quantile(bootstrap_means(differences, replicates, seed), [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def compare(arm: Mapping[int, Sequence[bool]], reference: Mapping[int, Sequence[bool]], plan: Plan) -> Comparison:
    """`arm` minus `reference`, each `{seed: per-row outcomes}` on the same rows in the same order, over the seeds both
    ran."""
    seeds = tuple(sorted(set(arm) & set(reference)))
    if not seeds:
        raise ValueError("the arm and the reference share no seed")
    lengths = {len(arm[s]) for s in seeds} | {len(reference[s]) for s in seeds}
    if len(lengths) != 1:
        raise ValueError(f"every run must be evaluated on the same rows; got row counts {sorted(lengths)}")
    a = np.array([arm[s] for s in seeds], dtype=np.float64)
    r = np.array([reference[s] for s in seeds], dtype=np.float64)
    differences = a - r
    diffs = differences.mean(axis=1)
    n = len(seeds)
    mean = float(diffs.mean())
    se = float(diffs.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    t = mean / se if se > 0 else (math.copysign(math.inf, mean) if mean and se == 0 else math.nan)
    t_crit = t_bar(n - 1, plan.alpha)
    lo, hi = bootstrap_interval(differences, plan.replicates, plan.bootstrap_seed, plan.alpha)
    if t > t_crit and lo > 0:
        call = ABOVE
    elif t < -t_crit and hi < 0:
        call = BELOW
    elif hi < plan.smallest_effect:
        call = SMALL
    else:
        call = UNDECIDED
    return Comparison(seeds, tuple(float(d) for d in diffs), mean, se, t, n - 1, t_crit, lo, hi, call)


def verdict(over_reference: Comparison | None, over_density: Comparison | None) -> str:
    """The plan's rule: `ACTED` when the primary arm is above the reference and above the density control;
    `DID_NOT_ACT` when it is below the reference or smaller than the smallest effect, or above it but below the
    density control or not more than the smallest effect over it; else `INCONCLUSIVE` (a comparison not run
    included)."""
    if over_reference is None:
        return INCONCLUSIVE
    if over_reference.call in (BELOW, SMALL):
        return DID_NOT_ACT
    if over_reference.call != ABOVE or over_density is None:
        return INCONCLUSIVE
    if over_density.call == ABOVE:
        return ACTED
    if over_density.call in (BELOW, SMALL):
        return DID_NOT_ACT
    return INCONCLUSIVE
