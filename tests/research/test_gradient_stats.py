"""`research.gradient_stats` and the pure parts of `research.gradient_claims`, on hand-made inputs with every figure
worked by hand in the comments."""

import itertools
import math

import numpy as np
import pytest
import torch

from research import gradient_claims as gc
from research import gradient_stats as gs
from research.gradient_claims import step_advantages
from tests.tolerance import FLOAT64, HAND_TERMS, approx, tolerance

# Float64 figures worked by hand or by a short chain of sums: HAND_TERMS rounded operations on the longest chain
# (tests/tolerance.py), of terms of order 1
FLOAT64_HAND = tolerance(FLOAT64, terms=HAND_TERMS, scale=1.0)


def test_leave_one_out_and_group_advantages():
    # group [1, 0, 0, 1]: r_0's others average (0 + 0 + 1) / 3 = 1/3, so 1 - 1/3 = 2/3; r_1: 0 - 2/3
    assert gs.loo_advantages(np.array([1, 0, 0, 1]), 4) == approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3], FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert gs.group_advantages(np.array([1, 0, 0, 1]), 4) == approx(
        [0.5, -0.5, -0.5, 0.5], FLOAT64, terms=HAND_TERMS, scale=1.0
    )


def test_the_reward_identity_of_proposition_1_on_a_constructed_batch():
    # groups [1, 1, 0, 0] and [1, 0, 0, 0]: mu 3/8, sigma^2 = 3/8 * 5/8 = 0.234375
    m = gs.reward_moments(np.array([1, 1, 0, 0, 1, 0, 0, 0]), 4)
    assert m.mu == approx(0.375, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert m.sigma2 == approx(0.234375, FLOAT64, terms=HAND_TERMS, scale=1.0)
    # deviations: group 1 sums to 0.5 with squares 1.0625, group 2 to -0.5 with squares 0.8125; pairs
    # (0.25 - 1.0625) + (0.25 - 0.8125) = -1.375 over 2 * 4 * 3 = 24 pairs, over sigma^2
    assert m.rho == approx(-1.375 / 24 / 0.234375, FLOAT64, terms=HAND_TERMS, scale=1.0)
    # (r - r-bar)^2: group 1 four times 0.25, group 2 0.5625 + 3 * 0.0625: 1.75 / 8
    assert m.lhs == approx(0.21875, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert m.rhs == approx(m.lhs, FLOAT64, terms=HAND_TERMS, scale=1.0)  # (3/4) (1 + 0.2444) 0.234375
    assert m.predicted_ratio == approx(0.21875 / (0.234375 + 0.375**2), FLOAT64, terms=HAND_TERMS, scale=1.0)


def test_prompt_products_collapse_steps_to_prompts():
    # steps 0 and 1 belong to prompt 0, step 2 to prompt 1; K = diag(1, 1, 4)
    gram = np.diag([1.0, 1.0, 4.0])
    out = gs.prompt_products(gram, np.array([0, 0, 1]), np.array([1.0, 2.0, 1.0]), np.ones(3), 2)
    # <1 s0 + 2 s1, s0 + s1> = 1 + 2 = 3; prompts 0 and 1 orthogonal; <s2, s2> = 4
    assert out == approx(np.array([[3.0, 0.0], [0.0, 4.0]]), FLOAT64, terms=HAND_TERMS, scale=1.0)


def test_variance_trace():
    # four orthogonal prompt gradients of squared norms 1, 4, 9, 16, one prompt per batch, G = 1:
    # sum |g|^2 = 30, n |g-bar|^2 = 30 / 4, so the trace is (30 - 7.5) / 3
    own = np.diag([1.0, 4.0, 9.0, 16.0])
    assert gs.variance_trace(own, gs.Draw.of(np.array([0, 0, 1, 1])), 1, 1) == approx(
        7.5, FLOAT64, terms=HAND_TERMS, scale=1.0
    )


def test_unbiased_inner_products_and_squares_leave_each_unit_with_itself_out():
    assert gs.pair_mean(np.array([[1.0, 2.0], [3.0, 4.0]])) == approx(
        2.5, FLOAT64, terms=HAND_TERMS, scale=1.0
    )  # (2 + 3) / 2
    # the closed form against its definition, the mean over ordered quadruples of distinct indices
    c = np.random.default_rng(0).normal(size=(6, 6))
    quads = list(itertools.permutations(range(6), 4))
    assert gs.disjoint_product_mean(c) == approx(
        np.mean([c[a, b] * c[x, y] for a, b, x, y in quads]), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    # a bootstrap's repeats: unit 0 twice, unit 3 never; slots of one unit never pair (they are the same draw)
    w = np.array([2, 1, 1, 0, 1, 1])
    slots = np.repeat(np.arange(6), w)
    quads = [q for q in itertools.permutations(range(len(slots)), 4) if len(set(slots[list(q)])) == 4]
    want = np.mean([c[slots[a], slots[b]] * c[slots[x], slots[y]] for a, b, x, y in quads])
    assert gs.disjoint_product_mean(c, w) == approx(want, FLOAT64, terms=HAND_TERMS, scale=1.0)
    pairs = [(a, b) for a, b in itertools.permutations(range(len(slots)), 2) if slots[a] != slots[b]]
    assert gs.pair_mean(c, w) == approx(
        np.mean([c[slots[a], slots[b]] for a, b in pairs]), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    with pytest.raises(ValueError, match="at least 4"):
        gs.disjoint_product_mean(np.ones((4, 4)), np.array([1, 1, 1, 0]))


def one_prompt_folds(h, r):
    """Prompt contributions h (arm) and r (reference), as rows; one prompt per fold, one per batch."""
    h, r = np.asarray(h, dtype=float), np.asarray(r, dtype=float)
    return gs.Arm(h @ h.T, h @ r.T), r @ r.T, gs.Draw.of(np.arange(len(h)))


def figures(arm, ref, draw, group=1, batch=1):
    """`gs.moments` and `gs.batch_figures` on one draw, with the signed gain and the noise over signal at `batch`."""
    weights = gs.DrawWeights(draw, ref.shape[0], 1, group)
    m = gs.moments(arm, ref, weights)
    return (
        m
        | gs.batch_figures(arm, ref, weights)
        | {
            "gain": gs.expected_gain(m, batch),
            "noise_over_signal": gs.noise_over_signal(m),
        }
    )


def test_the_expected_gain_and_its_companions_on_one_dimension():
    # h = 1, 3, 1, 3 against r = 2 everywhere, G = 1, batches of one prompt:
    # |grad J|^2 = 4; <grad J, E g>^2: the mean of h_a r_b h_c r_d over distinct a, b, c, d = 4 * mean_{a != c} h_a h_c
    # = 4 * ((1 + 3 + 1 + 3)^2 - (1 + 9 + 1 + 9)) / 12 = 4 * 44 / 12; E|g_1|^2 = 20 / 4 = 5; gain = (44 / 3) / (4 * 5)
    arm, ref, draw = one_prompt_folds([[1.0], [3.0], [1.0], [3.0]], [[2.0]] * 4)
    f = figures(arm, ref, draw)
    assert f["gain"] == pytest.approx(11 / 15, **FLOAT64_HAND)
    assert (f["with_gradient"], f["cosine"], f["cosine_given_gradient"]) == pytest.approx(
        (1.0, 1.0, 1.0), **FLOAT64_HAND
    )
    # <grad J, E g> over different prompts: 2 * mean_{a != b} h_a = 2 * 2 = 4 > 0, so the gain keeps its sign
    assert f["inner"] == pytest.approx(4.0, **FLOAT64_HAND)
    # noise: E|g_1|^2 - |E g|^2 = 5 - 44 / 12; projected signal (44 / 3) / 4
    assert f["noise_over_signal"] == pytest.approx((5 - 11 / 3) / (11 / 3), **FLOAT64_HAND)
    # a batch of 4 prompts: E|g_4|^2 = 11 / 3 + (5 - 11 / 3) / 4 = 4, so the gain is (11 / 3) / 4
    assert figures(arm, ref, draw, batch=4)["gain"] == pytest.approx(11 / 12, **FLOAT64_HAND)


def test_the_gain_keeps_the_sign_of_the_pair_sum():
    # the same arm pointing the other way: its square is the same, its step descends J
    arm, ref, draw = one_prompt_folds([[-1.0], [-3.0], [-1.0], [-3.0]], [[2.0]] * 4)
    f = figures(arm, ref, draw)
    assert f["inner"] == pytest.approx(-4.0, **FLOAT64_HAND)
    assert f["gain"] == pytest.approx(-11 / 15, **FLOAT64_HAND)
    assert f["cosine"] == pytest.approx(-1.0, **FLOAT64_HAND)
    assert f["noise_over_signal"] == math.inf  # no signal along grad J: infinite noise over it


def test_the_gain_at_any_batch_size_is_the_mean_over_batches_of_distinct_prompts():
    # E|g_B|^2 = |E g|^2 + tr Cov_1 / B from the U-statistics equals, exactly, the mean of |g_b|^2 over every batch of
    # B distinct prompts of the sample: each batch's cross products average to the pair mean, its own to E|g_1|^2
    rng = np.random.default_rng(0)
    h, r = rng.normal(size=(7, 3)) + 0.5, rng.normal(size=(7, 3)) + 1.0
    arm, ref, draw = one_prompt_folds(h, r)
    m = gs.moments(arm, ref, gs.DrawWeights(draw, 7, 1, 1))
    for batch in (1, 2, 3, 7):
        second = np.mean([np.sum(h[list(b)].mean(axis=0) ** 2) for b in itertools.combinations(range(7), batch)])
        along = m["along"] * np.sign(m["inner"]) / m["ref2"]
        assert gs.expected_gain(m, batch) == pytest.approx(along / second, rel=1e-12, abs=0)


def test_the_crossing_point_and_the_log_ratio():
    def arm(signal, mean2, noise):  # moments with |grad J|^2 = 1 and a positive pair sum
        return {"inner": 1.0, "along": signal, "ref2": 1.0, "mean2": mean2, "single2": mean2 + noise}

    # gain_a(B) = B / (B + 10), gain_b(B) = 0.5 B / (B + 1): equal where B + 1 = 0.5 (B + 10), B = 8
    a, b = arm(1.0, 1.0, 10.0), arm(0.5, 1.0, 1.0)
    assert gs.crossing(a, b) == pytest.approx(8.0, **FLOAT64_HAND) and gs.crossing(b, a) == pytest.approx(
        8.0, **FLOAT64_HAND
    )
    assert gs.expected_gain(a, 8) == pytest.approx(gs.expected_gain(b, 8), **FLOAT64_HAND)
    assert gs.expected_gain(a, 2) < gs.expected_gain(b, 2) and gs.expected_gain(a, 32) > gs.expected_gain(b, 32)
    assert math.isnan(gs.crossing(a, arm(0.5, 1.0, 20.0)))  # a gains more at every B
    # noise over signal: 10 / 1 against 1 / 0.5; log(10 / 2)
    assert gs.log_ratio(gs.noise_over_signal(a), gs.noise_over_signal(b)) == pytest.approx(math.log(5), **FLOAT64_HAND)
    out = gs.log_ratio(np.array([math.inf, 2.0, math.inf]), np.array([1.0, math.inf, math.inf]))
    assert out[0] == math.inf and out[1] == -math.inf and math.isnan(out[2])
    assert math.isnan(gs.log_ratio(-1.0, 1.0))
    # a reference without a measurable norm defines nothing
    assert math.isnan(gs.expected_gain(a | {"ref2": 0.0}, 2)) and math.isnan(gs.noise_over_signal(a | {"ref2": -1.0}))


def test_pooled_runs_weigh_each_by_its_prompts():
    a, b = {"x": 1.0, "y": np.array([1.0, 2.0])}, {"x": 4.0, "y": np.array([3.0, 6.0])}
    pooled = gs.pool([a, b], [2, 1])
    assert pooled["x"] == pytest.approx(2.0, **FLOAT64_HAND) and pooled["y"] == pytest.approx(
        [5 / 3, 10 / 3], **FLOAT64_HAND
    )


def test_the_references_noise_inflates_no_denominator():
    # a noiseless arm h = 1 against a noisy reference r = 1, 3, 1, 3 (one dimension): the arm is grad J's direction,
    # so its gain is 1. |grad J|^2 over different prompts: ((1 + 3 + 1 + 3)^2 - (1 + 9 + 1 + 9)) / 12 = 11 / 3, where
    # the squared mean, 4, would count the noise; <grad J, E g>^2 is 11 / 3 as well.
    arm, ref, draw = one_prompt_folds([[1.0]] * 4, [[1.0], [3.0], [1.0], [3.0]])
    f = figures(arm, ref, draw)
    assert f["gain"] == approx(1.0, FLOAT64, terms=HAND_TERMS, scale=1.0)
    # each batch against the other three prompts' reference: 7 / 3 (twice) and 5 / 3 (twice), over |grad J|
    assert f["cosine"] == approx(2 / math.sqrt(11 / 3), FLOAT64, terms=HAND_TERMS, scale=1.0)


def test_the_gain_is_the_squared_cosine_without_noise_and_a_batch_without_gradient_counts_zero():
    # h = (1, 1) against r = (2, 0): cosine 1 / sqrt(2), gain 1 / 2 (no noise: E|g|^2 = |E g|^2)
    arm, ref, draw = one_prompt_folds([[1.0, 1.0]] * 4, [[2.0, 0.0]] * 4)
    f = figures(arm, ref, draw)
    assert (f["gain"], f["cosine"]) == approx((0.5, 1 / math.sqrt(2)), FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert f["noise_over_signal"] == approx(0.0, FLOAT64, terms=HAND_TERMS, scale=1.0)
    # the fourth prompt's advantages all 0: its batch has no gradient; groups of 2 halve every g (the gain is
    # scale-free)
    arm, ref, draw = one_prompt_folds([[1.0, 1.0]] * 3 + [[0.0, 0.0]], [[2.0, 0.0]] * 4)
    f = figures(arm, ref, draw, 2)
    assert f["with_gradient"] == approx(0.75, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert f["cosine_given_gradient"] == approx(1 / math.sqrt(2), FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert f["cosine"] == approx(0.75 / math.sqrt(2), FLOAT64, terms=HAND_TERMS, scale=1.0)
    # <grad J, E g>^2 = mean over distinct a, c of h_a h_c in the first coordinate times 4: 6 / 12 * 4 = 2, over 4
    # (G = 2 twice); E|g|^2 = (3 * 2 + 0) / 4 / 4; |grad J|^2 = 4
    assert f["gain"] == approx((2 / 4) / (4 * 0.375), FLOAT64, terms=HAND_TERMS, scale=1.0)


def test_the_framing_direction_projects_grad_v_out():
    # h_Q = (1, 1), h_V = (0, 2) on every prompt: c = <Q, V> / |V|^2 = 2 / 4, d = Q - V / 2 = (1, 0)
    q, v = np.array([[1.0, 1.0]] * 4), np.array([[0.0, 2.0]] * 4)
    draw = gs.Draw.of(np.arange(4))
    c = gs.projection_coefficient(q @ v.T, v @ v.T, gs.DrawWeights(draw, 4, 1, 1))
    assert c == approx(0.5, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert gs.framing_products(q @ q.T, q @ v.T, v @ v.T, c) == approx(
        np.ones((4, 4)), FLOAT64, terms=HAND_TERMS, scale=1.0
    )


def test_the_trace_splits_into_per_rollout_and_cross_rollout_parts():
    # 2 prompts x 2 rollouts, A = (1, -1, 2, 0), one prompt per fold and batch, so each batch is a prompt over 2
    a = np.array([1.0, -1.0, 2.0, 0.0])
    draw = gs.Draw.of(np.array([0, 1]))
    # orthogonal unit scores: h_0 = e0 - e1 (|h_0|^2 = 2), h_1 = 2 e2 (4); |g|^2 = 0.5, 1; |g-bar|^2 = 6 / 16
    own, self_part = gs.rollout_split(a, np.eye(4), 2)
    assert own == approx(np.diag([2.0, 4.0]), FLOAT64, terms=HAND_TERMS, scale=1.0) and self_part == approx(
        [2.0, 4.0], FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    trace, per_rollout, cross = gs.trace_split(own, self_part, draw, 1, 2)
    assert (trace, per_rollout, cross) == approx((1.5 - 2 * 0.375, 1.5, -0.75), FLOAT64, terms=HAND_TERMS, scale=1.0)
    # rollouts 0 and 1 share their score: h_0 = 0, but the per-rollout part still counts 1 + 1; the cross part
    # holds the cancellation
    gram = np.eye(4)
    gram[0, 1] = gram[1, 0] = 1.0
    own, self_part = gs.rollout_split(a, gram, 2)
    assert own == approx(np.diag([0.0, 4.0]), FLOAT64, terms=HAND_TERMS, scale=1.0) and self_part == approx(
        [2.0, 4.0], FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert gs.trace_split(own, self_part, draw, 1, 2) == approx(
        (1.0 - 2 * 0.25, 1.5, -1.0), FLOAT64, terms=HAND_TERMS, scale=1.0
    )


# ---------------------------------------------------------------------------------------------- controls
VALID = [[True, False, True], [], [True]]
ZOOM = [[True, False, False], [], [True]]
WALK_VERDICTS = [[1.0, None, 0.0], [], [0.0]]


def test_the_constant_controls_put_c_on_valid_zooms_or_valid_calls():
    assert gs.zoom_constant_scores(VALID, ZOOM, 0.4) == [[0.4, 0.0, 0.0], [], [0.4]]
    assert gs.valid_constant_scores(VALID, 0.4) == [[0.4, 0.0, 0.4], [], [0.4]]
    # through eq. 2 at lambda 0.5: rollout 0 = (0.25 * 0.4 + 0 + 0) / 3, no calls = no_tool_semantic
    sem = gc.semantics(gs.zoom_constant_scores(VALID, ZOOM, 0.4), 0.5, -0.1)
    assert sem == approx([0.1 / 3, -0.1, 0.4], FLOAT64, terms=HAND_TERMS, scale=1.0)


def test_the_randomised_controls():
    rng = np.random.default_rng(0)
    assert gs.noise_scores([3, 0, 1], 1.0, rng) == [[1.0, 1.0, 1.0], [], [1.0]]
    assert gs.noise_scores([2], 0.0, rng) == [[0.0, 0.0]]
    assert np.mean(gs.noise_scores([4000], 0.3, rng)[0]) == pytest.approx(0.3, abs=0.03, rel=0)
    values = np.arange(8.0)
    permuted = [gs.permuted_within_groups(values, 4, rng) for _ in range(20)]
    for p in permuted:  # each group keeps its values
        assert sorted(p[:4]) == [0, 1, 2, 3] and sorted(p[4:]) == [4, 5, 6, 7]
    assert any(not np.array_equal(p, values) for p in permuted)


def test_a_garbled_walk_verifier_keeps_its_rate_among_valid_zooms():
    rng = np.random.default_rng
    assert gs.garbled_scores(WALK_VERDICTS, ZOOM, 1.0, rng(0)) == [[1.0, 0.0, 0.0], [], [0.0]]
    # q = 0: both zooms drawn afresh at their verdicts' rate (1 of 2); the failed call 0, the valid non-zoom kept
    for seed in range(5):
        out = gs.garbled_scores(WALK_VERDICTS, ZOOM, 0.0, rng(seed))
        assert out[0][1:] == [0.0, 0.0] and out[0][0] in (0.0, 1.0) and out[2][0] in (0.0, 1.0)
    many = [[1.0], [0.0], [0.0], [0.0]] * 1000  # rate 0.25 among zooms, kept at every q
    zooms = [[True]] * 4000
    for q in (0.0, 0.5):
        assert np.mean(gs.garbled_scores(many, zooms, q, rng(1))) == pytest.approx(0.25, abs=0.02, rel=0)
    # q = 0.5: half the framing verdicts are kept, the rest right at 0.25: P(z = 1 | framed) = 0.5 + 0.5 * 0.25
    framed = np.array(gs.garbled_scores(many, zooms, 0.5, rng(1)))[0::4]
    assert framed.mean() == pytest.approx(0.625, abs=0.04, rel=0)


def test_a_bootstrap_draw_stays_within_its_folds():
    fold_of = np.array([0, 0, 0, 1, 1, 1])
    draw = gs.Draw.of(fold_of, np.random.default_rng(0))
    assert set(draw.folds[0]) <= {0, 1, 2} and set(draw.folds[1]) <= {3, 4, 5}
    assert [len(f) for f in draw.folds] == [3, 3]
    assert draw.reference_weights(0, 6)[:3].sum() == 0.0


def test_paired_standard_error_interval_and_the_verdicts():
    # replicate differences 0.2, 0.3, 0.1 and one undefined: std (ddof 1) 0.1
    d = gs.paired_difference(0.3, 0.1, np.array([0.3, 0.5, 0.4, math.nan]), np.array([0.1, 0.2, 0.3, 0.0]))
    assert (d.value, d.se, d.undefined) == pytest.approx((0.2, 0.1, 1), **FLOAT64_HAND)
    assert (d.lo, d.hi) == pytest.approx(
        (0.1, 0.3), **FLOAT64_HAND
    )  # 3 replicates: the 2.3% and 97.7% order statistics
    assert gs.better_verdict(gs.Difference(0.25, 0.1)) == gs.HOLDS
    assert gs.better_verdict(gs.Difference(-0.25, 0.1)) == gs.FAILS
    assert gs.better_verdict(gs.Difference(0.15, 0.1)) == gs.INCONCLUSIVE
    up, flat, down = gs.Difference(0.05, 0.01), gs.Difference(0.01, 0.01), gs.Difference(-0.05, 0.01)
    assert gs.prop2a_verdict(up, up, 0.1) == gs.HOLDS
    assert gs.prop2a_verdict(flat, up, 0.1) == gs.INCONCLUSIVE  # as good at random verdicts: no framing information
    assert gs.prop2a_verdict(up, flat, 0.1) == gs.INCONCLUSIVE  # framing information, but no gain over GRPO
    assert gs.prop2a_verdict(up, up, -0.1) == gs.INCONCLUSIVE  # the walk arm's step descends J*
    assert gs.prop2a_verdict(down, up, 0.1) == gs.FAILS
    assert gs.prop2a_verdict(flat, down, 0.1) == gs.FAILS  # below GRPO
    assert gs.interval_verdict(0.1, math.inf) == gs.HOLDS
    assert gs.interval_verdict(-math.inf, -0.1) == gs.FAILS
    assert gs.interval_verdict(-0.1, 0.1) == gs.INCONCLUSIVE


def test_the_percentile_interval_covers_what_2_se_would():
    # 200 replicates 1..200: the 2.275% and 97.725% points are the 5th (4.55 rounded up) and 196th order statistics
    values = np.arange(1.0, 201.0)
    assert gs.percentile_interval(values) == (5.0, 196.0)
    # +-inf keep their place; NaN ones are left out
    assert gs.percentile_interval(np.r_[values[:-10], [math.inf] * 10, [math.nan] * 5]) == (5.0, math.inf)


def test_the_power_calculation():
    assert gs.detectable(0.01) == approx(0.0284, FLOAT64, terms=HAND_TERMS, scale=1.0)  # (2 + 0.84) SE
    # (0.0284 / 0.0142)^2 = 4 times the prompts
    assert gs.prompts_needed(0.01, 100, 0.0142) == 400
    # the first version: 256 * (2.84 * 0.0101 / 0.0035)^2 = 17,194.3
    assert gs.prompts_needed(0.0101, 256, 0.0035) == 17195


def test_break_even_finds_where_the_difference_reaches_zero():
    # -0.1 at q 0.5 to +0.1 at q 1: zero half-way, 0.75
    assert gs.break_even([0.0, 0.5, 1.0], [-0.2, -0.1, 0.1]) == approx(0.75, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert gs.break_even([0.0, 0.5, 1.0], [0.01, 0.2, 0.3]) == -math.inf  # no information already does as well
    assert gs.break_even([0.0, 0.5, 1.0], [-0.3, -0.2, -0.1]) == math.inf


def test_step_advantages_read_one_value_per_step():
    turns = torch.tensor([[1, 1, -1, 2, 2], [1, 1, 1, -1, -1]])
    assert step_advantages(torch.tensor([0.5, -1.0]), turns) == [0.5, 0.5, -1.0]
    per_token = torch.tensor([[0.3, 0.3, 9.0, -0.2, -0.2], [1.0, 1.0, 1.0, 0.0, 0.0]])
    assert step_advantages(per_token, turns) == approx([0.3, -0.2, 1.0], terms=1)  # float32 copies
    with pytest.raises(ValueError, match="vary within step 2"):
        step_advantages(torch.tensor([[0.3, 0.3, 0.0, -0.2, 0.1], [1.0, 1.0, 1.0, 0.0, 0.0]]), turns)


def test_an_episode_advantage_takes_the_rollouts_gram_and_agrees_with_the_steps():
    rng = np.random.default_rng(0)
    steps = np.array([1, 2, 1, 3, 2, 1, 1, 2])  # 8 rollouts, 2 prompts of 4
    step_rollout = np.repeat(np.arange(8), steps)
    x = rng.normal(size=(len(step_rollout), 5))
    walk = [[1.0] * (n - 1) for n in steps]
    r = gc.Rollouts(step_rollout, np.repeat([0, 1], 4), np.arange(8) + 10.0, np.ones(8), np.arange(8) % 3 == 0,
                    rng.random(8), walk, [[True] * (n - 1) for n in steps], x @ x.T)  # fmt: skip
    d = gc.Directions(r, 4)
    episode = rng.normal(size=8)[step_rollout]
    fast = d.arm(episode)
    q = gs.loo_advantages(r.q_star, 4)[step_rollout] * r.tokens[step_rollout]
    assert fast.own == approx(
        gs.prompt_products(r.gram, r.step_prompt, episode, episode, 2), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert fast.q == approx(
        gs.prompt_products(r.gram, r.step_prompt, episode, q, 2), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert d.qq == approx(gs.prompt_products(r.gram, r.step_prompt, q, q, 2), FLOAT64, terms=HAND_TERMS, scale=1.0)
    per_step = episode + 0.1 * np.arange(len(episode))  # varies within a rollout: the steps' path
    assert d.arm(per_step).own == approx(
        gs.prompt_products(r.gram, r.step_prompt, per_step, per_step, 2), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
