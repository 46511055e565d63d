"""HPO's step advantage (`hpo/`): W1 potentials against POT's `emd2`, eq. 16-17 on hand-worked numbers, the
fallback rule, per-token broadcasting and bad input; CPU only, no model."""

import math

import numpy as np
import ot
import pytest
import torch
from geomloss import SamplesLoss
from scipy.spatial.distance import cdist

from hpo import (
    FALLBACK_REASONS,
    MIN_NEGATIVE_STEPS,
    MIN_POSITIVE_STEPS,
    broadcast_to_tokens,
    combine_advantages,
    kantorovich_potentials,
    normalize_step_advantages,
    offline_group_step_advantages,
    online_fallback_reason,
    online_group_step_advantages,
    potential_step_weights,
    unscorable_group,
)
from scripts.bench import bench_potentials
from tests.tolerance import FLOAT64, approx


def line(*coords) -> torch.Tensor:
    """Points on the real line as an (n, 1) cloud."""
    return torch.tensor(coords, dtype=torch.float64)[:, None]


# ------------------------------------------------------------------------------------ potentials vs ot.emd2
@pytest.mark.parametrize("weights", ["uniform", "random"])
@pytest.mark.parametrize("d", [2, 8, 32])
@pytest.mark.parametrize("m", [1, 3, 17, 64])
@pytest.mark.parametrize("n", [1, 3, 17, 64])
def test_potentials_are_optimal_and_feasible(n, m, d, weights):
    for seed in range(3):
        rng = np.random.default_rng(1000 * seed + 7 * n + m + d)
        x = rng.standard_normal((n, d))
        y = rng.standard_normal((m, d)) + 0.5
        if weights == "uniform":
            a = b = None
            an, bn = np.full(n, 1 / n), np.full(m, 1 / m)
        else:  # unnormalised on purpose: the function normalises
            a, b = rng.random(n) + 0.1, 3.0 * (rng.random(m) + 0.1)
            an, bn = a / a.sum(), b / b.sum()
        cost = cdist(x, y)
        w1_ref = ot.emd2(an, bn, cost)
        f, g, w1 = kantorovich_potentials(torch.from_numpy(x), torch.from_numpy(y), a, b)
        assert f.shape == (n,) and g.shape == (m,) and w1.shape == ()
        assert f.dtype == g.dtype == w1.dtype == torch.float64
        f, g = f.numpy(), g.numpy()
        tol = 0.01 * w1_ref + 1e-9
        assert abs(an @ f + bn @ g - w1_ref) <= tol
        assert abs(float(w1) - w1_ref) <= tol
        assert (f[:, None] + g[None, :] <= cost + 1e-6).all()  # dual feasibility
        assert abs(an @ f) <= 1e-9 * (1 + w1_ref)  # the documented normalisation: a.f = 0


