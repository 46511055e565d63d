"""What a recipe picks by string (`utils.registry`): registered names, and import paths `package.module:name` that
plug outside code into `reward_funcs` and `semantic_verifier` without editing the repo; each bad spec fails at parse
naming the field and what is wrong. Plus the production verifiers' pure pieces: contrastive z_t, the verifier gate's
figures and the gradient-variance estimate, against numbers worked out by hand."""

import math
import textwrap

import pytest
import torch

from configs import MAPOConfig, ScriptArguments
from evaluation.verifier_check import gate
from mapo import scale_similarity
from rewards import REWARDS, check_columns, get_reward_funcs
from rewards.verifiers import VERIFIERS, build_verifier, verifier_factory
from tests.tolerance import FLOAT64, approx
from tools import ToolConfig
from utils.diagnostics import GradientVariance, gradient_variance

PLUGIN = """
import torch
from utils.registry import reads_columns

@reads_columns("answer", "difficulty")
def hard_reward(completions, answer, difficulty, **kwargs):
    return [float(d) for d in difficulty]

class ConstantVerifier:
    def __init__(self, config, device, seed):
        self.seed = seed
    def score(self, calls, scenes):
        return torch.full((len(calls),), 0.5)

ConstantVerifier.required_columns = ("target_bbox",)
NOT_CALLABLE = 3
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module outside the repo, importable as `my_plugin`, as a user's package would be."""
    (tmp_path / "my_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_plugin"


def test_registered_names_resolve_to_their_functions():
    assert get_reward_funcs(["outcome", "format"]) == [REWARDS["outcome"], REWARDS["format"]]
    assert verifier_factory("clip") is VERIFIERS["clip"]


def test_an_import_path_plugs_in_a_reward_and_a_verifier_with_their_columns(plugin):
    (reward,) = get_reward_funcs([f"{plugin}:hard_reward"])
    assert reward.__name__ == "hard_reward"  # TRL logs it as rewards/hard_reward/mean
    assert reward([None, None], answer=["a", "b"], difficulty=[1, 0]) == [1.0, 0.0]
    verifier = build_verifier(f"{plugin}:ConstantVerifier", ToolConfig(), seed=7)
    assert verifier.seed == 7 and verifier.score([None] * 3, [None] * 3).tolist() == [0.5] * 3
    check_columns(["prompt", "answer", "difficulty", "target_bbox"], [f"{plugin}:hard_reward"], "clip", "d")
    with pytest.raises(
        ValueError,
        match=rf"data/x: reward {plugin}:hard_reward needs \['difficulty'\]; "
        rf"semantic_verifier {plugin}:ConstantVerifier needs \['target_bbox'\], which the dataset lacks",
    ):
        check_columns(
            ["prompt", "answer"], ["outcome", f"{plugin}:hard_reward"], f"{plugin}:ConstantVerifier", "data/x"
        )
    check_columns(["prompt", "image", "answer"], ["outcome"], "clip", "d")  # CLIP reads only the calls


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", r"reward_funcs: unknown 'nope'; known: \['deepeyes', 'format', 'gated_outcome', 'judge', 'outcome', "
         r"'simulated_reader', 'target_in_view', 'tool_bonus'\], or an import path 'package.module:name'"),
        ("no_such_module_xyz:f", r"reward_funcs: 'no_such_module_xyz:f': module 'no_such_module_xyz' does not import"),
        ("my_plugin:missing", r"reward_funcs: 'my_plugin:missing': 'my_plugin' has no attribute 'missing'"),
        ("my_plugin:NOT_CALLABLE", r"reward_funcs: 'my_plugin:NOT_CALLABLE' is a int, not a function or class"),
        ("my_plugin:", r"reward_funcs: unknown 'my_plugin:'"),
    ],
)  # fmt: skip
def test_a_bad_reward_spec_fails_naming_the_field_and_what_is_wrong(plugin, spec, message):
    with pytest.raises(ValueError, match=message):
        get_reward_funcs(["outcome", spec])


def test_a_bad_spec_in_a_recipe_fails_when_the_recipe_is_parsed(plugin):
    assert (
        ScriptArguments(reward_funcs=["outcome", f"{plugin}:hard_reward"]).reward_funcs[1] == f"{plugin}:hard_reward"
    )
    with pytest.raises(ValueError, match=r"reward_funcs: 'my_plugin:missing'"):
        ScriptArguments(reward_funcs=[f"{plugin}:missing"])
    assert verifier_factory(f"{plugin}:ConstantVerifier").__name__ == "ConstantVerifier"
    with pytest.raises(ValueError, match=r"semantic_verifier: unknown 'oracle'; known: \['clip'\]"):
        MAPOConfig(output_dir="unused", semantic_verifier="oracle", use_cpu=True, report_to="none")


def test_contrastive_z_is_the_crop_score_minus_the_whole_image_score():
    crop, whole = torch.tensor([0.5, 0.2, 0.9]), torch.tensor([0.1, 0.4, 0.9])
    # float32: the inputs' rounding and one subtraction, at the scores' size (<= 1)
    assert scale_similarity(crop, "contrastive", whole).tolist() == approx([0.4, -0.2, 0.0], terms=2, scale=1.0)
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
    # float64 means of 3 to 6 values: a few roundings each
    assert result.auc == approx(3.5 / 6, FLOAT64, terms=8)
    assert result.mean_rank == approx((1 + 2 + 2.5) / 3, FLOAT64, terms=4)
    assert result.right_z == approx((0.9 + 0.3 + 0.4) / 3, FLOAT64, terms=4)
    # column means: a 0.5, b 0.333, c 0.567: "c" is the best constant, beating the right label on crops 1 (0.8 > 0.3)
    assert result.best_constant == "c" and result.best_constant_z == approx(1.7 / 3, FLOAT64, terms=4)
    assert result.constant_wins == approx(1 / 3, FLOAT64, terms=4)
    assert not result.passed  # AUC 0.58 < 0.75, and the constant pays more than the right label
    # passing also needs the walk axis: each right label higher on its framing crop than on its miss crop
    walk = (torch.ones(3), torch.zeros(3))
    good = gate(torch.eye(3, dtype=torch.float64), [0, 1, 2], ["a", "b", "c"], "cosine", walk)
    assert good.auc == 1.0 and good.mean_rank == 1.0 and good.walk_auc == 1.0 and good.passed


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
    # Welford in float64 over 3 small-integer gradients: a few roundings per step
    assert recorded == [approx({"gradvar/trace": 4.0, "gradvar/relative": 4.0 / 13}, FLOAT64, terms=12)]
    stacked = torch.stack(gradients).double()
    assert stacked.var(dim=0).sum().item() == approx(4.0, FLOAT64, terms=8)  # the textbook estimate agrees
    assert math.isinf(gradient_variance(torch.zeros(2), torch.ones(2), 2)["gradvar/relative"])
    with pytest.raises(ValueError, match="at least 2 batches"):
        GradientVariance(1, recorded.append)
