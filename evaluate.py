"""Score a checkpoint on a benchmark with the tool, prompt and answer parsing training used; see docs/evaluation.md.

    python evaluate.py --model_name_or_path outputs/tiny/qwen2_5_vl --benchmark synthetic --limit 8
    python evaluate.py --model_name_or_path <ckpt> --benchmark vstar --data_path /data/vstar_bench
    python evaluate.py --model_name_or_path <ckpt> --benchmark treebench --data_path TreeBench.tsv --samples 8 \
        --temperature 1.0 --shuffle_options 0
    python evaluate.py --config my_eval.yaml

Writes `outputs/eval/<run>/`: `samples.jsonl` (one line per sample: trajectory, boxes, labels, z_t, answer,
correctness, failure reason), `metrics.json` (with Avg@k and its interval, the answer-order check, the reply-level
reading and grounding), `grounding_z.json` where rows have target boxes, and `report.html`. Rerunning into the same
directory resumes: samples already in `samples.jsonl` are skipped, and the metrics are recomputed from the whole file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from configs import EvalArguments
from evaluation.run import run_evaluation
from tools import ToolConfig
from utils.checks import check_not_adapter
from utils.recipes import parse_args_and_record

# A checkpoint that records no budget (a hub model, an SFT checkpoint's rollout) is evaluated under the real RL
# recipes' budgets, read from their one shared base file: what the trained models it is compared with ran under.
UNRECORDED_BUDGETS = Path(__file__).resolve().parent / "recipes" / "mapo_paper.yaml"
PIXEL_KEYS = ("min_pixels", "max_pixels", "crop_max_pixels", "crop_min_pixels")
BUDGET_KEYS = (*PIXEL_KEYS, "max_completion_length", "max_tool_calling_iterations")


def parse_args(argv: Sequence[str] | None = None) -> tuple[EvalArguments, ToolConfig]:
    """`EvalArguments` and `ToolConfig` from flags and/or a `--config` YAML file (flags win), as the training scripts
    parse them. Settings the command line and YAML leave out come from the checkpoint's `tool_config.json` (what it
    was trained with; a value that differs from that record warns with both); pixel and token budgets it does not
    record, from `recipes/mapo_paper.yaml` (logged)."""
    return parse_args_and_record(
        (EvalArguments, ToolConfig), argv, unrecorded=UNRECORDED_BUDGETS, unrecorded_keys=BUDGET_KEYS
    )


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # skipped rows, say
    args, tool = parse_args(argv)
    check_not_adapter(args.model_name_or_path)  # a LoRA run's output is merged first (scripts.merge_lora)
    metrics = run_evaluation(args, tool)
    print(json.dumps(metrics, indent=2))
    print(f"samples, metrics and report in {args.output_dir}")


if __name__ == "__main__":
    main()