@pytest.mark.parametrize("seed", range(4))
def test_potentials_are_tight_on_the_plan_and_1_lipschitz(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((20, 5)), rng.standard_normal((9, 5)) + 1.0
    f, g, _ = (t.numpy() for t in kantorovich_potentials(x, y))
    cost = cdist(x, y)
    plan = ot.emd(np.full(20, 1 / 20), np.full(9, 1 / 9), cost)
    # Complementary slackness with POT's own plan: any optimal dual is tight wherever mass moves.
    assert np.abs((f[:, None] + g[None, :] - cost)[plan > 1e-12]).max() < 1e-6
    assert (np.abs(f[:, None] - f[None, :]) <= cdist(x, x) + 1e-6).all()
    assert (np.abs(g[:, None] - g[None, :]) <= cdist(y, y) + 1e-6).all()


def test_float32_and_numpy_inputs_give_float64_potentials():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    f32, g32, w32 = kantorovich_potentials(torch.from_numpy(x), torch.from_numpy(y))
    f64, g64, w64 = kantorovich_potentials(x.astype(np.float64), y.astype(np.float64))
    assert f32.dtype == torch.float64
    assert torch.allclose(f32, f64, rtol=0, atol=1e-9) and torch.allclose(g32, g64, rtol=0, atol=1e-9)
    assert float(w32) == pytest.approx(float(w64), abs=1e-9)


# ----------------------------------------------------------------------------- potentials by hand (1-D)
def test_single_hindsight_point_potential_is_the_distance_to_it():
    # Every x ships all its mass to y = 0, so f_i = |x_i| - g; centring under a gives f = x - mean(x) = x - 2.5.
    f, g, w1 = kantorovich_potentials(line(0, 1, 3, 6), line(0))
    assert f.tolist() == pytest.approx([-2.5, -1.5, 0.5, 3.5], abs=1e-9)
    assert g.tolist() == pytest.approx([2.5], abs=1e-9)
    assert float(w1) == pytest.approx(2.5, abs=1e-9)


def test_underserved_hindsight_point_gets_the_lowest_potential():
    # x = {0, 2, 10} (1/3 each), y = {0, 10} (1/2 each). Monotone plan: 0->0 1/3, 2->0 1/6, 2->10 1/6, 10->10 1/3,
    # cost (2 + 8) / 6 = 5/3, a spanning tree, so the duals are unique up to the shift. From g(0) = 0:
    # f(0) = 0, f(2) = 2, g(10) = 8 - 2 = 6, f(10) = -6; centring subtracts mean f = -4/3.
    f, g, w1 = kantorovich_potentials(line(0, 2, 10), line(0, 10))
    assert f.tolist() == pytest.approx([4 / 3, 10 / 3, -14 / 3], abs=1e-9)
    assert g.tolist() == pytest.approx([-4 / 3, 14 / 3], abs=1e-9)
    assert float(w1) == pytest.approx(5 / 3, abs=1e-9)
    # The point at 10 sits on the hindsight point that policy mass under-covers: moving mass there lowers W1 most.
    w, _ = potential_step_weights(line(0, 2, 10), line(0, 10))
    assert w.tolist() == pytest.approx([-2.0, -5.0, 7.0], abs=1e-9)  # -(3/2) * f


def test_degenerate_duals_take_the_centre_of_their_range():
    # x = {0, 10}, y = {1, 11}, a perfect matching 0->1, 10->11 (W1 = 1). Optimal duals leave f(10) - f(0) free in
    # [-10, 8] (feasibility of the unused pairs 0->11 and 10->1); the canonical choice is the midpoint, -1.
    f, g, w1 = kantorovich_potentials(line(0, 10), line(1, 11))
    assert f.tolist() == pytest.approx([0.5, -0.5], abs=1e-9)
    assert g.tolist() == pytest.approx([0.5, 1.5], abs=1e-9)
    assert float(w1) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_potentials_do_not_depend_on_the_order_of_the_points(seed):
    rng = np.random.default_rng(seed)
    # Online-like degenerate case (hindsight = 2 of 8 policy points, each a balanced part of 4 + 1) and a perfect
    # matching: POT's raw duals depend on the order here.
    policy = rng.standard_normal((8, 3))
    for x, y in [(policy, policy[:2].copy()), (rng.standard_normal((6, 3)), rng.random((6, 3)))]:
        f0, g0, w0 = kantorovich_potentials(x, y)
        px, py = rng.permutation(len(x)), rng.permutation(len(y))
        f1, g1, w1 = kantorovich_potentials(x[px], y[py])
        assert np.allclose(f1.numpy(), f0.numpy()[px], rtol=0, atol=1e-9)
        assert np.allclose(g1.numpy(), g0.numpy()[py], rtol=0, atol=1e-9)
        assert float(w1) == pytest.approx(float(w0), abs=1e-9)


def test_identical_clouds_duplicates_and_single_points():
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((16, 1024))  # the Gram-matrix shortcut alone would leave W1 ~ 1e-6 here
    f, g, w1 = kantorovich_potentials(wide, wide[::-1].copy())
    assert abs(float(w1)) < 1e-12 and f.abs().max() < 1e-9 and g.abs().max() < 1e-9
    x = rng.standard_normal((5, 3))
    dup = np.concatenate([x[:2], x[:2], x[2:3]])
    f, g, w1 = kantorovich_potentials(dup, x[3:])
    assert f[0] == pytest.approx(float(f[2]), abs=1e-9) and f[1] == pytest.approx(float(f[3]), abs=1e-9)
    assert float(w1) == pytest.approx(ot.emd2(np.full(5, 0.2), np.full(2, 0.5), cdist(dup, x[3:])), rel=1e-6, abs=0)
    f, g, w1 = kantorovich_potentials(line(1), line(4))  # one point each: f = 0, g = W1 = 3
    # float64 LP on 2 points: a handful of roundings
    assert (
        f.tolist() == [0.0]
        and g.tolist() == approx([3.0], FLOAT64, terms=4)
        and float(w1) == approx(3.0, FLOAT64, terms=4)
    )


def test_zero_weights_are_allowed_and_stay_feasible():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((6, 2)), rng.standard_normal((4, 2))
    a, b = np.array([0.0, 1, 1, 0, 1, 1]), np.array([1.0, 0, 1, 1])
    f, g, w1 = (t.numpy() for t in kantorovich_potentials(x, y, a, b))
    cost = cdist(x, y)
    assert float(w1) == pytest.approx(ot.emd2(a / 4, b / 3, cost), rel=0.01, abs=1e-9)
    assert (f[:, None] + g[None, :] <= cost + 1e-6).all() and np.isfinite(f).all() and np.isfinite(g).all()


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("x", "y", "a", "b", "match"),
    [
        (np.zeros((0, 3)), np.ones((2, 3)), None, None, "x is empty"),
        (np.ones((2, 3)), np.zeros((0, 3)), None, None, "y is empty"),
        (np.ones((2, 3)), np.ones((2, 4)), None, None, "x width 3 and y width 4"),
        (np.ones(3), np.ones((2, 3)), None, None, "x must be 2-D"),
        (
            np.array([[0.0, math.nan], [1, 1], [math.nan, 2], [3, 3], [4, 4]]),
            np.ones((2, 2)),
            None,
            None,
            "x has NaN/inf in 2 of 5 rows",
        ),
        (np.ones((2, 2)), np.array([[0.0, math.inf], [1, 1]]), None, None, "y has NaN/inf in 1 of 2 rows"),
        (np.ones((2, 2)), np.ones((2, 2)), [1.0, -0.5], None, "a has 1 negative"),
        (np.ones((2, 2)), np.ones((2, 2)), None, [0.0, 0.0], "b sums to 0"),
        (np.ones((2, 2)), np.ones((2, 2)), [1.0, 1.0, 1.0], None, r"a must have shape \(2,\)"),
        (np.ones((2, 2)), np.ones((2, 2)), [1.0, math.nan], None, "a has NaN/inf"),
    ],
)
def test_bad_input_raises_a_clear_error(x, y, a, b, match):
    with pytest.raises(ValueError, match=match):
        kantorovich_potentials(x, y, a, b)


