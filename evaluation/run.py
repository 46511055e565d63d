"""An evaluation run: the agent on a benchmark's rows, resumable, written as `samples.jsonl`, `metrics.json` and
`report.html` in its output folder (`evaluate.py` is its command line)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import torch
from tqdm import tqdm
from transformers import set_seed

from configs import EvalArguments
from data.benchmarks import read_benchmark
from evaluation.agent import TransformersBackend, VLLMBackend, ZoomAgent, open_image
from evaluation.metrics import clip_scores, compute_metrics, episode_record, judge_records, no_valid_call
from evaluation.report import write_report
from repairs.rollout import check_token_budget
from rewards.judge import JudgeSettings, judge_settings
from rewards.verifiers import ClipVerifier
from tools import ToolConfig
from utils.models import context_length, load_model, load_processor, pixel_budget

logger = logging.getLogger(__name__)

# Fields that change what a run measures: a resumed run must not mix samples scored under different values (every
# `ToolConfig` field counts too).
RESULT_FIELDS = (
    "model_name_or_path", "benchmark", "data_path", "split", "backend", "dtype", "max_completion_length",
    "max_tool_calling_iterations", "temperature", "top_p", "seed", "judge", "judge_model", "judge_prompt",
    "judge_verdict",
)  # fmt: skip
SAMPLES_FILE = "samples.jsonl"  # one record a sample (`evaluation.metrics.episode_record`), in the output folder
ROLLOUT_FIELDS = ("max_completion_length", "max_tool_calling_iterations")  # the rollout budget, `GRPOConfig`'s fields


def read_samples(path: Path) -> list[dict]:
    """The records of `samples.jsonl`. A run killed mid-write leaves a partial last line: it is dropped (and cut
    from the file, so the next append starts on a fresh line) and that sample runs again."""
    if not path.exists():
        return []
    complete, _, partial = path.read_text(encoding="utf-8").rpartition("\n")
    if partial:
        path.write_text(complete + "\n" if complete else "", encoding="utf-8")
    return [json.loads(line) for line in complete.splitlines() if line]


def _check_resume(out: Path, args: EvalArguments, tool: ToolConfig) -> None:
    """Record the run's settings; refuse to resume a run made with different result-defining ones."""
    path = out / "eval_args.json"
    current = asdict(args) | {"tool": asdict(tool)}
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        changed = {k: (previous.get(k), current[k]) for k in (*RESULT_FIELDS, "tool") if previous.get(k) != current[k]}
        if changed:
            raise ValueError(f"{out} holds a run with other settings {changed}; choose another --output_dir")
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")


def rollout_budgets(args: EvalArguments, tool: ToolConfig) -> dict[str, Any]:
    """The pixel and token budgets the rollouts ran under, as the report states them (None: the processor's own)."""
    pixels = {name: getattr(tool, name) for name in ("min_pixels", "max_pixels", "crop_max_pixels")}
    return pixels | {name: getattr(args, name) for name in ROLLOUT_FIELDS}


def eval_judge_settings(args: EvalArguments) -> JudgeSettings:
    """The judge `--judge` asks: the `judge_*` keys over the `JUDGE_*` environment, in DeepEyes' evaluation mode
    (`deepeyes_eval`) unless either names another; a bad setting fails here, before any model loads."""
    environ = {"JUDGE_VERDICT": "deepeyes_eval"} | {k: v for k, v in os.environ.items() if v}
    return judge_settings(environ | args.judge_environ())


def build_agent(args: EvalArguments, tool: ToolConfig, device: str) -> ZoomAgent:
    """The policy behind the chosen backend, with its processor, loaded as training loads them."""
    processor = load_processor(args.model_name_or_path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    rollout = {name: getattr(args, name) for name in ROLLOUT_FIELDS}
    # RL's start-up check of the rollout's worst case, before any weight loads: a zoom whose response overflows
    # max_completion_length is dropped (a sample lost to the budget, not to the model), so say so with the numbers.
    budget = tool.resolved(pixel_budget(processor))
    check_token_budget(processor, budget, **rollout, context_length=context_length(args.model_name_or_path))
    sampling = dict(temperature=args.temperature, top_p=args.top_p)
    if args.backend == "vllm":
        backend = VLLMBackend(
            args.model_name_or_path, processor, **sampling, max_images=args.vllm_max_images, dtype=args.dtype,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_len=args.vllm_max_model_len,
            enforce_eager=args.vllm_enforce_eager, seed=args.seed,
        )  # fmt: skip
    else:
        model = load_model(args.model_name_or_path, dtype=args.dtype, attn_implementation=args.attn_implementation)
        backend = TransformersBackend(model.to(device), processor, **sampling)
    return ZoomAgent(backend, processor, tool, **rollout)


def run_evaluation(args: EvalArguments, tool: ToolConfig) -> dict[str, Any]:
    """Evaluate (or resume evaluating) `args.model_name_or_path` on `args.benchmark` with the zoom-in tool and CLIP
    verifier of `tool` (training's: see `parse_args`); returns the metrics written to `<output_dir>/metrics.json`."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_resume(out, args, tool)
    dataset, skipped = read_benchmark(
        args.benchmark, args.data_path, split=args.split, skip_bad_rows=args.skip_bad_rows, rows=args.limit
    )
    # Rows are decoded by the agent, so that an image that does not decode fails its sample, not the run.
    dataset = dataset.cast_column("image", datasets.Image(decode=False))
    ids = dataset["id"]
    selected = range(len(dataset) if args.limit is None else min(args.limit, len(dataset)))
    samples_path = out / SAMPLES_FILE
    done = {record["id"] for record in read_samples(samples_path)}
    todo = [i for i in selected if ids[i] not in done]

    judge = eval_judge_settings(args) if args.judge else None
    if todo:
        set_seed(args.seed)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        agent = build_agent(args, tool, device)
        verifier = ClipVerifier(tool, device=device)
        progress = tqdm(total=len(selected), initial=len(selected) - len(todo), desc=args.benchmark, unit="sample")
        with samples_path.open("a", encoding="utf-8") as sink, progress:
            for start in range(0, len(todo), args.batch_size):
                rows = [dataset[i] for i in todo[start : start + args.batch_size]]
                episodes = agent.run(rows)
                calls = [episode.calls for episode in episodes]
                scores = clip_scores(verifier, [episode.image for episode in episodes], calls)
                # a row, its episode, its calls, their scores
                records = [
                    episode_record(args.benchmark, *s, agent.tokenizer) for s in zip(rows, episodes, calls, scores)
                ]
                if judge is not None:
                    records = judge_records(records, args.benchmark, judge)
                sink.writelines(json.dumps(record) + "\n" for record in records)
                sink.flush()
                progress.update(len(rows))

    records = read_samples(samples_path)
    metrics = compute_metrics(records, args.benchmark, skipped_rows=len(skipped))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    silent = no_valid_call(records, args.max_completion_length, args.max_tool_calling_iterations)
    if silent is not None:
        logger.warning(silent)
    index = {row_id: i for i, row_id in enumerate(ids)}

    def image_of(row_id: str):
        try:
            return open_image(dataset[index[row_id]]["image"])
        except Exception:  # a missing or undecodable image is already this sample's recorded failure
            return None

    title = f"{args.model_name_or_path} on {args.benchmark}"
    write_report(
        out / "report.html", records, image_of, metrics=metrics, title=title, max_samples=args.report_max_samples,
        budgets=rollout_budgets(args, tool),
    )  # fmt: skip
    return metrics
