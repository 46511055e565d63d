"""Benchmarks behind `make bench`; results and the exact command go to docs/benchmarks.md.

1. Step time of MAPO against stock GRPO on the tiny policy with forced tool calls (so crops really are scored),
   measured side by side in one process: the runs alternate GRPO, MAPO, GRPO, MAPO, ... and each is summarised
   by its median step time after a warm-up step (TRL's `step_time`), so machine noise hits both alike.
   Goal: MAPO/GRPO <= 1.03.
2. CLIP scoring throughput (crops per second, label + crop pairs through `ClipVerifier.similarity`) for the real
   ViT-B-32 and ViT-L-14 architectures with random weights (nothing is downloaded; speed does not depend on the
   weights).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import set_seed  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from data.synthetic import build_synthetic  # noqa: E402
from mapo_trainer import ClipVerifier, MAPOTrainer  # noqa: E402
from scripted import tiny_trainer  # noqa: E402
from tiny_models import build_tiny_kit, kit_paths  # noqa: E402


def step_times(trainer_cls, kit: dict, dataset, steps: int, output_dir: str) -> list[float]:
    """Per-step wall times of one training run (TRL's `step_time`), first step excluded as warm-up."""
    set_seed(0)
    trainer = tiny_trainer(
        trainer_cls,
        kit,
        dataset,
        output_dir,
        seed=0,
        max_steps=steps + 1,
        learning_rate=1e-5,
        per_device_train_batch_size=8,
        num_generations=4,
    )
    trainer.train()
    return [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry][1:]


def bench_step_time(kit: dict, steps: int, rounds: int) -> dict:
    dataset = build_synthetic(16, seed=0, split="train")
    times = {"grpo": [], "mapo": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for name, cls in (("grpo", GRPOTrainer), ("mapo", MAPOTrainer)):
                times[name] += step_times(cls, kit, dataset, steps, tmp)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "steps_per_run": steps,
        "rounds": rounds,
        "median_step_s": median,
        "ratio_mapo_over_grpo": median["mapo"] / median["grpo"],
    }


def bench_clip(names: list[str], n_crops: int, repeats: int) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    crops = [Image.new("RGB", (448, 336), (i * 7 % 255, 90, 160)) for i in range(n_crops)]
    labels = [f"a small red star number {i}" for i in range(n_crops)]
    results = {}
    for name in names:
        verifier = ClipVerifier(name, pretrained=None, device=device)
        verifier.similarity(labels[:2], crops[:2])  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            verifier.similarity(labels, crops)
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        results[name] = {"device": device, "batch": n_crops, "crops_per_s": n_crops / best}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating GRPO/MAPO run pairs")
    parser.add_argument("--clip_models", nargs="*", default=["ViT-B-32", "ViT-L-14"])
    parser.add_argument("--clip_crops", type=int, default=32, help="crops per CLIP call")
    parser.add_argument("--output", type=Path, default=Path("outputs/bench.json"))
    args = parser.parse_args()

    kit_dir = Path("outputs/tiny")
    kit = kit_paths(kit_dir) if (kit_dir / ".built").exists() else build_tiny_kit(kit_dir)
    kit = {k: str(v) for k, v in kit.items()}
    results = {
        "torch_threads": torch.get_num_threads(),
        "step_time": bench_step_time(kit, args.steps, args.rounds),
        "clip_throughput": bench_clip(args.clip_models, args.clip_crops, repeats=3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
