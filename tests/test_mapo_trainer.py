"""MAPOTrainer on the tiny models, CPU: forced tool calls (`scripted.force_tool_calls`), real crops, real CLIP
scoring, real optimizer steps."""

import logging
import math
import re
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import yaml
from lora_probe import StepProbe
from transformers import TrainerCallback
from trl import GRPOTrainer, ModelConfig

import rewards
import rl
import utils.policy
from configs import ScriptArguments, TrajectoryArguments
from data.synthetic import build_synthetic
from data.task import SYSTEM_PROMPTS, normalize
from data.trajectories import plan_calls
from mapo_trainer import (
    SEMANTIC_REWARD_NAME,
    MAPOConfig,
    MAPOTrainer,
    RewardColumn,
    reference_advantages,
    semantic_reward,
)
from repairs.resume import resume_checkpoint
from research import rewards as world
from rewards import get_reward_funcs
from tests.tolerance import ADVANTAGE_TERMS, TINY_POLICY_FORWARD, approx, assert_norm_close, deviation_condition
from tiny.scripted import DEFAULT_BOX, ForcedMAPOTrainer, tiny_trainer, tool_call_turn
from tiny.scripted import DEFAULT_LABELS as LABELS
from tools import ToolConfig, ZoomInEnv, crop_box, read_record
from utils.models import load_model, load_processor, pixel_budget
from utils.recipes import load_recipe, parse_args_and_record

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def train_dataset():
    return build_synthetic(4, seed=0, split="train")


def make_trainer(tiny_kit, dataset, tmp_path, trainer_cls=MAPOTrainer, **overrides):
    return tiny_trainer(trainer_cls, tiny_kit, dataset, tmp_path, **overrides)


def spy_on_verifier(trainer):
    calls = []
    original = trainer.verifier.similarity

    def similarity(labels, images):
        out = original(labels, images)
        calls.append((list(labels), list(images), out.clone()))
        return out

    trainer.verifier.similarity = similarity
    return calls


def test_mapo_run_scores_real_crops_and_trains(tiny_kit, train_dataset, tmp_path, caplog):
    trainer = make_trainer(tiny_kit, train_dataset, tmp_path)
    scored = spy_on_verifier(trainer)
    batches = []
    generate_and_score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(generate_and_score(inputs)) or batches[-1]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with caplog.at_level(logging.WARNING, logger="utils.diagnostics"):
        trainer.train()
    assert not [r for r in caplog.records if r.name == "utils.diagnostics"]  # calls and advantages: nothing to warn

    # One batched CLIP call per generation batch (per optimizer step here), never one per tool call.
    assert len(scored) == 2
    labels, crops, cosine = scored[-1]
    assert sorted(set(labels)) == sorted(LABELS) and len(labels) == 4  # every rollout's call was scored
    # ...on the crops the environments really produced and returned to the model
    envs = trainer._environment_pool[None]
    env_crops = [call.crop for env in envs for call in env.calls]
    assert all(any(crop is c for c in env_crops) for crop in crops)
    assert all(call.ok and call.box is not None for env in envs for call in env.calls)
    # R_sem logged for the last batch is eq. 2 of those scores (T = 1: R_sem = z_1)
    logged_sem = list(trainer._logs["rewards"][SEMANTIC_REWARD_NAME])[-4:]
    # the same float32 cosines through the same eq. 2: at most one float32 rounding of each
    assert logged_sem == approx([semantic_reward([z], 0.95) for z in cosine.tolist()], terms=1, scale=1.0)

    # The advantages trained on are MAPO's composite, group-normalised (eq. 3).
    outcome = torch.tensor(list(trainer._logs["rewards"]["outcome_reward"])[-4:])
    fmt = torch.tensor(list(trainer._logs["rewards"]["format_reward"])[-4:])
    expected = reference_advantages(outcome + fmt, torch.tensor(logged_sem), num_generations=2, beta=0.4)
    kappa = deviation_condition(outcome + fmt + 0.4 * torch.tensor(logged_sem), 2)
    assert list(trainer._logs["advantages"])[-4:] == approx(expected.tolist(), terms=ADVANTAGE_TERMS, scale=kappa)

    # Tool responses (crop pads included) are out of the loss; the model's own turns are in it.
    tokenizer = trainer.processing_class.tokenizer
    batch = batches[-1]
    for ids, keep, tool in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"]):
        trained = tokenizer.decode(ids[(keep * tool).bool()])
        masked = tokenizer.decode(ids[(keep * (1 - tool)).bool()])
        assert "<tool_call>" in trained and "<answer>" in trained and "<tool_response>" not in trained
        assert "<tool_response>" in masked and "<|image_pad|>" in masked and "<|image_pad|>" not in trained

    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "no parameter changed"
    logged = {k for entry in trainer.state.log_history for k in entry}
    for key in (
        "rewards/semantic/mean",
        "rewards/semantic/std",
        "rewards/outcome_reward/mean",
        "semantic/z_mean",
        "semantic/label_words",
        "semantic/unscorable_frac",
        "tools/zoom_calls_per_rollout",
        "tools/zoom_error_rate",
        "mapo/frac_groups_outcome_all_equal",
        "mapo/advantage_std",
    ):
        assert key in logged, key
    last = [e for e in trainer.state.log_history if "tools/zoom_calls_per_rollout" in e][-1]
    assert last["tools/zoom_calls_per_rollout"] == 1.0 and last["tools/zoom_error_rate"] == 0.0
    assert last["semantic/label_words"] == 2.0


