"""R_sem (eq. 2) and the MAPO advantage (eq. 3) on hand-worked numbers; no model needed."""

import math
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from mapo import groups_outcome_all_equal, scale_similarity
from mapo_trainer import MAPOConfig, MAPOTrainer, reference_advantages, semantic_reward
from rewards.verifiers import Scene
from tests.tolerance import ADVANTAGE_TERMS, FLOAT64, approx, deviation_condition
from tools import PixelBudget, ToolConfig, ZoomCall, ZoomInEnv


# --------------------------------------------------------------------------------------------------- R_sem, eq. 2
@pytest.mark.parametrize(
    ("scores", "lam", "expected"),
    [
        ([0.8], 0.95, 0.8),  # T = 1: the only call has weight lambda^0 = 1
        ([0.5, 0.8], 0.95, (0.95 * 0.5 + 0.8) / 2),  # = 0.6375
        ([0.2, 0.4, 0.6], 0.5, (0.25 * 0.2 + 0.5 * 0.4 + 0.6) / 3),  # = 0.28333...
        ([0.2, 0.4, 0.6], 1.0, 0.4),  # lambda = 1: the plain mean
        ([-0.5, 0.5], 0.9, (-0.45 + 0.5) / 2),
    ],
)
def test_semantic_reward_by_hand(scores, lam, expected):
    assert semantic_reward(scores, lam) == pytest.approx(expected, abs=1e-12)


def test_semantic_reward_without_calls_is_the_configured_empty_value():
    assert semantic_reward([], 0.95) == 0.0
    assert semantic_reward([], 0.95, empty=-0.1) == -0.1


def test_semantic_reward_counts_nan_as_zero_but_keeps_it_in_T():
    assert semantic_reward([float("nan"), 0.6], 0.95) == approx(0.3, FLOAT64, terms=3)  # (0.95 x 0 + 0.6) / 2


def test_later_calls_weigh_more_and_long_trajectories_are_discounted():
    assert semantic_reward([0.0, 1.0], 0.95) > semantic_reward([1.0, 0.0], 0.95)
    assert semantic_reward([0.9] * 6, 0.95) < semantic_reward([0.9] * 2, 0.95)


# ------------------------------------------------------------------------------------------- advantage, eq. 3
def test_reference_advantages_by_hand():
    outcome = torch.tensor([1.0, 0.0, 1.0, 1.0])
    semantic = torch.tensor([0.5, 0.5, 0.2, 0.8])
    # composite = [1.2, 0.2, 1.08, 1.32]; group means 0.7 and 1.2; sample stds sqrt(0.5) and sqrt(0.0288)
    adv = reference_advantages(outcome, semantic, num_generations=2, beta=0.4)
    s1, s2 = math.sqrt(0.5), math.sqrt(0.0288)
    expected = [0.5 / (s1 + 1e-4), -0.5 / (s1 + 1e-4), -0.12 / (s2 + 1e-4), 0.12 / (s2 + 1e-4)]
    # float32 against exact: group 2's deviations +-0.12 from 1.2 cancel 20 to 1 (condition 10)
    kappa = deviation_condition(outcome + 0.4 * semantic, 2)
    assert adv.tolist() == approx(expected, terms=ADVANTAGE_TERMS, condition=kappa)


def test_all_equal_outcomes_get_their_signal_from_the_semantic_term_only():
    outcome = torch.tensor([1.0, 1.0, 0.0, 0.0])
    semantic = torch.tensor([0.2, 0.6, 0.3, 0.3])
    adv = reference_advantages(outcome, semantic, num_generations=2, beta=0.4)
    s = math.sqrt(2 * 0.08**2)
    kappa = deviation_condition(outcome + 0.4 * semantic, 2)
    assert adv.tolist() == approx(
        [-0.08 / (s + 1e-4), 0.08 / (s + 1e-4), 0.0, 0.0], terms=ADVANTAGE_TERMS, condition=kappa
    )
    assert reference_advantages(outcome, semantic, 2, beta=0.0).tolist() == [0.0] * 4


