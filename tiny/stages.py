"""The demo's stages as functions, shared by `scripts/demo.py` and the research package: each runs what a user would
(`make clip`, the tiny recipes' data, `make sft` / `make rl` / `make eval` in processes of their own or `make eval`
in this one, the verifier gate). A tiny run can look fine while measuring nothing, so each evaluated stage reports the
chance level of its own rows beside its accuracy, and `signal_warnings` names each stage whose signal was zero.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import datasets
import torch
from trl import ModelConfig

from configs import EvalArguments, MAPOConfig, ScriptArguments, SFTConfig, ToolConfig, TrajectoryArguments
from data import synthetic_world
from data.benchmarks import load_saved_split
from data.synthetic import build_synthetic, chance_accuracy
from evaluation.metrics import mean
from evaluation.run import ROLLOUT_FIELDS, SAMPLES_FILE, read_samples, run_evaluation
from evaluation.verifier_check import GateResult, check_verifier
from mapo import scale_similarity
from rewards import REWARDS
from rewards.grounding import frames_target
from rewards.verifiers import build_verifier
from tiny.clip import train_clip
from tiny.kit import build_tiny_kit, kit_paths
from tools import make_environment_factory
from utils.models import load_processor, pixel_budget
from utils.recipes import load_recipe, parse_args_and_record

REPO = Path(__file__).resolve().parents[1]
KIT_DIR = Path("outputs/tiny")
SFT_RECIPE = "recipes/tiny/sft/config_sft.yaml"
RL_RECIPE = "recipes/tiny/rl/config_mapo.yaml"
# GRPO on the grounding reward, which the tiny policy can earn: the positive control's RL (research/positive_control.py)
GROUNDING_RL_RECIPE = "recipes/tiny/rl/config_demo.yaml"
# The demo's two RL arms, on one outcome (a simulated reader) from one SFT checkpoint: MAPO with the tiny CLIP, and GRPO
DEMO_ARMS = {"mapo": "recipes/tiny/rl/config_demo_mapo.yaml", "grpo": "recipes/tiny/rl/config_demo_grpo.yaml"}
SFT_TYPES = (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig)  # what sft.py parses
RL_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)  # what rl.py parses
TRAINER_STATE = "trainer_state.json"  # `Trainer.save_state`'s file, which `utils.policy.save_outputs` writes
SUMMARY_KEYS = ("accuracy", "tool_call_rate", "valid_call_rate", "box_contains_target", "mean_z", "gap_rate",
                "calls_per_sample")  # fmt: skip
# TRL logs each reward function under its own name; the tiny recipe's only outcome reward is `gated_outcome`, 1 when
# the answer is correct *and* every turn is well formed, so its batch mean is the rollouts' (format-gated) accuracy.
ACCURACY_KEY = f"rewards/{REWARDS['gated_outcome'].__name__}/mean"
SEMANTIC_KEY = "rewards/semantic/mean"  # MAPOTrainer logs R_sem at every training step, whatever the estimator

# One RL step's figures by name: the `log_history` key each comes from and, optionally, how it is derived. A key TRL
# did not log at a step gives None, never 0: no zoom-in call means no z_t and no error rate (`semantic/z_mean`,
# `tools/zoom_error_rate` are logged per call), and the variance probe logs only on the steps it probes.
StepMetrics = dict[str, tuple[str, Callable[[float], float] | None]]
STEP_METRICS: StepMetrics = {
    "r_sem": (SEMANTIC_KEY, None),
    "z_mean": ("semantic/z_mean", None),
    "calls_per_rollout": ("tools/zoom_calls_per_rollout", None),
    "valid_call_rate": ("tools/zoom_error_rate", lambda error_rate: 1.0 - error_rate),
    "accuracy": (ACCURACY_KEY, None),
    "reward_std": ("reward_std", None),
    "advantage_std": ("mapo/advantage_std", None),
    "adv_variance": ("adv/variance", None),
    "grad_norm_var": ("probe/grad_norm_var", None),
    "hpo_fallback_frac": ("hpo/fallback_frac", None),
    "gradvar_trace": ("gradvar/trace", None),
    "gradvar_relative": ("gradvar/relative", None),
}


def flags(**values) -> list[str]:
    """`--key value` command-line flags; a list or tuple value becomes several arguments (`--call_mix 1.0 0.0 0.0`)."""
    out = []
    for key, value in values.items():
        out += [f"--{key}", *map(str, value)] if isinstance(value, (list, tuple)) else [f"--{key}", str(value)]
    return out


def tiny_kit(kit_dir: Path = KIT_DIR) -> dict[str, Path]:
    """The tiny offline models (`make tiny`), built on first use."""
    return kit_paths(kit_dir) if (kit_dir / ".built").exists() else build_tiny_kit(kit_dir)


def train_verifier(output_dir: Path, kit: dict[str, Path], steps: int, recipe: str = RL_RECIPE) -> dict:
    """The tiny CLIP verifier trained from the kit's random one (reproducible), on crops fitted to its input the way
    the RL `recipe` scores them (`clip_resize`); returns its held-out retrieval."""
    resize = load_recipe(recipe).values.get("clip_resize", ToolConfig.clip_resize)
    return train_clip(output_dir, init=kit["clip"], steps=steps, resize=resize)


def recipe_world(recipe: str = SFT_RECIPE) -> dict[str, Any]:
    """`build_synthetic`'s world keywords from `recipe`, parsed as `make sft` parses it (`data.synthetic_world`):
    the demo's data is what `make sft` on that recipe would generate."""
    return synthetic_world(parse_args_and_record(SFT_TYPES, ["--config", recipe])[0])