def format_of_odd_rows(completions, id, **kwargs):
    """The format reward, paid only on rows whose id is odd: a group's advantages then depend on which row it is.
    (The scripted completions depend only on their position, so any other reward here is blind to data order.)"""
    return [r * (int(i[-1]) % 2) for r, i in zip(rewards.format_reward(completions), id)]


def test_grpo_estimator_reproduces_stock_grpo(tiny_kit, train_dataset, tmp_path):
    """advantage_estimator='grpo' weights R_sem by 0: same rows in the same order, advantages, loss and weights as
    TRL's GRPOTrainer on the same seed."""
    common = dict(reward_funcs=[format_of_odd_rows], max_steps=1)
    stock = make_trainer(tiny_kit, train_dataset, tmp_path / "stock", trainer_cls=GRPOTrainer, **common)
    stock.train()
    ours = make_trainer(tiny_kit, train_dataset, tmp_path / "ours", advantage_estimator="grpo", **common)
    ours.train()
    assert list(ours._logs["prompt"]) == list(stock._logs["prompt"])  # the same rows, in stock TRL's order
    advantages = list(stock._logs["advantages"])
    assert any(a != 0 for a in advantages) and any(a == 0 for a in advantages)  # rows with and without signal
    assert list(ours._logs["advantages"]) == advantages
    loss = [e["loss"] for e in stock.state.log_history if "loss" in e]
    assert loss and loss == [e["loss"] for e in ours.state.log_history if "loss" in e]
    stock_weights = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        assert torch.equal(param, stock_weights[name]), name
    assert "rewards/semantic/mean" in ours.state.log_history[0]  # still measured, with weight 0


