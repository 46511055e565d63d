"""Recipe values no run can train on, and checkpoints no run can resume from, refused at parse (issue 59, item 6):
through the entry scripts' own parser (`utils.recipes.parse_args_and_record`), before any weight loads, each error
naming the field and what it allows. A damaged latest checkpoint is passed over for the last intact one, said so."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import fields
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from fake_checkpoint import write_checkpoint
from trl import GRPOConfig, ModelConfig

import rl
from configs import MAPOConfig, ScriptArguments, SFTConfig, ToolConfig, TrajectoryArguments
from repairs.resume import checkpoint_damage, last_complete_checkpoint
from utils.checks import FIELD_RANGES, FINITE_LISTS, check_clip_model
from utils.recipes import parse_args_and_record

REPO = Path(__file__).resolve().parents[1]
RL = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
SFT = (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig)
RECIPES = {
    "rl": (RL, REPO / "recipes/tiny/rl/config_mapo.yaml"),
    "sft": (SFT, REPO / "recipes/tiny/sft/config_sft.yaml"),
}


def parse(stage: str, tmp_path: Path, tiny_kit, yaml_lines: str = "", *flags: str) -> tuple:
    """The stage's tiny recipe under a recipe file that overrides it with `yaml_lines`, as a researcher writes one."""
    types, base = RECIPES[stage]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"base: {base}\n{yaml_lines}\n", encoding="utf-8")
    argv = ["--config", str(recipe), "--model_name_or_path", str(tiny_kit["policy"])]
    argv += ["--output_dir", str(tmp_path / "run"), *flags]
    return parse_args_and_record(types, argv)


# --------------------------------------------------------------------------------------------------- numeric ranges
BOTH = [
    ("learning_rate: -1.0e-5", "learning_rate must be a finite number >= 0"),
    ("learning_rate: .nan", "learning_rate must be a finite number >= 0"),
    ("per_device_train_batch_size: 0", "per_device_train_batch_size must be a finite number >= 1"),
    ("gradient_accumulation_steps: 0", "gradient_accumulation_steps must be a finite number >= 1"),
    ("max_grad_norm: .nan", "max_grad_norm must be a finite number >= 0"),
]
RL_ONLY = [
    ("num_generations: 0", "num_generations must be a finite number >= 2"),  # TRL: ZeroDivisionError
    ("max_completion_length: 0", "max_completion_length must be a finite number >= 1"),
    ("temperature: -1", "temperature must be a finite number > 0"),
    ("temperature: .nan", "temperature must be a finite number > 0"),
    ("semantic_beta: .nan", "semantic_beta must be a finite number >= 0"),
    ("semantic_lambda: 1.5", r"semantic_lambda must be in \[0, 1\]"),
    ("no_tool_semantic: .inf", "no_tool_semantic must be a finite number"),
    ("hpo_omega: .inf", "hpo_omega must be a finite number >= 0"),
    ("hpo_success_threshold: .nan", "hpo_success_threshold must be a finite number"),
    ("max_tool_calling_iterations: -1", "max_tool_calling_iterations must be a finite number >= 0"),
    ("top_p: 0", r"top_p must be in \(0, 1\]"),
    ("reward_weights: [1.0, .nan]", "reward_weights must be finite numbers"),
]
SFT_ONLY = [("max_length: 0", "max_length must be a finite number >= 1")]


@pytest.mark.parametrize(
    ("stage", "line", "message"),
    [(s, *c) for c in BOTH for s in ("rl", "sft")] + [("rl", *c) for c in RL_ONLY] + [("sft", *c) for c in SFT_ONLY],
)
def test_a_value_no_run_can_train_on_is_refused_at_parse_naming_the_field(stage, line, message, tmp_path, tiny_kit):
    with pytest.raises(ValueError, match=message) as caught:
        parse(stage, tmp_path, tiny_kit, line)
    assert "got" in str(caught.value)


def test_the_tiny_recipes_values_pass(tmp_path, tiny_kit):
    _, config, _, _ = parse("rl", tmp_path, tiny_kit, "max_tool_calling_iterations: 0\nlearning_rate: 0")
    assert (config.max_tool_calling_iterations, config.learning_rate) == (0, 0.0)  # no tool rounds; weights held
    parse("sft", tmp_path, tiny_kit, "max_length: null")  # null: TRL's no limit


