"""The experiment's controls, pure and on hand-made inputs: the simulated reader, the exact and shuffled verifiers,
contrastive z_t, the verifier gate's figures and the gradient-variance estimate, each against numbers worked out
by hand."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import rewards
from evaluation.verifier_check import gate
from mapo import scale_similarity
from rewards import (
    ExactVerifier,
    Scene,
    ShuffledVerifier,
    WalkVerifier,
    build_verifier,
    check_columns,
    frames_target,
    normalise_label,
    reader_draw,
    simulated_reader_reward,
    target_in_view_reward,
)
from tools import ToolConfig, ZoomCall
from utils.diagnostics import GradientVariance, gradient_variance

IMAGE = Image.new("RGB", (100, 200))  # 20,000 px: a box may cover at most 5,000 of them
TARGET = [10, 10, 20, 20]


def call(box, label="the star", error=None):
    return ZoomCall(1, {}, label, box, None if error else IMAGE, error)


# ---------------------------------------------------------------------------------------------- simulated reader
def test_a_box_frames_the_target_when_it_holds_it_and_is_a_zoom():
    assert frames_target((0, 0, 50, 100), TARGET, IMAGE.size)  # 5,000 px = a quarter: still a zoom
    assert not frames_target((0, 0, 51, 100), TARGET, IMAGE.size)  # just over a quarter of the image
    assert not frames_target((0, 0, 100, 200), TARGET, IMAGE.size)  # the whole image holds the target, no zoom
    assert not frames_target((11, 0, 50, 50), TARGET, IMAGE.size)  # cuts the target's left edge
    assert not frames_target(None, TARGET, IMAGE.size)


def completion_with_calls(n_calls):
    """`n_calls` assistant turns that call the zoom-in tool, each with its list-valued response, then an answer."""
    messages = []
    for _ in range(n_calls):
        messages.append(
            {"role": "assistant", "content": "<think>x</think>", "tool_calls": [{"name": "image_zoom_in_tool"}]}
        )
        messages.append({"role": "tool", "name": "image_zoom_in_tool", "content": [{"type": "image"}]})
    messages.append({"role": "assistant", "content": "<think>y</think><answer>A</answer>"})
    return messages


class Env:
    def __init__(self, calls):
        self.calls, self.image = calls, IMAGE


def test_the_reader_pays_by_where_the_policy_looked_with_draws_seeded_per_row_step_and_rollout():
    envs = [Env([call((0, 0, 50, 50))]), Env([call((50, 50, 90, 90))]), Env([])]
    completions = [completion_with_calls(1), completion_with_calls(1), completion_with_calls(0)]
    state = SimpleNamespace(global_step=3)
    got = simulated_reader_reward(completions, envs, [TARGET] * 3, ["r0", "r1", "r2"], trainer_state=state)
    draws = [reader_draw(row, 3, i) for i, row in enumerate(["r0", "r1", "r2"])]
    p = [rewards.READER_HIT_P, rewards.READER_MISS_P, rewards.READER_MISS_P]  # only the first call framed the target
    assert got == [float(d < q) for d, q in zip(draws, p)]
    # The draw is a pure function of (row, step, rollout): the same again, and another at another step.
    assert reader_draw("r0", 3, 0) == draws[0] and reader_draw("r0", 4, 0) != draws[0]
    # Over many rows the hit rate is READER_HIT_P and the miss rate READER_MISS_P.
    many = [reader_draw(f"row{k}", 0, 0) for k in range(4000)]
    assert np.mean([d < rewards.READER_HIT_P for d in many]) == pytest.approx(rewards.READER_HIT_P, abs=0.03)
    # Without its noise it is target_in_view: 1 for the framed call only.
    assert target_in_view_reward(completions, envs, [TARGET] * 3) == [1.0, 0.0, 0.0]


def test_a_failed_call_or_a_broken_format_earns_the_reader_nothing():
    broken = completion_with_calls(1)
    broken[-1]["content"] = "A"  # no <think>, no <answer>
    envs = [Env([call((0, 0, 50, 50), error="bad box")]), Env([call((0, 0, 50, 50))])]
    assert target_in_view_reward([completion_with_calls(1), broken], envs, [TARGET] * 2) == [0.0, 0.0]


# --------------------------------------------------------------------------------------------------- verifiers
def test_labels_compare_without_case_punctuation_or_a_leading_article():
    assert normalise_label("The Star.") == normalise_label("star") == "star"
    assert normalise_label("a  green object!") == "green object"
    assert normalise_label("the star") != normalise_label("the stars")


def test_the_exact_verifier_pays_the_right_label_on_a_crop_that_frames_the_target_only():
    scene = Scene(IMAGE, TARGET, "the star")
    calls = [
        call((0, 0, 50, 50), "The star"),  # right label, target framed
        call((0, 0, 50, 50), "the green object"),  # framed, but another label: the ground truth knows the star only
        call((50, 50, 90, 90), "the star"),  # right label, target missed
        call((0, 0, 100, 200), "the star"),  # the whole image: no zoom
    ]
    assert ExactVerifier().score(calls, [scene] * 4).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_the_walk_verifier_pays_a_crop_that_frames_the_target_whatever_its_label():
    scene = Scene(IMAGE, TARGET, "the star")
    calls = [
        call((0, 0, 50, 50), "The star"),  # right label, target framed
        call((0, 0, 50, 50), "the green object"),  # framed, another label: walk ignores the label
        call((50, 50, 90, 90), "the star"),  # right label, target missed
        call((0, 0, 100, 200), "the star"),  # the whole image: no zoom
        call((0, 0, 50, 50), "the star", error="bad box"),  # no crop returned
    ]
    assert WalkVerifier().score(calls, [scene] * 5).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_the_shuffled_verifier_keeps_the_values_and_permutes_them_reproducibly():
    class Fixed:
        def score(self, calls, scenes):
            return torch.arange(len(calls), dtype=torch.float32)

    a, b = ShuffledVerifier(Fixed(), seed=3), ShuffledVerifier(Fixed(), seed=3)
    first = a.score([None] * 6, [None] * 6)
    assert sorted(first.tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert first.tolist() == np.random.default_rng([3, 0]).permutation(6).tolist()
    assert torch.equal(b.score([None] * 6, [None] * 6), first)  # same seed, same batch count: same permutation
    assert a.score([None] * 6, [None] * 6).tolist() == np.random.default_rng([3, 1]).permutation(6).tolist()


def test_verifiers_by_name_and_unknown_names_fail_naming_the_known_ones():
    assert isinstance(build_verifier("exact", ToolConfig()), ExactVerifier)
    shuffled = build_verifier("shuffled_exact", ToolConfig(), seed=5)
    assert isinstance(shuffled, ShuffledVerifier) and shuffled.seed == 5 and isinstance(shuffled.base, ExactVerifier)
    assert isinstance(build_verifier("exact_walk", ToolConfig()), WalkVerifier)
    walk = build_verifier("shuffled_exact_walk", ToolConfig(), seed=2)
    assert isinstance(walk, ShuffledVerifier) and walk.seed == 2 and isinstance(walk.base, WalkVerifier)
    known = r"\['clip', 'exact', 'exact_walk', 'shuffled_exact', 'shuffled_exact_walk'\]"
    with pytest.raises(ValueError, match=rf"unknown verifier 'oracle'; known: {known}"):
        build_verifier("oracle", ToolConfig())


def test_a_dataset_without_the_columns_a_reward_or_verifier_reads_fails_naming_them():
    check_columns(["prompt", "image", "id", "target_bbox", "target_label"], ["simulated_reader"], "exact", "d")
    with pytest.raises(ValueError, match=r"data/x: reward simulated_reader needs \['target_bbox', 'id'\]; "
                       r"semantic_verifier exact needs \['target_bbox', 'target_label'\]"):  # fmt: skip
        check_columns(["prompt", "image", "answer"], ["simulated_reader", "outcome"], "exact", "data/x")
    check_columns(["prompt", "image", "answer"], ["outcome"], "clip", "d")  # CLIP reads only the calls


def test_contrastive_z_is_the_crop_score_minus_the_whole_image_score():
    crop, whole = torch.tensor([0.5, 0.2, 0.9]), torch.tensor([0.1, 0.4, 0.9])
    assert scale_similarity(crop, "contrastive", whole).tolist() == pytest.approx([0.4, -0.2, 0.0])
    with pytest.raises(ValueError, match="needs each label's score against its whole image"):
        scale_similarity(crop, "contrastive")


# ------------------------------------------------------------------------------------------------ verifier gate
def test_gate_figures_on_a_hand_made_score_matrix():
    # 3 crops x 3 labels; crop i's right label is column i.
    z = torch.tensor(
        [
            [0.9, 0.1, 0.5],  # right label best: beats both others
            [0.2, 0.3, 0.8],  # right (0.3) beats 0.2, loses to 0.8: rank 2
            [0.4, 0.6, 0.4],  # right (0.4) ties 0.4, loses to 0.6: rank 2.5
        ],
        dtype=torch.float64,
    )
    result = gate(z, [0, 1, 2], ["a", "b", "c"], "cosine")
    # wins over the 6 (crop, other label) pairs: 1 + 1 + 1 + 0 + 0 + 0.5
    assert result.auc == pytest.approx(3.5 / 6)
    assert result.mean_rank == pytest.approx((1 + 2 + 2.5) / 3)
    assert result.right_z == pytest.approx((0.9 + 0.3 + 0.4) / 3)
    # column means: a 0.5, b 0.333, c 0.567: "c" is the best constant, beating the right label on crops 1 (0.8 > 0.3)
    assert result.best_constant == "c" and result.best_constant_z == pytest.approx(1.7 / 3)
    assert result.constant_wins == pytest.approx(1 / 3)
    assert not result.passed  # AUC 0.58 < 0.75, and the constant pays more than the right label
    good = gate(torch.eye(3, dtype=torch.float64), [0, 1, 2], ["a", "b", "c"], "cosine")
    assert good.auc == 1.0 and good.mean_rank == 1.0 and good.passed


# ------------------------------------------------------------------------------------------- gradient variance
def test_gradient_variance_is_the_trace_of_the_covariance_and_its_ratio_to_the_mean():
    gradients = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 2.0]), torch.tensor([2.0, 5.0])]
    # mean (2, 3); deviations (-1,-1), (1,-1), (0,2): squared sums 2, 6 over n-1 = 2: trace 1 + 3 = 4; |mean|^2 = 13
    recorded = []
    callback = GradientVariance(3, recorded.append)
    model = torch.nn.Linear(1, 2, bias=False)
    for g in gradients + [torch.tensor([100.0, 100.0])]:  # a 4th step is past the batches: ignored
        model.weight.grad = g.reshape(2, 1).clone()
        callback.on_pre_optimizer_step(None, None, None, model=model)
    assert recorded == [pytest.approx({"gradvar/trace": 4.0, "gradvar/relative": 4.0 / 13})]
    stacked = torch.stack(gradients).double()
    assert stacked.var(dim=0).sum().item() == pytest.approx(4.0)  # the textbook estimate agrees
    assert math.isinf(gradient_variance(torch.zeros(2), torch.ones(2), 2)["gradvar/relative"])
    with pytest.raises(ValueError, match="at least 2 batches"):
        GradientVariance(1, recorded.append)