class ProbedMAPOTrainer(ForcedMAPOTrainer):
    """`rl.py`'s trainer with scripted calls and a `lora_probe.StepProbe` (`self.step_probe`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_probe = StepProbe(self)


def test_lora_trains_adapters_over_a_frozen_base_without_noise_or_vision_backward(tiny_kit, tmp_path):
    """`rl.py` with LoRA, gradient checkpointing (TRL then hooks Qwen2.5-VL's `patch_embed` too) and live LoRA dropout
    turned off by `disable_dropout` (TRL generates in train mode): only adapters change, every adapter gets a gradient,
    no vision activation requires grad, and no dropout call drops anything while rollouts are generated."""
    argv = ["--config", RECIPES[0], "--output_dir", str(tmp_path), "--max_steps", "2", "--num_samples", "2"]
    argv += ["--model_name_or_path", str(tiny_kit["policy"]), "--clip_model", str(tiny_kit["clip"])]
    argv += ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    argv += ["--lora_dropout", "0.05", "--disable_dropout", "true", "--gradient_checkpointing", "true"]
    trainer = rl.main(*parse_args_and_record(PARSER_TYPES, argv), trainer_cls=ProbedMAPOTrainer)
    base = dict(load_model(tiny_kit["policy"], dtype=torch.float32).named_parameters())
    params = dict(trainer.model.named_parameters())
    lora = {n for n in params if "lora_" in n}
    assert lora and {n for n, p in params.items() if p.requires_grad} == lora
    for name, param in params.items():
        if name not in lora:
            assert torch.equal(param.detach(), base[name.replace("base_model.model.", "").replace(".base_layer", "")])
    probe = trainer.step_probe
    assert probe.vision_calls and not probe.vision_requiring_grad
    first, second = probe.gradients  # step 1: B is zero, so only B's gradient is; step 2: every adapter's
    assert all(first[n] for n in lora if "lora_B" in n) and all(second[n] for n in lora), second
    assert probe.dropout_calls and not probe.live_dropout_calls  # LoRA's dropouts ran, at p = 0


def test_overflowing_tool_response_is_not_scored(tiny_kit, train_dataset, tmp_path):
    """With a completion budget too small for the tool response, TRL runs the tool, then drops its response; the
    environment recorded the call, but it is not in the trained completion, so it is neither scored nor counted."""
    trainer = make_trainer(tiny_kit, train_dataset, tmp_path, max_completion_length=60, max_steps=1)
    scored = spy_on_verifier(trainer)
    trainer.train()
    envs = trainer._environment_pool[None]
    assert all(len(env.calls) == 1 for env in envs)  # the tool ran...
    last = [e for e in trainer.state.log_history if "tools/zoom_calls_per_rollout" in e][-1]
    assert last["tools/zoom_calls_per_rollout"] == 0.0  # ...but no call survived into the completions
    assert all(not labels for labels, _, _ in scored)
    assert list(trainer._logs["rewards"][SEMANTIC_REWARD_NAME])[-4:] == [0.0] * 4  # no_tool_semantic


def test_the_token_budget_is_checked_before_any_engine_or_verifier_loads(
    tiny_kit, train_dataset, tmp_path, monkeypatch
):
    """The warning comes before TRL's `__init__` (which builds a colocated vLLM engine) and before CLIP loads."""

    def engine(self, *args, **kwargs):
        raise RuntimeError("TRL's __init__ reached")

    monkeypatch.setattr(GRPOTrainer, "__init__", engine)
    with pytest.warns(UserWarning, match="over max_completion_length=60"), pytest.raises(RuntimeError, match="TRL"):
        make_trainer(tiny_kit, train_dataset, tmp_path, max_completion_length=60)


def test_the_environment_comes_from_tool_config_only(tiny_kit, train_dataset, tmp_path):
    processor = load_processor(str(tiny_kit["policy"]))
    kwargs = dict(
        model=load_model(str(tiny_kit["policy"])),
        reward_funcs=get_reward_funcs(["outcome"]),
        args=MAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False),
        train_dataset=train_dataset,
        processing_class=processor,
    )
    with pytest.raises(ValueError, match="tool_config"):
        MAPOTrainer(**kwargs, environment_factory=lambda: None)
    with pytest.raises(ValueError, match="max_pixels=12544"):  # a budget the processor was not loaded with
        MAPOTrainer(**kwargs, tool_config=ToolConfig(max_pixels=28 * 28 * 64, clip_model=str(tiny_kit["clip"])))


class LengthPenaltyMAPO(MAPOTrainer):
    """Eq. 3 changed where the docs say to change it: R_sem weighted 1, plus a column the recipe does not name."""

    def reward_columns(self):
        *outcome, semantic = super().reward_columns()
        penalty = RewardColumn("length_penalty", lambda completions, **kwargs: [-0.01] * len(completions), 0.5)
        return [*outcome, penalty, semantic._replace(weight=1.0)]


def test_eq3_columns_and_weights_come_from_reward_columns(tiny_kit, train_dataset, tmp_path):
    default = make_trainer(tiny_kit, train_dataset, tmp_path / "default")
    assert default.reward_func_names == ["outcome_reward", "format_reward", SEMANTIC_REWARD_NAME]
    assert default.reward_weights.tolist() == approx([1.0, 1.0, 0.4], terms=1)  # float32 weights
    changed = make_trainer(tiny_kit, train_dataset, tmp_path / "changed", trainer_cls=LengthPenaltyMAPO)
    assert changed.reward_func_names == ["outcome_reward", "format_reward", "length_penalty", SEMANTIC_REWARD_NAME]
    assert changed.reward_weights.tolist() == [1.0, 1.0, 0.5, 1.0]  # exact in float32
    assert len(changed.reward_funcs) == len(changed.reward_processing_classes) == 4
    assert changed.reward_funcs[-1] == changed._semantic_reward  # R_sem stays last