def make_data(data_dir: Path, train_rows: int, test_rows: int, seed: int = 0, **world) -> Path:
    """A synthetic train/test split saved with `save_to_disk`, the form every stage reads (`dataset_name`), in the
    tiny SFT recipe's world (`recipe_world`) with `world`'s `build_synthetic` keywords on top."""
    world = recipe_world() | world
    splits = {
        "train": build_synthetic(train_rows, seed=seed, split="train", **world),
        "test": build_synthetic(test_rows, seed=seed, split="test", **world),
    }
    datasets.DatasetDict(splits).save_to_disk(str(data_dir))
    return data_dir


# A stage's process runs on `threads` torch threads, one by default: two stages side by side, or a stage beside another
# job (the test suite's other worker), lose more to a second thread's synchronisation than they gain (60 SFT steps took
# 26.4 s on 1 thread and 71.7 s on 2 beside one other 1-thread job, 2026-12-04). A stage alone on idle cores gains from
# the second: `alone_threads`.
def alone_threads() -> int:
    """Threads for a stage that runs alone: `OMP_NUM_THREADS` when set (the test suite's workers set it to their share),
    else 2, or 1 on a 1-core machine. On the idle 2-core machine 2 threads ran the demo's SFT steps 1.55x and its RL
    steps 1.4x as fast as 1 (60 SFT steps, 12 RL steps, 2026-12-04); more threads were not measured."""
    return int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1))


def start_entry(script: str, argv: Sequence[str], threads: int = 1, log: Path | None = None) -> subprocess.Popen:
    """Start an entry script (`sft.py`, `rl.py`, `evaluate.py`) in a process of its own, as `make sft` / `make rl` /
    `make eval` does (one process, no accelerate config: the tiny recipes' `cpu`), on `threads` torch threads, its
    output appended to `log` when given (two runs side by side would interleave theirs on the console);
    `wait_entry` collects it."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, str(REPO / script), *map(str, argv)]
    if log is None:
        return subprocess.Popen(command, cwd=REPO, env=env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as sink:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)


def wait_entry(process: subprocess.Popen) -> None:
    """Wait for a `start_entry` process; fails with its exit status."""
    if process.wait() != 0:
        raise subprocess.CalledProcessError(process.returncode, process.args)


def run_entry(script: str, argv: Sequence[str], threads: int = 1, log: Path | None = None) -> None:
    """`start_entry`, then `wait_entry`."""
    wait_entry(start_entry(script, argv, threads, log))


def sft_argv(model: str | Path, data_dir: Path, output_dir: Path, steps: int, **overrides) -> list[str]:
    """`sft.py`'s command line: `make sft` (the tiny recipe, `--key value` overrides) from `model` on `data_dir`'s
    train split, into `output_dir`."""
    fields = dict(model_name_or_path=model, dataset_name=data_dir, output_dir=output_dir, max_steps=steps)
    return ["--config", SFT_RECIPE, *flags(**fields, **overrides)]


def run_sft(model: str | Path, data_dir: Path, output_dir: Path, steps: int, threads: int = 1, **overrides) -> None:
    """`make sft` (`sft_argv`) on `threads` torch threads, waited for."""
    run_entry("sft.py", sft_argv(model, data_dir, output_dir, steps, **overrides), threads)


def rl_argv(
    model: str | Path, data_dir: Path, clip: Path, output_dir: Path, steps: int, recipe: str = RL_RECIPE, **overrides
) -> list[str]:
    """`rl.py`'s command line: `recipe` (the tiny RL recipe) from `model` on `data_dir`, scored by `clip`, with
    `--key value` overrides (any recipe field)."""
    fields = dict(
        model_name_or_path=model, dataset_name=data_dir, clip_model=clip, output_dir=output_dir, max_steps=steps
    )
    return ["--config", recipe, *flags(**fields, **overrides)]


def rl_args(argv: Sequence[str]) -> tuple:
    """`rl.py`'s parsed arguments (`RL_TYPES`) for `argv`, parsed exactly as `rl.py` parses them."""
    return parse_args_and_record(RL_TYPES, list(map(str, argv)))