def test_single_generation_groups_have_zero_advantage():
    adv = reference_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.1]), num_generations=1, beta=0.4)
    assert adv.tolist() == [0.0, 0.0]


def test_scale_none_and_batch():
    outcome, semantic = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4)
    assert reference_advantages(outcome, semantic, 2, 0.4, scale_rewards="none").tolist() == [0.5, -0.5, 0.0, 0.0]
    batch_std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std().item()  # sample std over the batch = 0.5
    adv = reference_advantages(outcome, semantic, 2, 0.4, scale_rewards="batch")
    expected = [0.5 / (batch_std + 1e-4), -0.5 / (batch_std + 1e-4), 0.0, 0.0]
    assert adv.tolist() == approx(expected, terms=ADVANTAGE_TERMS + 4)  # float32, and the std over the batch's 4
    with pytest.raises(ValueError, match="scale_rewards"):
        reference_advantages(outcome, semantic, 2, 0.4, scale_rewards="rank")


def test_beta_zero_is_trl_grpo_bit_for_bit():
    """The same computation as TRL's inline GRPO normalisation (grpo_trainer.py, sum_then_normalize)."""
    from trl.trainer.utils import nanstd

    torch.manual_seed(0)
    rewards = torch.rand(12).round()
    rewards[5] = torch.nan  # an unscorable row, as TRL marks it
    G = 3
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G)
    std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    trl_adv = torch.nan_to_num((rewards - mean) / (std + 1e-4), nan=0.0)
    ours = reference_advantages(rewards, torch.rand(12), G, beta=0.0)
    assert torch.equal(ours, trl_adv)


def test_nan_outcome_rows_are_ignored_and_get_zero_advantage():
    outcome = torch.tensor([1.0, float("nan"), 0.0])
    adv = reference_advantages(outcome, torch.zeros(3), num_generations=3, beta=0.4)
    assert adv[1] == 0.0 and adv[0] > 0 > adv[2]


def test_unscorable_rows_do_not_make_a_group_unequal():
    nan = float("nan")
    outcome = torch.tensor([1.0, nan, 1.0, 1.0, 0.0, 1.0, nan, nan, nan, 0.0, 0.0, 0.0])
    # groups of 3: [1, NaN, 1] equal; [1, 0, 1] not; [NaN, NaN, NaN] no signal, equal; [0, 0, 0] equal
    assert groups_outcome_all_equal(outcome, 3).tolist() == [True, False, True, True]
    assert groups_outcome_all_equal(torch.tensor([nan, 1.0, nan, 0.0]), 4).tolist() == [False]


# -------------------------------------------------------------------------------------------------- z_t scale
def test_scale_similarity():
    cos = torch.tensor([-0.2, 0.0, 0.3])
    assert torch.equal(scale_similarity(cos, "cosine"), cos)
    assert scale_similarity(cos, "clipscore").tolist() == approx([0.0, 0.0, 0.75], terms=2)  # float32 0.3, x 2.5
    with pytest.raises(ValueError, match="semantic_score"):
        scale_similarity(cos, "softmax")


# ---------------------------------------------------------------------------------------------------- config
def test_config_defaults_are_the_papers(tmp_path):
    config = MAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert (config.semantic_beta, config.semantic_lambda, config.advantage_estimator) == (0.4, 0.95, "mapo")
    assert config.no_tool_semantic == 0.0 and config.semantic_score == "cosine"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"advantage_estimator": "ppo"}, "advantage_estimator"),
        ({"semantic_score": "softmax"}, "semantic_score"),
        ({"hpo_fallback": "episode"}, "hpo_fallback"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
    ],
)
def test_config_rejects_bad_values(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        MAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)