def test_unscorable_outcome_rows_get_zero_advantage_as_in_stock_grpo(tiny_kit, train_dataset, tmp_path):
    """A reward returning None (a judge that timed out) makes its row unscorable: stock GRPO leaves it out of its
    group's statistics and gives it advantage 0. R_sem must not make it scorable, under 'grpo' or 'mapo'."""

    def flaky(completions, **kwargs):
        return [1.0, None, 1.0, 0.0][: len(completions)]

    runs = {}
    for name, cls, extra in (
        ("stock", GRPOTrainer, {}),
        ("grpo", MAPOTrainer, {"advantage_estimator": "grpo"}),
        ("mapo", MAPOTrainer, {"advantage_estimator": "mapo"}),
    ):
        trainer = make_trainer(
            tiny_kit, train_dataset, tmp_path / name, cls, reward_funcs=[flaky], max_steps=1, **extra
        )
        trainer.train()
        runs[name] = trainer
    stock = list(runs["stock"]._logs["advantages"])
    # the numbers, from TRL itself: (1 - 1/2) / (std([1, 0]) + 1e-4), std unbiased
    half = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert stock == approx([0.0, 0.0, half, -half], terms=ADVANTAGE_TERMS, scale=1.0)
    assert list(runs["grpo"]._logs["advantages"]) == stock
    mapo = runs["mapo"]
    semantic = list(mapo._logs["rewards"][SEMANTIC_REWARD_NAME])
    assert math.isnan(semantic[1])  # R_sem of the unscorable row is withheld too
    expected = reference_advantages(torch.tensor([1.0, float("nan"), 1.0, 0.0]), torch.tensor(semantic), 2, beta=0.4)
    advantages = list(mapo._logs["advantages"])
    assert advantages[:2] == [0.0, 0.0]  # alone in its group: no signal; the unscorable row: none either
    kappa = deviation_condition(torch.tensor([1.0, float("nan"), 1.0, 0.0]) + 0.4 * torch.tensor(semantic), 2)
    assert advantages == approx(expected.tolist(), terms=ADVANTAGE_TERMS, scale=kappa)
    logged = [e for e in mapo.state.log_history if "mapo/frac_unscorable" in e][-1]
    assert logged["mapo/frac_unscorable"] == 0.25


def test_a_run_that_cannot_learn_says_so_once(tiny_kit, train_dataset, tmp_path, caplog):
    """Issue 41: the tiny policy without SFT (not scripted), made never to end a turn (no end-of-turn before 12 tokens:
    `min_new_tokens`) under a 12-token budget: every completion clipped, no zoom-in call, every advantage 0 (loss and
    grad_norm 0). The first window (of 1 step here: `signal_window_steps`) warns with each cause and the fields to
    change; the next, 1 step later, does not repeat it (`SIGNAL_WARN_EVERY`)."""
    model = load_model(str(tiny_kit["policy"]), dtype=torch.float32)
    processor = load_processor(str(tiny_kit["policy"]))
    trainer = make_trainer(
        tiny_kit,
        train_dataset,
        tmp_path,
        model=model,
        processor=processor,
        max_completion_length=12,
        generation_kwargs={"min_new_tokens": 12},
        max_steps=2,
        signal_window_steps=1,
    )
    with caplog.at_level(logging.WARNING, logger="utils.diagnostics"):
        trainer.train()
    steps = [e for e in trainer.state.log_history if "adv/zero_frac" in e]
    assert len(steps) == 2 and all(
        (e["completions/clipped_ratio"], e["tools/zoom_calls_per_rollout"], e["adv/zero_frac"]) == (1, 0, 1)
        for e in steps
    )  # the run produces the three cases
    (message,) = [r.getMessage() for r in caplog.records if r.name == "utils.diagnostics"]
    assert message.startswith(
        "step 1: this run is not learning as it should over step 1 (next such warning in 50 steps at the earliest):"
    )
    assert "100% of completions ran into max_completion_length=12 without ending their turn" in message
    assert "0 zoom-in calls per rollout: the policy has not learned the tool's format" in message
    assert "100% of advantages are 0 (adv/zero_frac), so loss and grad_norm are 0" in message


DEEPER = "deeper still"  # the label of the rollouts scripted to call the tool past max_tool_calling_iterations


