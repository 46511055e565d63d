"""`research.gradient_stats` and the pure parts of `research.gradient_claims`, on hand-made inputs with every figure
worked by hand in the comments."""

import math
import re

import numpy as np
import pytest
import torch

from research import gradient_stats as gs
from research.gradient_claims import noisy_walk_semantic, step_advantages
from tiny import stages


def test_cosine_and_a_zero_step():
    assert gs.cosine(3.0, 4.0, 9.0) == pytest.approx(0.5)  # 3 / (2 * 3)
    assert gs.cosine(0.0, 0.0, 9.0) == 0.0  # a zero gradient makes no progress


def test_leave_one_out_and_group_advantages():
    # group [1, 0, 0, 1]: r_0's others average (0 + 0 + 1) / 3 = 1/3, so 1 - 1/3 = 2/3; r_1: 0 - 2/3
    assert gs.loo_advantages(np.array([1, 0, 0, 1]), 4) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert gs.group_advantages(np.array([1, 0, 0, 1]), 4) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_the_reward_identity_of_proposition_1_on_a_constructed_batch():
    # groups [1, 1, 0, 0] and [1, 0, 0, 0]: mu 3/8, sigma^2 = 3/8 * 5/8 = 0.234375
    m = gs.reward_moments(np.array([1, 1, 0, 0, 1, 0, 0, 0]), 4)
    assert m.mu == pytest.approx(0.375)
    assert m.sigma2 == pytest.approx(0.234375)
    # deviations: group 1 sums to 0.5 with squares 1.0625, group 2 to -0.5 with squares 0.8125; pairs
    # (0.25 - 1.0625) + (0.25 - 0.8125) = -1.375 over 2 * 4 * 3 = 24 pairs, over sigma^2
    assert m.rho == pytest.approx(-1.375 / 24 / 0.234375)
    # (r - r-bar)^2: group 1 four times 0.25, group 2 0.5625 + 3 * 0.0625: 1.75 / 8
    assert m.lhs == pytest.approx(0.21875)
    assert m.rhs == pytest.approx(m.lhs)  # (3/4) (1 + 0.2444) 0.234375
    assert m.predicted_ratio == pytest.approx(0.21875 / (0.234375 + 0.375**2))


def test_prompt_products_collapse_steps_to_prompts():
    # steps 0 and 1 belong to prompt 0, step 2 to prompt 1; K = diag(1, 1, 4)
    gram = np.diag([1.0, 1.0, 4.0])
    out = gs.prompt_products(gram, np.array([0, 0, 1]), np.array([1.0, 2.0, 1.0]), np.ones(3), 2)
    # <1 s0 + 2 s1, s0 + s1> = 1 + 2 = 3; prompts 0 and 1 orthogonal; <s2, s2> = 4
    assert out == pytest.approx(np.array([[3.0, 0.0], [0.0, 4.0]]))


def test_batch_cosines_score_each_fold_against_the_others():
    # h0 = (1, 0), h1 = (0, 1); reference contributions r0 = (1, 1), r1 = (1, 0); one prompt per fold
    h, r = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 1.0], [1.0, 0.0]])
    products = gs.Products(h @ h.T, h @ r.T, r @ r.T)
    draw = gs.Draw.of(np.array([0, 1]))
    # fold 0's batch h0 against fold 1's reference r1: cos 1; fold 1's h1 against r0: 1 / sqrt(2)
    assert gs.batch_cosines(products, draw, 1) == pytest.approx([1.0, 1 / math.sqrt(2)])


def test_variance_trace_and_fold_signal():
    # four orthogonal prompt gradients of squared norms 1, 4, 9, 16, one prompt per batch, G = 1:
    # sum |g|^2 = 30, n |g-bar|^2 = 30 / 4, so the trace is (30 - 7.5) / 3
    own = np.diag([1.0, 4.0, 9.0, 16.0])
    assert gs.variance_trace(own, gs.Draw.of(np.array([0, 0, 1, 1])), 1, 1) == pytest.approx(7.5)
    # h = (1, 0), (3, 0) in fold 0 and (2, 1), (0, 1) in fold 1: means (2, 0) and (1, 1), inner product 2
    h = np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0], [0.0, 1.0]])
    assert gs.fold_signal(h @ h.T, gs.Draw.of(np.array([0, 0, 1, 1])), 1) == pytest.approx(2.0)
    # a group of 2 halves each mean (the loss averages over rollouts): the product drops by 4
    assert gs.fold_signal(h @ h.T, gs.Draw.of(np.array([0, 0, 1, 1])), 2) == pytest.approx(0.5)