def run_rl(argv: Sequence[str], threads: int = 1, log: Path | None = None) -> list[dict]:
    """`make rl` on `argv` (from `rl_argv`) on `threads` torch threads (its output appended to `log` when given);
    returns the run's `log_history` (its `trainer_state.json`)."""
    output_dir = Path(rl_args(argv)[1].output_dir)
    run_entry("rl.py", argv, threads, log)
    return json.loads((output_dir / TRAINER_STATE).read_text(encoding="utf-8"))["log_history"]


def rollout_budget(recipe: str = RL_RECIPE) -> dict[str, Any]:
    """An RL recipe's rollout budget (the tiny one's by default), for evaluating checkpoints that record none yet (the
    untrained policy, SFT's) under the budget RL will train with."""
    values = load_recipe(recipe).values
    return {key: values[key] for key in ROLLOUT_FIELDS}


def eval_argv(model: str | Path, data: str | Path, output_dir: Path, limit: int, **overrides) -> list[str]:
    """`evaluate.py`'s command line for `make eval` on the synthetic test split's first `limit` rows, with `--key
    value` overrides; tool settings and rollout budget not given come from the checkpoint's record. Empties
    `output_dir` first: a rerun retrains the checkpoint at the same path, and resuming would mix the old model's
    samples into the new one's metrics."""
    shutil.rmtree(output_dir, ignore_errors=True)
    fields = dict(model_name_or_path=model, benchmark="synthetic", data_path=data, split="test", output_dir=output_dir)
    return flags(**fields, limit=limit, dtype="float32", **overrides)


def evaluate(model: str | Path, data: str | Path, output_dir: Path, limit: int, **overrides) -> dict:
    """`make eval` (`eval_argv`) in this process, on the threads it has; returns the metrics."""
    argv = eval_argv(model, data, output_dir, limit, **overrides)
    return run_evaluation(*parse_args_and_record((EvalArguments, ToolConfig), argv))