def test_over_turn_rollouts_leave_the_loss_but_stay_in_their_groups(tiny_kit, train_dataset, tmp_path):
    """`mask_over_turn`, as Mini-o3's `ignore_exceed`: half the rollouts (those whose first call is labelled DEEPER)
    keep calling the tool, so after max_tool_calling_iterations = 2 rounds their last turn is a call that never ran.
    Their tokens leave the loss and its normaliser; their rewards still make their groups' statistics."""
    trainer = make_trainer(
        tiny_kit,
        train_dataset,
        tmp_path,
        max_steps=1,
        mask_over_turn=True,
        loss_type="grpo",  # the paper's: each rollout averaged over its tokens, then over the rollouts
        script={"labels": ("red circle", DEEPER), "depth": lambda context: 3 if DEEPER in context else 1},
    )
    batches = []
    generate_and_score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(generate_and_score(inputs)) or batches[-1]
    trainer.train()

    batch, tokenizer = batches[-1], trainer.processing_class.tokenizer
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    over = []
    for ids, keep in zip(batch["completion_ids"], batch["completion_mask"]):
        text = tokenizer.decode(ids[keep.bool()])
        over.append(DEEPER in text)
        if DEEPER in text:  # two calls ran, the third was never executed: the iteration limit, not the budget
            assert text.count("<tool_call>") == 3 and text.count("<tool_response>") == 2 and "<answer>" not in text
        else:
            assert text.count("<tool_call>") == 1 and "<answer>" in text
    assert over == [False, True, False, True]  # one over-turn rollout in each group of 2
    assert [int(row.sum()) for row in loss_mask[torch.tensor(over)]] == [0, 0]  # out of the loss
    assert all(row.sum() > 0 for row in loss_mask[~torch.tensor(over)])
    assert int(batch["num_items_in_batch"]) == int(loss_mask.sum())  # the normaliser counts trained tokens only
    assert all(row.sum() > 0 for row in batch["completion_mask"])  # attention still sees the whole rollout

    # The group statistics still count the over-turn rollouts (Mini-o3 keeps them in its group mean and std).
    outcome = torch.tensor(list(trainer._logs["rewards"]["outcome_reward"])[-4:])
    fmt = torch.tensor(list(trainer._logs["rewards"]["format_reward"])[-4:])
    semantic = torch.tensor(list(trainer._logs["rewards"][SEMANTIC_REWARD_NAME])[-4:])
    expected = reference_advantages(outcome + fmt, semantic, num_generations=2, beta=0.4)
    kappa = deviation_condition(outcome + fmt + 0.4 * semantic, 2)
    assert list(trainer._logs["advantages"])[-4:] == approx(expected.tolist(), terms=ADVANTAGE_TERMS, scale=kappa)
    assert all(abs(a) > 1e-6 for a in expected[~torch.tensor(over)].tolist())  # the answered rollouts learn from it
    logged = [e for e in trainer.state.log_history if "tools/over_turn_frac" in e][-1]
    assert logged["tools/over_turn_frac"] == 0.5

    # The gradient's scale (issue 37). Under grpo, TRL means the rows' terms over the micro-batch, the masked rows
    # among them as zeros: half of these rows are over-turn, so without the repair every step's gradient is halved.
    # The reference: the same batch with nothing masked and the over-turn rows' advantages zeroed, whose loss is
    # (1/4) x the kept rows' terms (no KL: beta 0); the masked loss must be (1/2) x the same terms, twice it.
    model = trainer.model
    model.train()

    def gradient(inputs):
        model.zero_grad()
        trainer._compute_loss(model, inputs).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    kept = (~torch.tensor(over)).float()
    reference = dict(batch, kept_row_scale=None, advantages=batch["advantages"] * kept)
    reference["tool_mask"] = torch.where(kept.bool().unsqueeze(1), batch["tool_mask"], batch["completion_mask"])
    masked, unmasked = gradient(batch), gradient(reference)
    assert unmasked.norm() > 0
    # The same forward on the same batch, the loss x2 before the backward: normwise, the backward's reductions.
    assert_norm_close(masked, 2 * unmasked, terms=TINY_POLICY_FORWARD)