def test_every_range_names_a_real_field_and_every_number_mapo_adds_has_one():
    """A misspelt range would check nothing; a new float field of MAPOConfig's would go unchecked."""
    known = {f.name for cls in (MAPOConfig, SFTConfig) for f in fields(cls)}
    assert set(FIELD_RANGES) | set(FINITE_LISTS) <= known
    grpo = {f.name for f in fields(GRPOConfig)}
    numbers = {
        f.name for f in fields(MAPOConfig) if f.name not in grpo and str(f.type).split(" |")[0] in ("int", "float")
    }
    assert numbers <= set(FIELD_RANGES), numbers - set(FIELD_RANGES)


# ------------------------------------------------------------------------------------------------ semantic_* fields
def semantic_warnings(tmp_path: Path, **fields) -> list[str]:
    """The warnings about R_sem's fields that a MAPOConfig built with `fields` raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MAPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, bf16=False, **fields)
    return [str(w.message) for w in caught if "R_sem" in str(w.message)]


def test_a_semantic_field_set_under_an_estimator_that_does_not_train_on_r_sem_warns_naming_it(tmp_path):
    """Under grpo and hpo R_sem is logged only: a semantic_beta set there weighs nothing, and the recipe says nothing
    of it unless the parse does (the demo's GRPO recipe carried semantic_beta: 0.4 unnoticed)."""
    [message] = semantic_warnings(
        tmp_path, advantage_estimator="grpo", semantic_beta=0.8, semantic_score="contrastive"
    )
    assert "advantage_estimator='grpo'" in message
    assert "semantic_beta=0.8" in message and "semantic_score='contrastive'" in message
    assert "semantic_lambda" not in message  # left at its default: not named
    [message] = semantic_warnings(tmp_path, advantage_estimator="hpo", no_tool_semantic=0.5)
    assert "advantage_estimator='hpo'" in message and "no_tool_semantic=0.5" in message
    assert semantic_warnings(tmp_path, advantage_estimator="grpo") == []  # the defaults: nothing set
    assert semantic_warnings(tmp_path, advantage_estimator="mapo", semantic_beta=0.8) == []
    assert semantic_warnings(tmp_path, advantage_estimator="mapo+hpo", semantic_score="contrastive") == []


# ------------------------------------------------------------------------------------------------------- clip_model
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--clip_model", "outputs/tiny/no-such-clip"], "clip_model: 'outputs/tiny/no-such-clip' is no such folder"),
        (["--clip_model", "ViT-Nope-32"], "clip_model: 'ViT-Nope-32' is not an open_clip model name"),
        (["--clip_model", "ViT-B-32", "--clip_pretrained", "nope"], "clip_pretrained: 'nope' is not a tag"),
    ],
)
def test_a_clip_model_that_cannot_load_is_refused_before_the_policy(flags, message, tmp_path, tiny_kit, monkeypatch):
    loaded = []
    monkeypatch.setattr(rl, "load_policy", lambda *args: loaded.append(args))
    monkeypatch.setattr(rl, "load_split", lambda *args: loaded.append(args))
    parsed = parse("rl", tmp_path, tiny_kit, "", *flags)
    with pytest.raises(ValueError, match=message):
        rl.build_trainer(*parsed)
    assert not loaded


def test_clip_models_open_clip_can_build_pass(tmp_path, tiny_kit):
    for name, tag in [(str(tiny_kit["clip"]), None), (f"local-dir:{tiny_kit['clip']}", None)]:
        check_clip_model(name, tag)
    for name, tag in [
        ("ViT-B-32", "openai"),
        ("ViT-B/32", "openai"),
        ("ViT-L-14", "openai"),
        ("hf-hub:org/clip", None),
    ]:
        check_clip_model(name, tag)
    with pytest.raises(ValueError, match="has no open_clip_config.json"):
        check_clip_model(str(tmp_path), None)


# ----------------------------------------------------------------------------------------------------- checkpoints
def truncate(path: Path, keep: float = 0.5) -> None:
    with path.open("r+b") as f:
        f.truncate(int(path.stat().st_size * keep))