def test_a_bootstrap_draw_stays_within_its_folds():
    fold_of = np.array([0, 0, 0, 1, 1, 1])
    draw = gs.Draw.of(fold_of, np.random.default_rng(0))
    assert set(draw.folds[0]) <= {0, 1, 2} and set(draw.folds[1]) <= {3, 4, 5}
    assert [len(f) for f in draw.folds] == [3, 3]
    assert draw.reference_weights(0, 6)[:3].sum() == 0.0


def test_paired_standard_error_and_the_verdicts():
    # replicate differences 0.2, 0.3, 0.1: std (ddof 1) 0.1
    d = gs.paired_difference(0.3, 0.1, np.array([0.3, 0.5, 0.4]), np.array([0.1, 0.2, 0.3]))
    assert (d.value, d.se) == pytest.approx((0.2, 0.1))
    assert gs.better_verdict(gs.Difference(0.25, 0.1)) == gs.HOLDS
    assert gs.better_verdict(gs.Difference(-0.25, 0.1)) == gs.FAILS
    assert gs.better_verdict(gs.Difference(0.15, 0.1)) == gs.INCONCLUSIVE
    walk, control = gs.Difference(0.05, 0.01), gs.Difference(0.0, 0.01)
    assert gs.prop2_cosine_verdict(walk, control) == gs.HOLDS
    assert gs.prop2_cosine_verdict(walk, gs.Difference(0.05, 0.01)) == gs.INCONCLUSIVE  # sizes explain it too
    assert gs.prop2_cosine_verdict(gs.Difference(-0.05, 0.01), control) == gs.FAILS


def test_break_even_interpolates_between_qualities():
    # 0.3 lies half-way between 0.2 (q 0.6) and 0.4 (q 0.7)
    assert gs.break_even([0.5, 0.6, 0.7], [0.1, 0.2, 0.4], 0.3) == pytest.approx(0.65)
    assert gs.break_even([0.5, 0.6, 0.7], [0.1, 0.2, 0.25], 0.3) == math.inf
    assert gs.break_even([0.5, 0.6, 0.7], [0.35, 0.4, 0.45], 0.3) == 0.5


def test_a_walk_verifier_of_controlled_quality():
    # one rollout: a framing call (1), then a failed call (None: scored 0); lambda 0.5, T = 2
    walk = [[1.0, None]]
    assert noisy_walk_semantic(walk, 1.0, 0.5, 0.0, seed=0) == pytest.approx([0.25])  # (0.5 * 1 + 0) / 2
    assert noisy_walk_semantic(walk, 0.0, 0.5, 0.0, seed=0) == pytest.approx([0.0])  # flipped; the failure stays 0
    many = [[1.0]] * 4000
    assert noisy_walk_semantic(many, 0.8, 0.5, 0.0, seed=1).mean() == pytest.approx(0.8, abs=0.03)


def test_step_advantages_read_one_value_per_step():
    turns = torch.tensor([[1, 1, -1, 2, 2], [1, 1, 1, -1, -1]])
    assert step_advantages(torch.tensor([0.5, -1.0]), turns) == [0.5, 0.5, -1.0]
    per_token = torch.tensor([[0.3, 0.3, 9.0, -0.2, -0.2], [1.0, 1.0, 1.0, 0.0, 0.0]])
    assert step_advantages(per_token, turns) == pytest.approx([0.3, -0.2, 1.0])
    with pytest.raises(ValueError, match="vary within step 2"):
        step_advantages(torch.tensor([[0.3, 0.3, 0.0, -0.2, 0.1], [1.0, 1.0, 1.0, 0.0, 0.0]]), turns)


def test_the_readme_states_the_committed_reports_verdicts():
    """`make demo` prints the committed report's "What it shows" (`stages.experiment_verdict`); the README's research
    paragraph must state the same three verdicts."""
    shows = " ".join(stages.experiment_verdict())
    verdicts = re.findall(r"\*\*(Proposition (?:1|2 \([ab]\))) (holds|fails|inconclusive)\*\*", shows)
    assert [v[0] for v in verdicts] == ["Proposition 1", "Proposition 2 (a)", "Proposition 2 (b)"], shows
    readme = " ".join((stages.REPO / "README.md").read_text(encoding="utf-8").split())
    for proposition, verdict in verdicts:
        assert f"{proposition} {verdict}" in readme, f"README does not say: {proposition} {verdict}"