# ----------------------------------------------------------------------------------------------- recipes
REAL_RECIPES = sorted(str(p) for p in Path("recipes").glob("*/rl/*.yaml") if p.parts[1] != "tiny")  # every model's
RECIPES = ["recipes/tiny/rl/config_mapo.yaml", *REAL_RECIPES]
PARSER_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipes_parse_into_the_dataclasses(recipe):
    # Through the entry scripts' parser (recipe bases merged). bf16 cannot be instantiated on a CPU-only machine, nor
    # vLLM without vLLM installed; everything else is parsed as written.
    argv = ["--config", recipe, "--bf16", "false", "--use_vllm", "false"]
    script_args, config, model_args, tool = parse_args_and_record(PARSER_TYPES, argv)
    assert config.advantage_estimator == "mapo" and config.semantic_beta == 0.4 and config.semantic_lambda == 0.95
    assert model_args.model_name_or_path and tool.clip_resize == "pad"
    if "deepeyes" not in recipe:  # the paper's recipe: a binary R_out, each trajectory averaged over its own tokens
        assert script_args.reward_funcs == ["gated_outcome"] and config.loss_type == "grpo"
        assert config.scale_rewards == "group" and config.beta == 0.0


@pytest.mark.parametrize("recipe", RECIPES[1:])
def test_mapo_values_in_real_recipes_cite_the_paper(recipe):
    """Each MAPO value cites its section where it is written: in the shared base file (recipes/mapo_paper.yaml) that
    the recipe's `base:` chain takes it from."""
    origin = load_recipe(recipe).origin
    for key in ("advantage_estimator", "semantic_beta", "semantic_lambda", "semantic_score"):
        lines = {line.split(":")[0]: line for line in open(origin[key]) if not line.startswith((" ", "#"))}
        assert re.search(r"#.*(eq\. \d|section \d)", lines[key]), f"{origin[key]}: {key} cites no paper section"


def test_unknown_recipe_key_fails_at_start_with_its_name(tmp_path):
    recipe = yaml.safe_load(open(RECIPES[0]))
    recipe["semantik_beta"] = 0.3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ValueError, match="semantik_beta"):
        parse_args_and_record(PARSER_TYPES, ["--config", str(path)])


def test_rl_entry_point_trains_and_saves(tiny_kit, tmp_path):
    argv = ["--config", RECIPES[0], "--output_dir", str(tmp_path), "--max_steps", "1", "--num_samples", "2"]
    argv += ["--model_name_or_path", str(tiny_kit["policy"]), "--clip_model", str(tiny_kit["clip"])]
    trainer = rl.main(*parse_args_and_record(PARSER_TYPES, argv))
    assert trainer.state.global_step == 1
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "chat_template.jinja").exists()
    assert any("rewards/semantic/mean" in e for e in trainer.state.log_history)


def test_rl_entry_point_trains_the_tiny_qwen3_vl_in_its_own_box_convention(tiny_kit, tmp_path):
    """rl.py with transformers generation on the tiny Qwen3-VL, its tool in Qwen3-VL's 0-1000 frame (the zoom-in calls
    scripted, `scripts.rl_forced`): the prompts' system turn says that frame, each scripted box is cropped where the
    grid puts it, the crops are scored, and the checkpoint records the convention and its processor's budget."""
    argv = ["--config", RECIPES[0], "--output_dir", str(tmp_path), "--max_steps", "1", "--num_samples", "2"]
    argv += ["--model_name_or_path", str(tiny_kit["qwen3_vl"]), "--clip_model", str(tiny_kit["clip"])]
    argv += ["--box_convention", "relative_1000"]
    trainer = rl.main(*parse_args_and_record(PARSER_TYPES, argv), trainer_cls=ForcedMAPOTrainer)
    assert trainer.state.global_step == 1
    assert all(row["prompt"][0]["content"] == SYSTEM_PROMPTS["relative_1000"] for row in trainer.train_dataset)
    last = [e for e in trainer.state.log_history if "tools/zoom_calls_per_rollout" in e][-1]
    assert last["tools/zoom_calls_per_rollout"] == 1.0 and last["tools/zoom_error_rate"] == 0.0
    assert not math.isnan(last["rewards/semantic/mean"])
    envs = [env for env in trainer._environment_pool[None] if env.calls]  # the last batch's rollouts
    assert len(envs) == 4
    for env in envs:
        assert env.box_frame == (1000, 1000)
        (call,) = env.calls
        assert call.box == crop_box(
            env.image.size, list(DEFAULT_BOX), seen_size=(1000, 1000), min_side=28, max_aspect=100
        )
    record = read_record(tmp_path)["tool"]
    assert record["box_convention"] == "relative_1000" and record["max_pixels"] == 32 * 32 * 16