def verifier_gate(argv: Sequence[str], data_dir: Path, rows: int) -> GateResult:
    """The verifier gate (`evaluation.verifier_check.check_verifier`) of the verifier an RL run scores with, parsed
    from its `rl.py` command line `argv` (`rl_argv`), on the first `rows` test rows of `data_dir` (all, if fewer),
    under the run's `semantic_score`. As `research.experiment.verifier_gate` runs it, but with the crops the run's own
    tool cuts (the starting checkpoint's record under the recipe, at its pixel budgets, where the research gate takes
    `ToolConfig`'s defaults) and gold boxes as the SFT recipe draws them: the crops RL scores."""
    _, training, model, tool = rl_args(argv)
    processor = load_processor(model.model_name_or_path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    budget = pixel_budget(processor)
    tool = tool.resolved(budget)
    trajectory = parse_args_and_record(SFT_TYPES, ["--config", SFT_RECIPE])[3]
    test = load_saved_split(str(data_dir), "test")
    test = test.select(range(min(rows, len(test))))
    verifier = build_verifier(training.semantic_verifier, tool)
    how = training.semantic_score
    return check_verifier(verifier, list(test), make_environment_factory(tool, budget), trajectory, (how,))[how]


T = TypeVar("T")


class Stages:
    """Runs named stages with a banner, and keeps each one's wall time in `seconds`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def __call__(self, name: str, fn: Callable[[], T]) -> T:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        result = fn()
        self.seconds[name] = round(time.perf_counter() - t0, 1)
        return result

    def total(self) -> float:
        return round(time.perf_counter() - self._start, 1)


def chance_by_source(records: Iterable[dict]) -> tuple[float | None, dict[str, float]]:
    """Chance accuracy of evaluated rows (`source`, `options`), overall and per source: the mean of
    `data.synthetic.chance_accuracy` over the very rows the accuracy was measured on, not the generator's mix."""
    by_source = defaultdict(list)
    for record in records:
        by_source[record["source"]].append(chance_accuracy(record["source"], record["options"]))
    everything = [value for values in by_source.values() for value in values]
    return mean(everything), {source: mean(values) for source, values in sorted(by_source.items())}


def binomial_se(p: float, n: int) -> float:
    """Standard error of a rate `p` measured on `n` independent rows: sqrt(p (1 - p) / n)."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def difference_se(p: float, q: float, n: int) -> float:
    """Standard error of the difference of two rates each measured on `n` rows (treated as independent)."""
    return math.sqrt(binomial_se(p, n) ** 2 + binomial_se(q, n) ** 2)


def framing_calls(record: dict) -> list[dict]:
    """The calls of one evaluated row (a `samples.jsonl` record with a `target_bbox`) whose crop framed its target
    (`rewards.grounding.frames_target`), in order."""
    size = tuple(record["image_size"])
    return [call for call in record["calls"] if frames_target(call["box"], record["target_bbox"], size)]


def framing_z(records: Iterable[dict], semantic_score: str) -> dict:
    """The mean z_t (the evaluation's CLIP cosine of each call's label with its crop, scaled as `semantic_score` scales
    it in training: `mapo.scale_similarity`) of the scored calls of evaluated rows with a target box, apart for the
    calls whose crop framed the target (`frames_target`) and those that missed it, with the number of each: a verifier
    that rewards looking in the right place pays the first more. None for a group without a call."""
    framed, missed = [], []
    for record in records:
        if not record.get("target_bbox"):
            continue
        size = tuple(record["image_size"])
        for call in record["calls"]:
            if call.get("z") is not None:
                hit = frames_target(call["box"], record["target_bbox"], size)
                (framed if hit else missed).append(call)
    out = {}
    for name, calls in (("framed", framed), ("missed", missed)):
        cosine = torch.tensor([call["z"] for call in calls], dtype=torch.float64)
        whole = torch.tensor([call["z_full"] for call in calls], dtype=torch.float64)
        z = scale_similarity(cosine, semantic_score, whole if semantic_score == "contrastive" else None)
        out |= {name: float(z.mean()) if calls else None, f"{name}_calls": len(calls)}
    return out


def eval_summary(metrics: dict, eval_dir: Path) -> dict:
    """One evaluated stage: `SUMMARY_KEYS`, accuracy per source, the chance levels of the same rows, and `target_seen`,
    the fraction of its rows where a valid call framed the target (`rewards.grounding.frames_target`: what the grounding
    reward pays a rollout; a row without a call is a miss), all read from the run's `samples.jsonl`."""
    records = read_samples(Path(eval_dir) / SAMPLES_FILE)
    chance, chance_by = chance_by_source(records)
    return {
        **{key: metrics.get(key) for key in SUMMARY_KEYS},
        "target_seen": mean([float(bool(framing_calls(r))) for r in records if r.get("target_bbox")]),
        "chance": chance,
        "accuracy_by_source": metrics.get("accuracy_by_source", {}),
        "chance_by_source": chance_by,
    }


def rl_step_log(log_history: Iterable[dict], metrics: StepMetrics = STEP_METRICS) -> list[dict]:
    """Per RL training step, its `step` and every figure of `metrics` (None where TRL did not log it). Entries of
    `trainer.state.log_history` that are not training steps (the closing `train_runtime` one) are skipped."""
    steps = []
    for entry in log_history:
        if SEMANTIC_KEY not in entry:
            continue
        row = {"step": entry["step"]}
        for name, (key, derive) in metrics.items():
            value = entry.get(key)
            row[name] = None if value is None else (derive(value) if derive else value)
        steps.append(row)
    return steps


def rl_endpoint(step: dict) -> dict:
    """A step as the summary's `rl_first_step` / `rl_last_step` show it: TRL's keys, as before, and the valid-call
    rate during RL (1 - tools/zoom_error_rate; None when no call was made)."""
    return {
        SEMANTIC_KEY: step["r_sem"],
        "tools/zoom_calls_per_rollout": step["calls_per_rollout"],
        "valid_call_rate": step["valid_call_rate"],
    }


def rl_overview(steps: Sequence[dict]) -> dict:
    """The whole RL run in a few figures (one step's values swing with its 2 prompts): R_sem's mean over steps and
    in how many it was non-zero, and the mean valid-call rate and calls per rollout over the steps that logged them."""
    r_sem = [step["r_sem"] for step in steps if step["r_sem"] is not None]
    return {
        "steps": len(steps),
        "r_sem_mean": mean(r_sem),
        "r_sem_nonzero_steps": sum(value != 0 for value in r_sem),
        "valid_call_rate_mean": mean([s["valid_call_rate"] for s in steps if s["valid_call_rate"] is not None]),
        "calls_per_rollout_mean": mean([s["calls_per_rollout"] for s in steps if s["calls_per_rollout"] is not None]),
    }


def signal_warnings(summary: dict, rl: str = "RL") -> list[str]:
    """The stages of `summary` whose signal was zero, one sentence each: an evaluated stage with no valid zoom-in call
    (no z_t), RL whose R_sem was zero or unscored at every step, RL with no zoom-in call at all, RL that did not raise
    what it trains by more than its standard error. Reads `summary["eval"]` (stage -> `eval_summary`),
    `summary["rl_steps"]` (`rl_step_log`) and `summary["rl_gain"]` (the demo's `rl_gain`), any of them may be absent;
    the RL run's sentences start with its name `rl` (the demo's arms: "RL mapo", "RL grpo")."""
    warnings = []
    for stage, metrics in summary.get("eval", {}).items():
        if not metrics.get("valid_call_rate"):
            made = "no zoom-in call" if not metrics.get("calls_per_sample") else "zoom-in calls, none of them valid"
            warnings.append(f"eval '{stage}': {made} (valid_call_rate {metrics.get('valid_call_rate')}): no z_t")
    steps = summary.get("rl_steps")
    if steps is not None:
        if not steps:
            warnings.append(f"{rl}: no training step was logged")
        elif all(not step.get("r_sem") or step.get("z_mean") is None for step in steps):
            warnings.append(f"{rl}: R_sem was zero (or no call was scored) at every one of its {len(steps)} steps")
        if steps and not any(step.get("calls_per_rollout") for step in steps):
            warnings.append(f"{rl}: no zoom-in call in any of its {len(steps)} steps")
    gain = summary.get("rl_gain") or {}
    if gain.get("rise") is not None and gain["rise"] <= gain["se"]:
        warnings.append(
            f"{rl}: {gain['figure']} rose {gain['rise']:+.3f} ({gain['sft']:.3f} -> {gain['rl']:.3f}), not more than "
            f"its standard error {gain['se']:.3f}: RL did not measurably raise what it trains"
        )
    return warnings


EXPERIMENT_REPORT = REPO / "research" / "reports" / "experiment.md"
VERDICT_HEADING = "## What it shows"


def experiment_verdict(report: Path = EXPERIMENT_REPORT) -> list[str]:
    """The generated "What it shows" bullets of `make experiment`'s report (`EXPERIMENT_REPORT`), which the demo
    prints: whether MAPO's signal acts, from the one place the experiment writes it. Empty without a report."""
    if not report.exists():
        return []
    text = report.read_text(encoding="utf-8")
    if VERDICT_HEADING not in text:
        return []
    section = text.split(VERDICT_HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.strip().splitlines() if line.startswith("- ")]


def add_stage_arguments(parser: argparse.ArgumentParser) -> None:
    """Sizes of the stages before RL, shared by `demo.py` and `experiment.py`."""
    parser.add_argument("--train_rows", type=int, default=1024)
    parser.add_argument("--test_rows", type=int, default=32)
    parser.add_argument("--clip_steps", type=int, default=300, help="~1 min on 2 idle cores; reproducible")
    sft_steps_help = "batches of 8 (the recipe's); fewer, and boxes miss the named cell more often"
    parser.add_argument("--sft_steps", type=int, default=900, help=sft_steps_help)