def test_unnormalised_weights_are_normalised():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 2)), rng.standard_normal((3, 2))
    a = np.array([1.0, 2, 3, 4])
    f1, g1, w1 = kantorovich_potentials(x, y, a, None)
    f2, g2, w2 = kantorovich_potentials(x, y, a / 10, np.full(3, 5.0))
    assert torch.allclose(f1, f2, rtol=0, atol=1e-9) and torch.allclose(g1, g2, rtol=0, atol=1e-9)
    assert float(w1) == pytest.approx(float(w2), abs=1e-9)


# ---------------------------------------------------------------------------------- step advantage, eq. 16
SIGMA_LINE = math.sqrt(112) / 3  # std (ddof=1) of w = -(4/3) * [-2.5, -1.5, 0.5, 3.5] = [10/3, 2, -2/3, -14/3]


def test_online_step_advantages_by_hand():
    # Four one-step rollouts at 0 (success), 1, 3, 6 (failures): the same potentials as the single-point case.
    group = online_group_step_advantages(
        line(0, 1, 3, 6), [0, 1, 2, 3], [1, 1, 1, 1], [True, False, False, False], min_positive=1, min_negative=1
    )
    assert not group.fallback and (group.n_policy, group.n_hindsight) == (4, 1)
    assert group.raw.tolist() == pytest.approx([10 / 3, 2.0, -2 / 3, -14 / 3], abs=1e-9)
    assert group.scale == 0.25  # positive-step ratio 1/4
    batch = normalize_step_advantages([group])
    s = SIGMA_LINE + 1e-6
    assert batch.sigma == pytest.approx(SIGMA_LINE, abs=1e-9) and batch.clip == 1.0
    # -14/3 / sigma = -1.32 is clipped to -1 online.
    assert batch.values[0].tolist() == pytest.approx(
        [0.25 * 10 / 3 / s, 0.25 * 2 / s, 0.25 * -2 / 3 / s, -0.25], abs=1e-9
    )