class StopAt(TrainerCallback):
    """Stops training after `step` (as a killed job would, once its checkpoint is saved)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


RESUMED_KEYS = ("loss", "reward", "rewards/semantic/mean", "rewards/outcome_reward/mean", "semantic/z_mean")


def test_a_resumed_run_logs_what_an_uninterrupted_one_does(tiny_kit, train_dataset, tmp_path):
    config = dict(max_steps=4, save_strategy="steps", save_steps=2, learning_rate=1e-3)
    whole = make_trainer(tiny_kit, train_dataset, tmp_path / "whole", **config)
    whole.train()
    stopped = make_trainer(tiny_kit, train_dataset, tmp_path / "run", callbacks=[StopAt(2)], **config)
    stopped.train()
    assert stopped.state.global_step == 2 and (tmp_path / "run" / "checkpoint-2").is_dir()
    assert read_record(tmp_path / "run" / "checkpoint-2")["rollout"]["max_completion_length"] == 320
    resumed = make_trainer(tiny_kit, train_dataset, tmp_path / "run", resume_from_checkpoint="true", **config)
    resumed.train(resume_from_checkpoint=resume_checkpoint(resumed.args))
    assert resumed.state.global_step == 4

    def late_steps(trainer):
        return [e for e in trainer.state.log_history if e.get("step") in (3, 4) and "loss" in e]

    expected, got = late_steps(whole), late_steps(resumed)
    assert [e["step"] for e in got] == [3, 4]
    # Float32 weights, optimizer state and RNG reload exactly, and the resumed steps run the same operations on the
    # same values in the same process (same threads, same shapes): bitwise the same. No tolerance between exact and
    # a whole step would be argued: Adam turns a rounding difference in a near-zero gradient entry into a full step.
    for key in RESUMED_KEYS:
        assert [e[key] for e in got] == [e[key] for e in expected], key
    # The checkpoint's weights were really loaded (transformers alone loads none of them: `resume.py`), and the same
    # data in the same order trained them on: the final weights agree.
    final = dict(whole.model.named_parameters())
    for name, param in resumed.model.named_parameters():
        assert torch.equal(param, final[name]), name


def record_batches(trainer) -> list[list[str]]:
    """The dataset ids of each generation batch the trainer draws (one per optimizer step here)."""
    seen = []
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: seen.append([x["id"] for x in inputs]) or generate(inputs)
    return seen


def test_a_run_resumed_mid_epoch_draws_the_same_next_batches(tiny_kit, train_dataset, tmp_path):
    """4 rows, 2 prompts a step: an epoch is 2 steps. Resumed from step 1's checkpoint, inside epoch 0, the run draws
    the uninterrupted run's batches for steps 2 (the rest of epoch 0) and 3 (epoch 1), and ends on its weights."""
    config = dict(max_steps=3, save_strategy="steps", save_steps=1, learning_rate=1e-3)
    whole = make_trainer(tiny_kit, train_dataset, tmp_path / "whole", **config)
    whole_batches = record_batches(whole)
    whole.train()
    (tmp_path / "run").mkdir()
    shutil.copytree(tmp_path / "whole" / "checkpoint-1", tmp_path / "run" / "checkpoint-1")  # as if stopped at 1
    resumed = make_trainer(tiny_kit, train_dataset, tmp_path / "run", resume_from_checkpoint="true", **config)
    resumed_batches = record_batches(resumed)
    resumed.train(resume_from_checkpoint=resume_checkpoint(resumed.args))
    assert len(whole_batches) == 3 and whole_batches[0] != whole_batches[1]  # the epoch's two halves differ
    assert resumed_batches == whole_batches[1:]
    final = dict(whole.model.named_parameters())
    for name, param in resumed.model.named_parameters():  # bitwise, as above
        assert torch.equal(param, final[name]), name


def test_bf16_full_fine_tuning_on_one_process_fails_at_start(tiny_kit, tmp_path, monkeypatch):
    """Before any model loads: a real node would otherwise spend minutes loading the policy, CLIP and vLLM first."""
    argv = ["--config", RECIPES[0], "--output_dir", str(tmp_path), "--num_samples", "2", "--dtype", "bfloat16"]
    argv += ["--model_name_or_path", str(tiny_kit["policy"]), "--clip_model", str(tiny_kit["clip"])]
    loaded = []
    monkeypatch.setattr(utils.policy, "load_model", lambda *args, **kwargs: loaded.append(args))
    with pytest.raises(ValueError, match=r"in bfloat16 and the optimizer keeps no fp32 master copy.*dtype: float32"):
        rl.main(*parse_args_and_record(PARSER_TYPES, argv))
    assert not loaded
    assert not (tmp_path / "model.safetensors").exists()  # nothing trained, nothing saved


