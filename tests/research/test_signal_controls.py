"""The experiment's controls, pure and on hand-made inputs: the simulated reader and the exact, walk and shuffled
verifiers (`research.rewards`, `research.verifiers`), each against numbers worked out by hand, and their names as the
experiment's recipes give them (import paths)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from data.task import normalize
from research.rewards import (
    READER_HIT_P,
    READER_MISS_P,
    frames_target,
    is_zoom,
    reader_draw,
    simulated_reader_reward,
    target_in_view_reward,
)
from research.verifiers import CentredVerifier, ExactVerifier, MeanVerifier, ShuffledVerifier, WalkVerifier
from rewards import check_columns, get_reward_funcs
from rewards.verifiers import Scene, build_verifier
from tests.tolerance import approx
from tools import ToolConfig, ZoomCall

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
    p = [READER_HIT_P, READER_MISS_P, READER_MISS_P]  # only the first call framed the target
    assert got == [float(d < q) for d, q in zip(draws, p)]
    # The draw is a pure function of (row, step, rollout): the same again, and another at another step.
    assert reader_draw("r0", 3, 0) == draws[0] and reader_draw("r0", 4, 0) != draws[0]
    # Over many rows the hit rate is READER_HIT_P and the miss rate READER_MISS_P.
    many = [reader_draw(f"row{k}", 0, 0) for k in range(4000)]
    assert np.mean([d < READER_HIT_P for d in many]) == pytest.approx(READER_HIT_P, abs=0.03)
    # Without its noise it is target_in_view: 1 for the framed call only.
    assert target_in_view_reward(completions, envs, [TARGET] * 3) == [1.0, 0.0, 0.0]


def test_a_failed_call_or_a_broken_format_earns_the_reader_nothing():
    broken = completion_with_calls(1)
    broken[-1]["content"] = "A"  # no <think>, no <answer>
    envs = [Env([call((0, 0, 50, 50), error="bad box")]), Env([call((0, 0, 50, 50))])]
    assert target_in_view_reward([completion_with_calls(1), broken], envs, [TARGET] * 2) == [0.0, 0.0]


def test_the_grounding_reward_is_registered_and_leaves_a_row_without_a_target_box_unscored():
    envs = [Env([call((0, 0, 50, 50))]), Env([call((0, 0, 50, 50))])]
    reward = get_reward_funcs(["target_in_view"])[0]
    assert reward is target_in_view_reward  # production's, which the research package re-exports
    # A row with no target box is not a miss: None, advantage 0 (TRL leaves it out of the group statistics).
    assert reward([completion_with_calls(1)] * 2, envs, [TARGET, None]) == [1.0, None]


# --------------------------------------------------------------------------------------------------- verifiers
def test_labels_compare_without_case_punctuation_or_a_leading_article():
    assert normalize("The Star.") == normalize("star") == "star"
    assert normalize("a  green object!") == "green object"
    assert normalize("the star") != normalize("the stars")


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


def test_the_controls_build_by_their_import_paths_with_the_seed():
    assert isinstance(build_verifier("research.verifiers:exact", ToolConfig()), ExactVerifier)
    shuffled = build_verifier("research.verifiers:shuffled_exact", ToolConfig(), seed=5)
    assert isinstance(shuffled, ShuffledVerifier) and shuffled.seed == 5 and isinstance(shuffled.base, ExactVerifier)
    assert isinstance(build_verifier("research.verifiers:exact_walk", ToolConfig()), WalkVerifier)
    walk = build_verifier("research.verifiers:shuffled_exact_walk", ToolConfig(), seed=2)
    assert isinstance(walk, ShuffledVerifier) and walk.seed == 2 and isinstance(walk.base, WalkVerifier)
    density = build_verifier("research.verifiers:walk_density", ToolConfig())
    assert isinstance(density, MeanVerifier) and isinstance(density.base, WalkVerifier)


def test_a_dataset_without_the_columns_the_controls_read_fails_naming_them():
    reader, exact = "research.rewards:simulated_reader_reward", "research.verifiers:exact"
    check_columns(["prompt", "image", "id", "target_bbox", "target_label"], [reader], exact, "d")
    with pytest.raises(ValueError, match=rf"data/x: reward {reader} needs \['target_bbox', 'id'\]; "
                       rf"semantic_verifier {exact} needs \['target_bbox', 'target_label'\]"):  # fmt: skip
        check_columns(["prompt", "image", "answer"], [reader, "outcome"], exact, "data/x")


class Fixed:
    """A verifier that returns the scores it is given, batch after batch."""

    def __init__(self, *batches):
        self.batches = iter(batches)

    def score(self, calls, scenes):
        return torch.tensor(next(self.batches))


def test_the_centred_verifier_subtracts_the_batch_mean_of_scored_calls():
    centred = CentredVerifier(Fixed([0.2, float("nan"), 0.6]))
    out = centred.score([None] * 3, [None] * 3)
    # float32: a mean of 2, a subtraction, at the scores' size (<= 1)
    assert out[0].item() == approx(-0.2, terms=4, scale=1.0) and out[2].item() == approx(0.2, terms=4, scale=1.0)
    assert out[1].isnan()
    # contrastive scores crops, then whole images: centred crops [0.1, -0.1] minus centred wholes [-0.1, 0.1]
    # = the centred difference, (0.5 - 0.2, 0.3 - 0.4) - 0.1
    centred = CentredVerifier(Fixed([0.5, 0.3], [0.2, 0.4]))
    crops, wholes = centred.score([None] * 2, [None] * 2), centred.score([None] * 2, [None] * 2)
    assert (crops - wholes).tolist() == approx([0.2, -0.2], terms=9, scale=1.0)  # two centrings, a difference


def test_a_zoom_covers_at_most_a_quarter_of_the_image():
    assert is_zoom((0, 0, 50, 100), IMAGE.size) and not is_zoom((0, 0, 51, 100), IMAGE.size)
    assert not is_zoom(None, IMAGE.size)


def test_the_density_control_pays_every_scored_call_the_batch_mean():
    # The walk's verdicts 1, 0, (unscorable), 0: their mean over the 3 scored calls, 1/3, on each of them.
    out = MeanVerifier(Fixed([1.0, 0.0, float("nan"), 0.0])).score([None] * 4, [None] * 4)
    third = approx(1 / 3, terms=3, scale=1.0)  # float32: a sum of 3 and a division
    assert out[0].item() == third and out[1].item() == third and out[3].item() == third and out[2].isnan()
    assert out.sum(0).isnan() and out[~out.isnan()].sum().item() == approx(1.0, terms=6, scale=1.0)  # same total
    assert MeanVerifier(Fixed([float("nan")])).score([None], [None]).isnan().all()  # nothing scored: nothing paid