# ------------------------------------------------------------------------ semantic reward of a batch (no policy)
class _StubVerifier:
    """Cosine = 0.5 for every pair, except labels containing 'nan' (NaN) and 'boom' (the call raises)."""

    def __init__(self):
        self.batches = []

    def similarity(self, labels, images):
        self.batches.append(list(labels))
        if any("boom" in label for label in labels):
            raise RuntimeError("cannot tokenize")
        return torch.tensor([float("nan") if "nan" in label else 0.5 for label in labels])

    def score(self, calls, scenes):  # as `ClipVerifier.score`: the labels against their crops
        return self.similarity([call.label for call in calls], [call.crop for call in calls])


def _trainer_with(verifier, **config):
    trainer = object.__new__(MAPOTrainer)  # only the semantic-reward path: no policy, no TRL state
    trainer.verifier, trainer._warned_unscorable = verifier, False
    defaults = {"semantic_lambda": 0.5, "semantic_score": "cosine", "no_tool_semantic": -1.0}
    trainer.args = SimpleNamespace(**(defaults | config))
    return trainer


def _rollout(env, labels_and_boxes):
    """Run calls on `env` and return the completion TRL would hold: assistant turns and list-valued tool messages."""
    completion = []
    for label, box in labels_and_boxes:
        completion.append({"role": "assistant", "content": "", "tool_calls": [{}]})
        completion.append(
            {"role": "tool", "name": "image_zoom_in_tool", "content": env.image_zoom_in_tool(box, label)}
        )
    return completion


def test_semantic_reward_of_a_batch_by_hand():
    envs = [ZoomInEnv(ToolConfig(), PixelBudget(3136, 12544, 28)) for _ in range(3)]
    for env in envs:
        env.reset(image=Image.new("RGB", (600, 400), "white"))
    completions = [
        _rollout(envs[0], [("red star", [0, 0, 50, 50]), ("blue dot", [10, 10, 60, 60])]),  # z = 0.5, 0.5
        _rollout(envs[1], [("red star", [50, 50, 10, 10]), ("nan label", [0, 0, 50, 50])]),  # rejected, NaN
        [{"role": "assistant", "content": "<answer>A</answer>"}],  # no call: T = 0
    ]
    verifier = _StubVerifier()
    metrics, extra = {}, {}
    trainer = _trainer_with(verifier)
    rewards = trainer._semantic_reward(
        completions,
        envs,
        log_metric=lambda k, v: metrics.setdefault(k, []).append(v),
        log_extra=lambda k, v: extra.setdefault(k, []).extend(v),
    )
    # lambda = 0.5: (0.5 * 0.5 + 0.5) / 2 = 0.375; (0.5 * 0 + 0) / 2 = 0 (rejected box and NaN both count 0, T = 2)
    assert rewards == [0.375, 0.0, -1.0]  # dyadic z_t (0.5, 0): eq. 2 is exact
    assert verifier.batches == [["red star", "blue dot", "nan label"]]  # one batched call, valid crops only
    assert metrics["semantic/unscorable_frac"] == [0.0, 0.0, 1.0]
    assert metrics["tools/zoom_error_rate"] == [0.0, 0.0, 1.0, 0.0]
    assert metrics["tools/zoom_calls_per_rollout"] == [2.0, 2.0, 0.0]
    assert extra["z_t"] == ["0.500 | 0.500", "0.000 | 0.000", ""]


def test_a_label_that_cannot_be_scored_costs_only_its_own_z_and_warns_once():
    from PIL import Image

    trainer = _trainer_with(_StubVerifier())
    crop = Image.new("RGB", (28, 28))
    calls = [ZoomCall(1, {}, label, (0, 0, 28, 28), crop) for label in ("red star", "boom", "blue dot")]
    scenes = [Scene(crop)] * 3
    with pytest.warns(UserWarning, match="could not score"):
        scores = trainer._score(calls, scenes)
    assert scores[0] == 0.5 and math.isnan(scores[1]) and scores[2] == 0.5
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second failure does not warn again
        trainer._score(calls[1:2], scenes[:1])
