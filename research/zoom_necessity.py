"""Is zooming necessary in the synthetic world, and is the zoomed crop enough? Measured on the policy itself.

Two answer-only SFT runs of the same policy, same rows, same steps, same seed; only the image differs:

- `full`: the scene as the policy sees it at its pixel budget (no tool call is possible: answer-only trajectories);
- `crop`: the crop that the gold zoom-in call returns (the environment's own crop at the crop budget), as the image.

Both are evaluated answer-only on held-out rows, with accuracy and chance per question type
(`data.synthetic.chance_accuracy`). `full` near chance with `crop` well above it says the answer cannot be read
without zooming and can be read after a zoom to the right place; it says nothing about whether a policy finds that
place (`box_contains_target` in evaluation measures that).

    python -m research.zoom_necessity --output_dir outputs/zoom_necessity
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import datasets
import numpy as np

from data.synthetic import QUESTION_TYPES, build_synthetic
from data.trajectories import plan_calls
from tiny.kit import kit_paths
from tiny.stages import chance_by_source, evaluate, run_sft
from tools import ToolConfig, make_environment_factory
from utils.models import load_processor, pixel_budget


def gold_crops(rows: datasets.Dataset, policy: str) -> datasets.Dataset:
    """`rows` with each image replaced by what the gold zoom-in call shows the policy, and the target the whole
    crop. The crop comes from the RL environment, with the tool settings the SFT recipe uses (ToolConfig defaults)."""
    make_env = make_environment_factory(ToolConfig(), pixel_budget(load_processor(policy)))
    out = []
    for row in rows:
        env = make_env()
        (call,) = plan_calls(row, row["target_label"], env, 1, np.random.default_rng(0))
        env.image_zoom_in_tool(**call)
        crop = env.calls[-1].crop
        out.append(dict(row) | {"image": crop, "target_bbox": [0, 0, crop.width, crop.height]})
    return datasets.Dataset.from_list(out, features=rows.features)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/zoom_necessity"))
    parser.add_argument("--policy", default=kit_paths("outputs/tiny")["policy"])
    parser.add_argument("--train_rows", type=int, default=200)
    parser.add_argument("--test_rows", type=int, default=50)
    parser.add_argument("--sft_steps", type=int, default=300)
    parser.add_argument("--question_types", nargs="+", default=list(QUESTION_TYPES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.output_dir
    world = {"seed": args.seed, "question_types": args.question_types}
    splits = {"train": build_synthetic(args.train_rows, split="train", **world)}
    splits["test"] = build_synthetic(args.test_rows, split="test", **world)
    overall_chance, by_source = chance_by_source(splits["test"])
    results = {"chance": overall_chance, "chance_by_source": by_source}
    for view in ("full", "crop"):
        data = out / view / "data"
        view_splits = splits if view == "full" else {k: gold_crops(v, args.policy) for k, v in splits.items()}
        datasets.DatasetDict(view_splits).save_to_disk(str(data))
        # The demo's own stages; answer-only trajectories, so the view is all the policy gets.
        run_sft(args.policy, data, out / view / "sft", args.sft_steps, seed=args.seed, call_mix=[1.0, 0.0, 0.0])
        metrics = evaluate(
            out / view / "sft",
            data,
            out / view / "eval",
            args.test_rows,
            max_tool_calling_iterations=0,
            clip_model=kit_paths("outputs/tiny")["clip"],  # no call is made, so no crop is scored
        )
        results[view] = {"accuracy": metrics["accuracy"], "accuracy_by_source": metrics["accuracy_by_source"]}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"{'question type':<22}{'chance':>8}{'no zoom':>9}{'gold crop':>11}")
    for source, chance in by_source.items():
        full, crop = (results[v]["accuracy_by_source"].get(source) for v in ("full", "crop"))
        print(f"{source:<22}{chance:>8.3f}{full:>9.3f}{crop:>11.3f}")
    print(f"{'all':<22}{overall_chance:>8.3f}{results['full']['accuracy']:>9.3f}"
          f"{results['crop']['accuracy']:>11.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