def test_offline_step_advantages_by_hand():
    group = offline_group_step_advantages(line(0, 1, 3, 6), [0, 1, 2, 3], line(0), n_off_trajectories=4)
    assert group.scale == 0.5  # 4 of max 8 offline trajectories
    batch = normalize_step_advantages([group])
    s = SIGMA_LINE + 1e-6
    # Clip 5 keeps -1.32; step 0 (the prompt segment) enters sigma but gets 0.
    assert batch.clip == 5.0
    assert batch.values[0].tolist() == pytest.approx([0.0, 0.5 * 2 / s, 0.5 * -2 / 3 / s, 0.5 * -14 / 3 / s], abs=1e-9)


def clustered_group(seed: int = 0):
    """4 rollouts x 3 steps in 2-D: rollouts 0, 1 succeed with steps near (0, 0); rollouts 2, 3 fail with steps near
    (10, 0), except rollout 2's first step, at (1, 0)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[0.0, 0]] * 6 + [[1.0, 0]] + [[10.0, 0]] * 5, dtype=torch.float64)
    emb = centres + 0.05 * torch.randn(12, 2, generator=gen, dtype=torch.float64)
    rollout = torch.arange(4).repeat_interleave(3)
    step = torch.arange(1, 4).repeat(4)
    return emb, rollout, step, torch.tensor([True, True, False, False])


@pytest.mark.parametrize("seed", range(3))
def test_steps_near_the_successful_cluster_get_larger_advantages(seed):
    emb, rollout, step, success = clustered_group(seed)
    group = online_group_step_advantages(emb, rollout, step, success)
    assert not group.fallback and (group.n_policy, group.n_hindsight) == (12, 6)
    adv = normalize_step_advantages([group]).values[0]
    success_steps, near_fail, far_fail = adv[:6], adv[6], adv[7:]
    assert (success_steps > 0).all() and (far_fail < 0).all()
    # Order: every successful step > the failed step near the successes > every failed step far away.
    assert success_steps.min() > near_fail > far_fail.max()
    # The same holds offline, against a separate hindsight set at the success cluster.
    off = offline_group_step_advantages(emb, step, emb[:6] + 0.01, n_off_trajectories=8)
    adv_off = normalize_step_advantages([off]).values[0]
    assert adv_off[:6].min() > adv_off[6] > adv_off[7:].max() and (adv_off[7:] < 0).all()


def test_advantage_falls_with_distance_to_a_single_hindsight_point():
    emb = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [0.6, 0.8], [0.0, 2.0]], dtype=torch.float64)
    group = offline_group_step_advantages(emb, [1] * 5, torch.zeros(1, 2, dtype=torch.float64), n_off_trajectories=8)
    adv = normalize_step_advantages([group]).values[0]
    dist = emb.norm(dim=1)  # 5, 1, 10, 1, 2
    order = torch.argsort(dist)
    assert adv[order[0]] == pytest.approx(float(adv[order[1]]), abs=1e-9)  # two points at distance 1
    assert adv[order[1]] > adv[order[2]] > adv[order[3]] > adv[order[4]]


def test_sigma_is_pooled_over_the_batch_not_per_group():
    small = offline_group_step_advantages(line(0, 1, 3, 6), [1] * 4, line(0), n_off_trajectories=8)
    big = offline_group_step_advantages(line(0, 10, 30, 60), [1] * 4, line(0), n_off_trajectories=8)
    batch = normalize_step_advantages([small, big])
    pooled = torch.cat([small.raw, big.raw])
    assert batch.sigma == pytest.approx(float(pooled.std()), abs=1e-9)
    assert torch.allclose(batch.values[1], 10 * batch.values[0], rtol=0, atol=1e-9)  # below the clip, scale is kept


# ---------------------------------------------------------------------------------------------- fallback
@pytest.mark.parametrize(
    ("success", "reason", "code"),
    [
        ([True, False, False, False], "3 positive steps < 4", "too_few_positive"),  # 1 rollout x 3 steps
        ([True, True, True, False], "3 negative steps < 4", "too_few_negative"),
        ([True, True, True, True], "0 negative steps < 4", "too_few_negative"),
        ([False, False, False, False], "0 positive steps < 4", "too_few_positive"),
    ],
)
def test_online_groups_with_too_few_positive_or_negative_steps_fall_back(success, reason, code):
    emb, rollout, step, _ = clustered_group()
    group = online_group_step_advantages(emb, rollout, step, torch.tensor(success))
    assert group.fallback and reason in group.reason and group.reasons == (code,)
    assert torch.all(group.raw == 0)
    eligible = online_group_step_advantages(*clustered_group())
    alone = normalize_step_advantages([eligible])
    batch = normalize_step_advantages([eligible, group])
    assert batch.fallback == [False, True] and batch.n_fallback == 1
    assert torch.all(batch.values[1] == 0)
    assert torch.equal(batch.values[0], alone.values[0])  # a fallback group does not enter sigma


def test_fallback_rule_thresholds():
    assert (MIN_POSITIVE_STEPS, MIN_NEGATIVE_STEPS) == (4, 4)
    assert online_fallback_reason(4, 4) == {}
    assert online_fallback_reason(3, 9) == {"too_few_positive": "3 positive steps < 4"}
    assert online_fallback_reason(2, 1) == {
        "too_few_positive": "2 positive steps < 4",
        "too_few_negative": "1 negative steps < 4",
    }
    assert online_fallback_reason(1, 1, min_positive=1, min_negative=1) == {}
    assert set(online_fallback_reason(0, 0)) <= set(FALLBACK_REASONS)


def test_a_group_with_no_scorable_rollout_has_no_points_and_no_step_advantage():
    group = unscorable_group("online")
    assert group.fallback and group.reasons == ("no_scorable_rollout",) and group.raw.numel() == 0
    eligible = online_group_step_advantages(*clustered_group())
    alone = normalize_step_advantages([eligible])
    batch = normalize_step_advantages([eligible, group])
    assert batch.fallback == [False, True] and batch.values[1].numel() == 0
    assert torch.equal(batch.values[0], alone.values[0]) and batch.sigma == alone.sigma  # not in the statistics


def test_empty_hindsight_set_is_a_fallback_not_a_nan():
    emb, _, step, _ = clustered_group()
    for hindsight in (torch.zeros(0, 2), [], np.zeros((0, 2))):
        group = offline_group_step_advantages(emb, step, hindsight, n_off_trajectories=0)
        assert group.fallback and "empty hindsight" in group.reason and group.reasons == ("empty_hindsight",)
        values = normalize_step_advantages([group]).values[0]
        assert torch.all(values == 0)
    batch = normalize_step_advantages([])
    assert batch.values == [] and batch.sigma == 0.0


def test_nan_embeddings_fall_back_naming_the_rows_never_nan():
    emb, rollout, step, success = clustered_group()
    emb[4, 1] = math.nan
    group = online_group_step_advantages(emb, rollout, step, success)
    assert group.fallback and group.reasons == ("nonfinite_embedding",)
    assert "policy_emb has NaN/inf in 1 of 12 rows" in group.reason
    assert torch.isfinite(normalize_step_advantages([group]).values[0]).all()
    # Counted even when the group would fall back for too few positives: a broken encoder is seen in the metrics.
    group = online_group_step_advantages(emb, rollout, step, torch.zeros(4, dtype=torch.bool))
    assert group.reasons == ("nonfinite_embedding",)
    clean, _, _, _ = clustered_group()
    bad_hindsight = clean[:6].clone()
    bad_hindsight[0, 0] = math.inf
    group = offline_group_step_advantages(clean, step, bad_hindsight, 2)
    assert group.fallback and torch.all(group.raw == 0) and "hindsight_emb has NaN/inf in 1 of 6 rows" in group.reason


def test_group_input_errors():
    emb, rollout, step, success = clustered_group()
    with pytest.raises(ValueError, match="policy_emb width 2 and hindsight_emb width 3"):
        offline_group_step_advantages(emb, step, torch.ones(4, 3), n_off_trajectories=1)
    with pytest.raises(ValueError, match="bool or 0/1"):
        online_group_step_advantages(emb, rollout, step, torch.tensor([0.8, 1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="rollout_index must lie"):
        online_group_step_advantages(emb, rollout + 1, step, success)
    with pytest.raises(ValueError, match="policy_emb is empty"):
        offline_group_step_advantages(torch.zeros(0, 2), [], torch.ones(1, 2), 1)
    with pytest.raises(ValueError, match="mix modes"):
        normalize_step_advantages(
            [
                online_group_step_advantages(emb, rollout, step, success),
                offline_group_step_advantages(emb, step, emb, 8),
            ]
        )
    # 0/1 floats are accepted as success flags.
    as_float = online_group_step_advantages(emb, rollout, step, torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert torch.equal(as_float.raw, online_group_step_advantages(emb, rollout, step, success).raw)


def test_one_point_clouds_give_zero_not_nan():
    group = offline_group_step_advantages(line(2), [1], line(5), n_off_trajectories=1)
    assert group.raw.tolist() == [0.0] and group.w1 == approx(3.0, FLOAT64, terms=4)
    assert normalize_step_advantages([group]).values[0].tolist() == [0.0]  # sigma of one value is 0
    w, w1 = potential_step_weights(line(0, 4), line(1))
    # f = |x - 1| - mean = [1, 3] - 2 = [-1, 1]; w = -(2 / 1) * f.
    assert w.tolist() == pytest.approx([2.0, -2.0], abs=1e-9) and w1 == approx(2.0, FLOAT64, terms=4)


def test_the_authors_solver_is_geomloss_at_their_settings():
    # One hindsight point: any solver's f is the distance to it, minus the mean (here 2.5), up to geomloss' floor
    # of 1e-4 on distances (sqrt(max(d^2, 1e-8))).
    w, w1 = potential_step_weights(line(0, 1, 3, 6), line(0), solver="geomloss")
    assert w.tolist() == pytest.approx([-(4 / 3) * (d - 2.5) for d in (0, 1, 3, 6)], abs=2e-4)
    assert w1 == pytest.approx(2.5, abs=2e-4)
    # A real group: the authors' call on float32 clouds, centred, then eq. 16's numerator.
    emb, rollout, step, success = clustered_group()
    group = online_group_step_advantages(emb, rollout, step, success, solver="geomloss")
    loss = SamplesLoss("sinkhorn", p=1, blur=0.01, scaling=0.5, debias=False, potentials=True)
    f, _ = loss(emb.float(), emb[:6].float())
    f = f.double()
    assert torch.allclose(group.raw, -(12 / 11) * (f - f.mean()), rtol=0, atol=1e-6)
    exact = online_group_step_advantages(emb, rollout, step, success)
    assert (group.raw - exact.raw).abs().max() > 1e-3  # an approximation, not f*
    with pytest.raises(ValueError, match="solver must be one of"):
        potential_step_weights(line(0), line(1), solver="sinkhorn")


# ------------------------------------------------------------------------------ final advantage, eq. 17
def test_combine_advantages_by_hand():
    episode = torch.tensor([1.0, -1.0])
    step = torch.tensor([[0.5, -0.5, 0.0], [1.0, 0.2, -1.0]])
    out = combine_advantages(episode, step, omega=0.5)
    expected = [[(1 + 0.25) / 1.5, (1 - 0.25) / 1.5, 1 / 1.5], [(-1 + 0.5) / 1.5, (-1 + 0.1) / 1.5, -1.5 / 1.5]]
    assert out.tolist() == [approx(row, terms=3, scale=1.5) for row in expected]  # float32: x omega, +, / (1 + omega)
    assert torch.equal(combine_advantages(episode, step, omega=0.0), episode[:, None].expand(2, 3))
    fell_back = combine_advantages(episode, step, 0.5, episode_only=torch.tensor([True, False]))
    assert fell_back[0].tolist() == [1.0, 1.0, 1.0] and torch.equal(fell_back[1], out[1])
    # Without the switch, a fallback group (A_S = 0) gets A_E / (1 + omega), as in the authors' code.
    assert combine_advantages(episode, torch.zeros(2, 3), 0.5)[0, 0] == approx(1 / 1.5, terms=2)


@pytest.mark.parametrize("omega", [-0.1, math.nan, math.inf])
def test_combine_rejects_bad_omega(omega):
    with pytest.raises(ValueError, match="omega"):
        combine_advantages(torch.zeros(2), torch.zeros(2, 3), omega)


def test_combine_rejects_nan_advantages():
    with pytest.raises(ValueError, match="finite"):
        combine_advantages(torch.tensor([math.nan, 0.0]), torch.zeros(2, 3), 0.5)


# ----------------------------------------------------------------------------------- per-token broadcast
def test_broadcast_gives_each_token_its_turn_value_and_zero_outside_turns():
    values = torch.tensor([[0.0, 0.3, -0.2], [0.7, 0.1, -0.4]])
    token_turn = torch.tensor([[-1, -1, 1, 1, 2, 2, -1], [0, 0, 0, 2, 2, -1, -1]])
    out = broadcast_to_tokens(values, token_turn)
    assert out.shape == (2, 7)
    assert out.tolist() == [  # float32 copies of the values: one rounding each
        approx([0.0, 0.0, 0.3, 0.3, -0.2, -0.2, 0.0], terms=1),
        approx([0.7, 0.7, 0.7, -0.4, -0.4, 0.0, 0.0], terms=1),
    ]
    assert out[0, 2] != out[0, 4]  # two turns of one row differ
    ragged = broadcast_to_tokens([torch.tensor([0.0, 0.3, -0.2]), torch.tensor([0.7])], [[1, 2, -1], [0, -1, -1]])
    assert ragged.tolist() == [approx([0.3, -0.2, 0.0], terms=1), approx([0.7, 0.0, 0.0], terms=1)]


def test_broadcast_rejects_indices_past_the_row():
    with pytest.raises(ValueError, match="row 1"):
        broadcast_to_tokens([torch.tensor([1.0, 2.0]), torch.tensor([3.0])], [[0, 1], [0, 1]])
    with pytest.raises(ValueError, match=">= -1"):
        broadcast_to_tokens(torch.zeros(1, 2), [[-2, 0]])
    with pytest.raises(ValueError, match="rows"):
        broadcast_to_tokens(torch.zeros(2, 2), [[0, 1]])


def test_pipeline_from_embeddings_to_token_advantages():
    emb, rollout, step, success = clustered_group()
    batch = normalize_step_advantages([online_group_step_advantages(emb, rollout, step, success)])
    # Each rollout's steps 1..3, consecutive in the group, after a step 0 (prompt) of 0: (4 rollouts, steps 0..3).
    table = torch.stack([torch.cat([torch.zeros(1, dtype=torch.float64), v]) for v in batch.values[0].split(3)])
    episode = torch.tensor([1.0, 1.0, -1.0, -1.0])  # GRPO advantages of 2 successes and 2 failures
    per_step = combine_advantages(episode, table, omega=0.5)
    # Rollout r: prompt tokens (-1), then step 1, 2, 3 tokens, then padding (-1).
    token_step = torch.tensor([[-1, -1, 1, 1, 2, 3, 3, -1]] * 4)
    tokens = broadcast_to_tokens(per_step, token_step)
    assert torch.isfinite(tokens).all() and torch.all(tokens[:, [0, 1, 7]] == 0)
    assert tokens[2, 2] > tokens[2, 4]  # failed rollout 2: its step near the successes beats its far step
    assert torch.all(tokens[:2, 2:7] > 0) and torch.all(tokens[3, 2:7] < 0)


# -------------------------------------------------------------------------------------------------- bench
def test_bench_potentials_runs():
    rows = bench_potentials(sizes=(4, 8), dim=8, repeats=1)
    assert [r["n"] for r in rows] == [4, 8]
    assert all(r["seconds"] > 0 and r["w1"] > 0 and r["dim"] == 8 for r in rows)
