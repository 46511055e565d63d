"""`research.curve_stats`: the learning-curve experiment's statistics and verdict, by hand (issue 60, item 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from research.curve_stats import (
    ABOVE,
    ACTED,
    BELOW,
    DID_NOT_ACT,
    INCONCLUSIVE,
    PLAN,
    SMALL,
    UNDECIDED,
    Comparison,
    Plan,
    bootstrap_means,
    compare,
    load_plan,
    t_bar,
    verdict,
)
from tests.tolerance import approx

# Student's t, two-sided 95%, from the table to 10 significant digits. The quantile inverts an incomplete beta
# function (no sum of terms to bound): 1e-9 relative is far above the solver's accuracy and far below the third digit
# the rule reads.
T_TABLE = {1: pytest.approx(12.70620474, rel=1e-9, abs=0), 7: pytest.approx(2.364624252, rel=1e-9, abs=0)}
PLAN_BY_HAND = Plan(("grpo", "mapo_walk"), "mapo_walk", "grpo", "mapo_density", (0, 1), 4, 2000, 0, 0.05, 0.02)


def test_the_committed_plan_is_what_the_issue_asks():
    plan = load_plan(PLAN)
    assert set(plan.arms) == {"grpo", "mapo_walk", "mapo_density", "mapo_clip"}
    assert len(plan.seeds) >= 8 and plan.eval_rows >= 512
    assert (plan.primary, plan.reference, plan.density) == ("mapo_walk", "grpo", "mapo_density")


def test_a_paired_difference_by_hand():
    """Seed 0: 0.50 - 0.25 = 0.25; seed 1: 0.75 - 0.25 = 0.50. Mean 0.375, sd (ddof 1) 0.125 * sqrt(2), SE 0.125,
    t = 3 with 1 degree of freedom, under the bar t(0.975, 1) = 12.706: not above; the bootstrap interval reaches
    past the smallest effect: undecided."""
    arm = {0: [1, 1, 0, 0], 1: [1, 1, 1, 0]}
    reference = {0: [1, 0, 0, 0], 1: [0, 1, 0, 0], 2: [1, 1, 1, 1]}  # seed 2 has no pair: left out
    c = compare(arm, reference, PLAN_BY_HAND)
    terms = 6  # a mean of 4 rows, then of 2 seeds, in float64
    assert c.seeds == (0, 1) and c.diffs == (0.25, 0.5)
    assert c.mean == approx(0.375, torch.float64, terms=terms) and c.se == approx(0.125, torch.float64, terms=terms)
    assert c.t == approx(3.0, torch.float64, terms=2 * terms) and c.df == 1
    assert c.t_crit == T_TABLE[1]
    assert 0 <= c.lo <= c.mean <= c.hi <= 1 and c.call == UNDECIDED
    assert c.detectable == approx((c.t_crit + 0.84) * 0.125, torch.float64, terms=2 * terms)


def test_a_difference_every_row_and_seed_agree_on_is_above_and_its_opposite_below():
    ones, zeros = {s: [1] * 4 for s in (0, 1, 2)}, {s: [0] * 4 for s in (0, 1, 2)}
    up = compare(ones, zeros, PLAN_BY_HAND)
    assert (up.mean, up.se, up.t, up.lo, up.hi, up.call) == (1.0, 0.0, math.inf, 1.0, 1.0, ABOVE)
    down = compare(zeros, ones, PLAN_BY_HAND)
    assert (down.t, down.lo, down.hi, down.call) == (-math.inf, -1.0, -1.0, BELOW)
    same = compare(zeros, zeros, PLAN_BY_HAND)
    assert math.isnan(same.t) and (same.lo, same.hi, same.call) == (0.0, 0.0, SMALL)


def test_the_bootstrap_draws_seeds_then_rows():
    """Seed 0's rows all differ by 1, seed 1's by 0: drawing 2 seeds with replacement gives a mean of 0, 1/2 or 1
    with probabilities 1/4, 1/2, 1/4, whatever rows are drawn. Over 20,000 replicates each share's binomial SE is
    under 0.0036; 5 SE is the bound."""
    means = bootstrap_means(np.array([[1.0] * 6, [0.0] * 6]), 20_000, seed=3)
    shares = [float(np.mean(means == v)) for v in (0.0, 0.5, 1.0)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=5 * 0.0036)
    # Rows are drawn too: one seed whose rows are half 1, half 0 gives means spread around 1/2, not only 1/2.
    rows = bootstrap_means(np.array([[1.0, 0.0] * 50]), 5_000, seed=3)
    assert rows.std() == pytest.approx(0.05, abs=0.005)  # sqrt(0.25 / 100); its SE over 5,000 draws is ~0.0005
    assert np.array_equal(bootstrap_means(np.array([[1.0, 0.0] * 50]), 5_000, seed=3), rows)  # seeded


def test_runs_on_other_rows_are_refused():
    with pytest.raises(ValueError, match="same rows"):
        compare({0: [1, 0]}, {0: [1, 0, 1]}, PLAN_BY_HAND)
    with pytest.raises(ValueError, match="no seed"):
        compare({0: [1]}, {1: [1]}, PLAN_BY_HAND)


def comparison(call: str) -> Comparison:
    return Comparison((0,), (0.0,), 0.0, 0.0, 0.0, 0, t_bar(0, 0.05), 0.0, 0.0, call)


@pytest.mark.parametrize(
    ("reference", "density", "expected"),
    [
        (ABOVE, ABOVE, ACTED),
        (ABOVE, BELOW, DID_NOT_ACT),  # a bonus of the same density does better
        (ABOVE, SMALL, DID_NOT_ACT),  # ... or as well, within the smallest effect
        (ABOVE, UNDECIDED, INCONCLUSIVE),
        (ABOVE, None, INCONCLUSIVE),
        (BELOW, ABOVE, DID_NOT_ACT),
        (SMALL, ABOVE, DID_NOT_ACT),
        (UNDECIDED, ABOVE, INCONCLUSIVE),
        (None, ABOVE, INCONCLUSIVE),
    ],
)
def test_the_verdict_is_the_plans_rule(reference, density, expected):
    def of(call):
        return None if call is None else comparison(call)

    assert verdict(of(reference), of(density)) == expected


def test_the_t_bar_is_students():
    assert t_bar(1, 0.05) == T_TABLE[1] and t_bar(7, 0.05) == T_TABLE[7] and t_bar(0, 0.05) == math.inf