READER = "research.rewards:simulated_reader_reward"


def test_the_experiment_controls_score_scripted_calls_from_the_scene(tiny_kit, tmp_path):
    """One row four times, every rollout zooming on the row's gold box, alternately with the right label and a wrong
    one: the exact verifier gives z = 1, 0, 1, 0 and the walk verifier 1 throughout (so does its density control, the
    walk's batch mean); the shuffled one a permutation of the exact scores; contrastive CLIP the crop's cosine minus
    the whole image's; the simulated reader pays by its seeded draws; the gradient variance is logged after its
    batches."""
    one = build_synthetic(1, seed=0, split="train")
    dataset = datasets.concatenate_datasets([one] * 4)
    row = one[0]
    processor = load_processor(str(tiny_kit["policy"]))
    env = ZoomInEnv(ToolConfig(), pixel_budget(processor))
    (gold,) = plan_calls(
        row, row["target_label"], env, 1, np.random.default_rng(0), TrajectoryArguments(gold_box="region")
    )
    labels = (row["target_label"], "the purple hexagon and the red star")
    assert normalize(labels[1]) != normalize(row["target_label"])
    script = {"labels": labels, "first_turn": lambda i, label: tool_call_turn(label, gold["bbox_2d"])}

    def train(name, **extra):
        trainer = make_trainer(tiny_kit, dataset, tmp_path / name, reward_funcs=[READER], script=script, **extra)
        trainer.train()
        return trainer

    exact = train("exact", semantic_verifier="research.verifiers:exact", max_steps=2, gradient_variance_batches=2)
    r_sem = list(exact._logs["rewards"][SEMANTIC_REWARD_NAME])
    assert r_sem == [1.0, 0.0, 1.0, 0.0]  # the last batch's; T = 1: R_sem = z_1
    # Every call framed the target, so the reader draws at READER_HIT_P; odd rows' answers skip <think>: format 0.
    # The last batch was drawn at global step 1.
    reader = list(exact._logs["rewards"]["simulated_reader_reward"])
    expected = [float(i % 2 == 0 and world.reader_draw(row["id"], 1, i) < world.READER_HIT_P) for i in range(4)]
    assert reader == expected
    variance = [e for e in exact.state.log_history if "gradvar/trace" in e]
    assert [e["step"] for e in variance] == [2] and variance[0]["gradvar/trace"] > 0

    walk = train("walk", semantic_verifier="research.verifiers:exact_walk", max_steps=1)
    assert list(walk._logs["rewards"][SEMANTIC_REWARD_NAME]) == [1.0] * 4  # every crop framed it: labels unread
    density = train("density", semantic_verifier="research.verifiers:walk_density", max_steps=1)
    assert list(density._logs["rewards"][SEMANTIC_REWARD_NAME]) == [1.0] * 4  # the walk's batch mean, built by name

    shuffled = train("shuffled", semantic_verifier="research.verifiers:shuffled_exact", max_steps=1)
    order = np.random.default_rng([7, 0]).permutation(4)  # tiny_trainer's seed 7, the first scored batch
    assert list(shuffled._logs["rewards"][SEMANTIC_REWARD_NAME]) == [[1.0, 0.0, 1.0, 0.0][k] for k in order]

    clip = make_trainer(
        tiny_kit, dataset, tmp_path / "clip", reward_funcs=[READER], script=script, max_steps=1,
        semantic_verifier="clip", semantic_score="contrastive",
    )  # fmt: skip
    scored = spy_on_verifier(clip)
    clip.train()
    (crop_labels, crops, on_crops), (whole_labels, images, on_images) = scored
    assert crop_labels == whole_labels == list(labels) * 2
    assert [im.size for im in images] == [row["image"].size] * 4 and all(c.size != row["image"].size for c in crops)
    # eq. 2 of the float32 difference the test takes too: at most one float32 rounding, values <= 2 in size
    assert list(clip._logs["rewards"][SEMANTIC_REWARD_NAME]) == approx((on_crops - on_images).tolist(), scale=2.0)
