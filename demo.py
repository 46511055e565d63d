"""`make demo`: the whole pipeline on the tiny offline models, on CPU, in a few minutes.

1. train the tiny CLIP verifier on synthetic (crop, label) pairs, so z_t means something (held-out top-1 reported);
2. generate a synthetic train/test split;
3. evaluate the untrained policy on the test split;
4. SFT cold start on gold zoom-in trajectories (`sft.py`, recipes/tiny/sft/config_sft.yaml);
5. MAPO RL from the SFT checkpoint (`rl.py`, recipes/tiny/rl/config_mapo.yaml), scored by the trained CLIP;
6. evaluate after SFT and after RL; write `outputs/demo/summary.json` and print a table.

Each stage runs the real entry point in-process with its recipe and a few overrides, exactly as
`make sft ARGS=...` / `make rl ARGS=...` / `make eval ...` would.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import datasets  # noqa: E402
from trl import ModelConfig, SFTConfig  # noqa: E402

import rl  # noqa: E402
import sft  # noqa: E402
from clip_training import train_clip  # noqa: E402
from data.synthetic import build_synthetic  # noqa: E402
from data.trajectories import TrajectoryArguments  # noqa: E402
from evaluate import parse_args as evaluate_args  # noqa: E402
from evaluate import run_evaluation  # noqa: E402
from launch import ScriptArguments, parse_args_and_record  # noqa: E402
from mapo_trainer import MAPOConfig  # noqa: E402
from tiny_models import build_tiny_kit, kit_paths  # noqa: E402
from tools import ToolConfig  # noqa: E402

SFT_RECIPE = "recipes/tiny/sft/config_sft.yaml"
RL_RECIPE = "recipes/tiny/rl/config_mapo.yaml"
SUMMARY_KEYS = ("accuracy", "tool_call_rate", "valid_call_rate", "mean_z", "gap_rate", "calls_per_sample")


def flags(**values) -> list[str]:
    return [item for key, value in values.items() for item in (f"--{key}", str(value))]


def parse_recipe(dataclasses: tuple, recipe: str, **overrides) -> tuple:
    """Parse `recipe` exactly as the entry script does, with `--key value` overrides."""
    return parse_args_and_record(dataclasses, ["--config", recipe, *flags(**overrides)])


def evaluate(model: str, data: str, output_dir: Path, limit: int, **overrides) -> dict:
    """`make eval` on the synthetic test split; tool settings and rollout budget come from the checkpoint's record."""
    args = evaluate_args(
        flags(
            model_name_or_path=model,
            benchmark="synthetic",
            data_path=data,
            split="test",
            output_dir=output_dir,
            limit=limit,
            dtype="float32",
            **overrides,
        )
    )
    return run_evaluation(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/demo"))
    parser.add_argument("--train_rows", type=int, default=48)
    parser.add_argument("--test_rows", type=int, default=16)
    parser.add_argument("--clip_steps", type=int, default=300, help="~1 min on 2 idle cores; reproducible")
    parser.add_argument("--sft_steps", type=int, default=400, help="fewer and the tiny policy writes no valid call")
    parser.add_argument("--rl_steps", type=int, default=8)
    args = parser.parse_args()
    out = args.output_dir
    start = time.perf_counter()
    timings = {}

    def stage(name: str, fn):
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        result = fn()
        timings[name] = round(time.perf_counter() - t0, 1)
        return result

    kit_dir = Path("outputs/tiny")
    kit = kit_paths(kit_dir) if (kit_dir / ".built").exists() else build_tiny_kit(kit_dir)
    clip_dir = out / "clip"
    clip = stage("train the CLIP verifier", lambda: train_clip(clip_dir, init=kit["clip"], steps=args.clip_steps))

    data_dir = out / "data"

    def make_data():
        splits = {
            "train": build_synthetic(args.train_rows, seed=0, split="train"),
            "test": build_synthetic(args.test_rows, seed=0, split="test"),
        }
        datasets.DatasetDict(splits).save_to_disk(str(data_dir))

    stage("generate synthetic data", make_data)

    results = {}
    results["base"] = stage(
        "evaluate the untrained policy",  # no record yet: the tiny recipes' rollout budget, the trained verifier
        lambda: evaluate(
            kit["policy"],
            data_dir,
            out / "eval" / "base",
            args.test_rows,
            clip_model=clip_dir,
            max_completion_length=320,
            max_tool_calling_iterations=2,
        ),  # fmt: skip
    )

    sft_dir = out / "sft"
    sft_args = parse_recipe(
        (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig),
        SFT_RECIPE,
        model_name_or_path=kit["policy"],
        dataset_name=data_dir,
        output_dir=sft_dir,
        max_steps=args.sft_steps,
    )
    stage("SFT cold start", lambda: sft.main(*sft_args))
    results["sft"] = stage(
        "evaluate after SFT",
        lambda: evaluate(
            sft_dir,
            data_dir,
            out / "eval" / "sft",
            args.test_rows,
            clip_model=clip_dir,  # SFT scores nothing with CLIP, so its record names no verifier
            max_completion_length=320,
            max_tool_calling_iterations=2,
        ),  # fmt: skip
    )

    rl_dir = out / "rl"
    rl_args = parse_recipe(
        (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig),
        RL_RECIPE,
        model_name_or_path=sft_dir,
        dataset_name=data_dir,
        clip_model=clip_dir,
        output_dir=rl_dir,
        max_steps=args.rl_steps,
    )
    rl_trainer = stage("MAPO RL", lambda: rl.main(*rl_args))
    results["rl"] = stage(
        "evaluate after RL",
        lambda: evaluate(rl_dir, data_dir, out / "eval" / "rl", args.test_rows),
    )

    rl_log = [entry for entry in rl_trainer.state.log_history if "rewards/semantic/mean" in entry]
    summary = {
        "clip_verifier": clip,
        "eval": {stage_name: {k: metrics.get(k) for k in SUMMARY_KEYS} for stage_name, metrics in results.items()},
        "rl_first_step": {k: rl_log[0].get(k) for k in ("rewards/semantic/mean", "tools/zoom_calls_per_rollout")},
        "rl_last_step": {k: rl_log[-1].get(k) for k in ("rewards/semantic/mean", "tools/zoom_calls_per_rollout")},
        "seconds": {**timings, "total": round(time.perf_counter() - start, 1)},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")

    print(f"\nCLIP verifier, held-out top-1 label retrieval: {clip}")
    header = f"{'stage':<8}" + "".join(f"{k:>17}" for k in SUMMARY_KEYS)
    print(header)
    for stage_name, metrics in summary["eval"].items():
        cells = "".join(f"{'-' if v is None else f'{v:.3f}':>17}" for v in metrics.values())
        print(f"{stage_name:<8}{cells}")
    print(
        f"\nsummary: {out / 'summary.json'}   reports: {out / 'eval'}/*/report.html   total {summary['seconds']['total']} s"
    )


if __name__ == "__main__":
    main()