DAMAGE = {
    "truncated weights": (lambda c: truncate(c / "model.safetensors"), "model.safetensors does not load"),
    "garbage weights": (lambda c: (c / "model.safetensors").write_bytes(b"\x00" * 64), "model.safetensors"),
    "no weights": (lambda c: (c / "model.safetensors").unlink(), "no weights"),
    "no optimizer": (lambda c: (c / "optimizer.pt").unlink(), "no optimizer.pt"),
    "truncated optimizer": (lambda c: truncate(c / "optimizer.pt", 0.9), "optimizer.pt does not load"),
    "garbage optimizer": (lambda c: (c / "optimizer.pt").write_bytes(os.urandom(256)), "optimizer.pt does not load"),
    "no scheduler": (lambda c: (c / "scheduler.pt").unlink(), "no scheduler.pt"),
    "unsafe optimizer": (
        lambda c: torch.save({"state": {}, "param_groups": [], "x": Fraction(1, 3)}, c / "optimizer.pt"),
        "optimizer.pt does not load as the trainer loads it, weights only (WeightsUnpickler error: Unsupported global",
    ),
    "cut-off state": (lambda c: truncate(c / "trainer_state.json"), "trainer_state.json does not load"),
    "no state": (lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_last_intact_one_saying_so(damage, tmp_path, caplog):
    write_checkpoint(tmp_path, 2)
    latest = write_checkpoint(tmp_path, 4)
    assert checkpoint_damage(latest) is None and last_complete_checkpoint(tmp_path) == str(latest)
    harm, what = DAMAGE[damage]
    harm(latest)
    assert what in checkpoint_damage(latest)
    with caplog.at_level(logging.WARNING):
        assert last_complete_checkpoint(tmp_path, warn=True) == str(tmp_path / "checkpoint-2")
    assert f"{latest} is damaged" in caplog.text and what in caplog.text
    assert f"resuming from {tmp_path / 'checkpoint-2'} instead" in caplog.text
    assert "weights_only=False" not in caplog.text and "set to `False`" not in caplog.text


def test_a_missing_shard_damages_a_sharded_checkpoint(tmp_path):
    folder = write_checkpoint(tmp_path, 3, shards=2)
    assert checkpoint_damage(folder) is None
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert (
        checkpoint_damage(folder)
        == "model-00002-of-00002.safetensors, named by model.safetensors.index.json, is missing"
    )


@pytest.mark.parametrize("stage", ["rl", "sft"])
def test_resume_at_parse_takes_the_last_intact_checkpoint_or_refuses(stage, tmp_path, tiny_kit, caplog):
    run = tmp_path / "run"
    with pytest.raises(
        ValueError, match=f"resume_from_checkpoint: true needs an intact checkpoint-.* {run}.* holds none"
    ):
        parse(stage, tmp_path, tiny_kit, "resume_from_checkpoint: true")
    write_checkpoint(run, 5)
    truncate(write_checkpoint(run, 10) / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        config = parse(stage, tmp_path, tiny_kit, "resume_from_checkpoint: true")[1]
    assert config.resume_from_checkpoint == str(run / "checkpoint-5")
    assert f"{run / 'checkpoint-10'} is damaged, model.safetensors does not load" in caplog.text
    (run / "checkpoint-5" / "optimizer.pt").write_bytes(b"PK")
    with pytest.raises(
        ValueError, match=r"every one is damaged: checkpoint-10 \(model.safetensors.*checkpoint-5 \(opt"
    ) as caught:
        parse(stage, tmp_path, tiny_kit, "resume_from_checkpoint: true")
    assert "weights_only=False" not in str(caught.value)
    named = run / "checkpoint-10"
    with pytest.raises(ValueError, match=f"resume_from_checkpoint: {named} is damaged, model.safetensors does not"):
        parse(stage, tmp_path, tiny_kit, f"resume_from_checkpoint: {named}")


def test_the_optimizer_check_reads_no_tensor_data(tmp_path, monkeypatch):
    """The check must stay cheap on a 7B run's optimizer (56 GB of fp32 Adam moments): torch.load memory-maps it."""
    folder = write_checkpoint(tmp_path, 1)
    calls = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or load(*a, **k))
    assert checkpoint_damage(folder) is None
    assert calls and all(k.get("mmap") is True and k.get("weights_only") is True for k in calls)
