"""Score a checkpoint on a benchmark with the tool, prompt and answer parsing training used; see docs/evaluation.md.

    python evaluate.py --model_name_or_path outputs/tiny/qwen2_5_vl --benchmark synthetic --limit 8
    python evaluate.py --model_name_or_path <ckpt> --benchmark vstar --data_path /data/vstar_bench
    python evaluate.py --config my_eval.yaml

Writes `outputs/eval/<run>/`: `samples.jsonl` (one line per sample: trajectory, boxes, labels, z_t, answer,
correctness, failure reason), `metrics.json` and `report.html`. Rerunning into the same directory resumes: samples
already in `samples.jsonl` are skipped, and the metrics are recomputed from the whole file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch
from PIL.Image import Image
from tqdm import tqdm
from transformers import set_seed

from agent import Episode, TransformersBackend, VLLMBackend, ZoomAgent, open_image
from data.benchmarks import BENCHMARKS, accuracy_by, benchmark_metrics, mean, read_benchmark, score_answer
from launch import parse_args_and_record
from mapo_trainer import ClipVerifier
from models import load_model, load_processor
from report import write_report
from tools import ToolConfig, ZoomCall, box_contains, boxes_overlap

# Fields that change what a run measures: a resumed run must not mix samples scored under different values (every
# `ToolConfig` field counts too).
RESULT_FIELDS = (
    "model_name_or_path", "benchmark", "data_path", "split", "backend", "dtype", "max_completion_length",
    "max_tool_calling_iterations", "temperature", "top_p", "seed",
)  # fmt: skip


@dataclass
class EvalArguments:
    """What to evaluate, on what, and how. Every field is also a command-line flag and a `--config` YAML key."""

    model_name_or_path: str = field(metadata={"help": "Checkpoint (local folder or hub name) to evaluate."})
    benchmark: str = field(default="synthetic", metadata={"help": "Benchmark reader.", "choices": list(BENCHMARKS)})
    data_path: str | None = field(
        default=None,
        metadata={
            "help": "What you downloaded: the V* folder, an HR-Bench .tsv/.parquet file, the MME-RealWorld folder "
            "(or its Lite folder), or a synthetic save_to_disk folder. None for synthetic: generate a test split."
        },
    )
    split: str | None = field(default=None, metadata={"help": "Split, for formats that have them (synthetic)."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Run folder; default outputs/eval/<model>-<benchmark>[-<data name>]."}
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N rows (quick runs)."})
    skip_bad_rows: bool = field(
        default=False, metadata={"help": "Skip (and count) benchmark rows that fail validation instead of stopping."}
    )
    backend: str = field(
        default="transformers", metadata={"help": "Generation backend.", "choices": ["transformers", "vllm"]}
    )
    batch_size: int = field(default=8, metadata={"help": "Samples whose turns are generated together."})
    max_completion_length: int = field(
        default=2048,
        metadata={
            "help": "One token budget per rollout, shared by every turn and tool response: TRL's "
            "max_completion_length. Default: the checkpoint's RL record (tool_config.json), else 2048."
        },
    )
    max_tool_calling_iterations: int | None = field(
        default=5,
        metadata={
            "help": "Most tool-calling rounds per rollout: TRL's max_tool_calling_iterations. Default: the "
            "checkpoint's RL record, else 5."
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy decoding (the default)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling, when temperature > 0."})
    seed: int = field(default=0, metadata={"help": "Seed for sampled decoding."})
    dtype: str = field(default="auto", metadata={"help": "Model dtype (auto, bfloat16, float32...)."})
    attn_implementation: str | None = field(default=None, metadata={"help": "e.g. sdpa or flash_attention_2."})
    device: str | None = field(
        default=None, metadata={"help": "Device for the model and CLIP (default: cuda if any)."}
    )
    report_max_samples: int = field(
        default=500, metadata={"help": "Samples shown in report.html (all are in samples.jsonl)."}
    )
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM backend only."})
    vllm_max_model_len: int | None = field(default=None, metadata={"help": "vLLM backend only."})
    vllm_max_images: int = field(default=16, metadata={"help": "vLLM backend only: images per conversation."})

    def __post_init__(self):
        if self.output_dir is None:
            name = f"{Path(self.model_name_or_path).name}-{self.benchmark}"
            if self.data_path:
                name += f"-{Path(self.data_path).stem}"
            self.output_dir = str(Path("outputs") / "eval" / name)


# ------------------------------------------------------------------------------------------------------- records
def clip_scores(verifier: ClipVerifier, images: Sequence[Image], calls: Sequence[list[ZoomCall]]) -> list[list]:
    """For each episode (its original image and its calls), per call: `(z_t, z_full)`, the CLIP cosine of the call's
    label with its crop and with the whole image, or None for a call that returned no crop. One batched CLIP call."""
    pairs = [(call, image) for image, episode_calls in zip(images, calls) for call in episode_calls if call.ok]
    cosine = verifier.similarity(
        [call.label for call, _ in pairs] * 2, [call.crop for call, _ in pairs] + [image for _, image in pairs]
    ).tolist()
    scores = iter(zip(cosine[: len(pairs)], cosine[len(pairs) :]))
    return [[next(scores) if call.ok else None for call in episode_calls] for episode_calls in calls]


def _messages(episode: Episode, tokenizer) -> list[dict]:
    """The episode's completion, JSON-ready: assistant turns as parsed (with their raw text, for turns the parser
    could not read) and tool replies as text, each pointing at its call."""
    messages, turns, call = [], iter(episode.turn_ids), 0
    for message in episode.completion:
        if message["role"] == "assistant":
            messages.append(
                {
                    "role": "assistant",
                    "reasoning": message.get("reasoning_content"),
                    "content": message.get("content") or "",
                    "tool_calls": [c.get("function", c) for c in message.get("tool_calls") or []],
                    "raw": tokenizer.decode(next(turns)),
                }
            )
        else:
            content = message["content"]
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            messages.append({"role": "tool", "name": message["name"], "content": text, "call": call})
            call += 1
    return messages


def episode_record(
    benchmark: str, row: dict, episode: Episode, calls: list[ZoomCall], scores: list, tokenizer
) -> dict:
    """The `samples.jsonl` line of one sample; `calls` are `episode.calls`, `scores` their `clip_scores`."""
    correct, reason = score_answer(benchmark, episode.prediction, row["answer"], row["options"])
    messages = _messages(episode, tokenizer)
    turn_of_call = {}
    turn = 0
    for message in messages:
        turn += message["role"] == "assistant"
        if message["role"] == "tool":
            turn_of_call[message["call"]] = turn
    records = []
    for k, (call, score) in enumerate(zip(calls, scores)):
        z, z_full = score or (None, None)
        records.append(
            {
                "t": call.turn,
                "turn": turn_of_call[k],
                "name": call.name,
                "arguments": call.arguments,
                "label": call.label,
                "box": list(call.box) if call.box else None,
                "error": call.error,
                "z": z,
                "z_full": z_full,
                "gap": None if z is None else z <= z_full,
            }
        )
    return {
        "id": row["id"],
        "source": row["source"],
        "question": row["prompt"][-1]["content"],
        "options": list(row["options"]),
        "answer": row["answer"],
        "prediction": episode.prediction,
        "correct": correct,
        "failure": episode.failure or reason,
        "num_turns": episode.num_turns,
        "completion_tokens": len(episode.completion_ids),
        "image_size": list(episode.image.size) if episode.image else None,
        "seen_size": list(episode.seen_size) if episode.seen_size else None,
        "target_bbox": row.get("target_bbox"),
        "target_label": row.get("target_label"),
        "messages": messages,
        "calls": records,
    }


def _target_rate(records: Sequence[dict], hit: Callable[[Sequence[int], Sequence[int]], bool]) -> float | None:
    """Over the valid calls of rows that have a `target_bbox`, the fraction whose crop `hit`s it; None without any."""
    hits = [
        float(hit(call["box"], record["target_bbox"]))
        for record in records
        if record.get("target_bbox")
        for call in record["calls"]
        if call["box"] is not None
    ]
    return mean(hits) if hits else None


def compute_metrics(records: Sequence[dict], benchmark: str, skipped_rows: int = 0) -> dict[str, Any]:
    """Accuracy under the benchmark's reporting rule plus the agent's tool use; definitions in docs/evaluation.md."""
    calls = [call for record in records for call in record["calls"]]
    valid = [call for call in calls if call["box"] is not None]
    scored = [call for call in valid if call["z"] is not None]
    metrics = {
        "benchmark": benchmark,
        "n": len(records),
        "n_failed": sum(record["failure"] is not None for record in records),
        "skipped_rows": skipped_rows,
        "accuracy": mean([float(record["correct"]) for record in records]),
        "accuracy_by_source": accuracy_by(records, lambda r: r["source"]),
        "turns_per_sample": mean([record["num_turns"] for record in records]),
        "calls_per_sample": mean([len(record["calls"]) for record in records]),
        "tool_call_rate": mean([float(bool(record["calls"])) for record in records]),
        "valid_call_rate": len(valid) / len(calls) if calls else None,
        "box_contains_target": _target_rate(records, box_contains),
        "box_touches_target": _target_rate(records, boxes_overlap),
        "mean_z": mean([call["z"] for call in scored]),
        "gap_rate": mean([float(call["gap"]) for call in scored]),
    }
    return metrics | benchmark_metrics(benchmark, records)


# ----------------------------------------------------------------------------------------------------------- run
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


def build_agent(args: EvalArguments, tool: ToolConfig, device: str) -> ZoomAgent:
    """The policy behind the chosen backend, with its processor, loaded as training loads them."""
    processor = load_processor(args.model_name_or_path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    sampling = dict(temperature=args.temperature, top_p=args.top_p)
    if args.backend == "vllm":
        backend = VLLMBackend(
            args.model_name_or_path,
            processor,
            **sampling,
            max_images=args.vllm_max_images,
            dtype=args.dtype,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_len=args.vllm_max_model_len,
            seed=args.seed,
        )
    else:
        model = load_model(args.model_name_or_path, dtype=args.dtype, attn_implementation=args.attn_implementation)
        backend = TransformersBackend(model.to(device), processor, **sampling)
    return ZoomAgent(
        backend,
        processor,
        tool,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
    )


def run_evaluation(args: EvalArguments, tool: ToolConfig) -> dict[str, Any]:
    """Evaluate (or resume evaluating) `args.model_name_or_path` on `args.benchmark` with the zoom-in tool and CLIP
    verifier of `tool` (training's: see `parse_args`); returns the metrics written to `<output_dir>/metrics.json`."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_resume(out, args, tool)
    dataset, skipped = read_benchmark(
        args.benchmark, args.data_path, split=args.split, skip_bad_rows=args.skip_bad_rows
    )
    # Rows are decoded by the agent, so that an image that does not decode fails its sample, not the run.
    dataset = dataset.cast_column("image", datasets.Image(decode=False))
    ids = dataset["id"]
    selected = range(len(dataset) if args.limit is None else min(args.limit, len(dataset)))
    samples_path = out / "samples.jsonl"
    done = {record["id"] for record in read_samples(samples_path)}
    todo = [i for i in selected if ids[i] not in done]

    if todo:
        set_seed(args.seed)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        agent = build_agent(args, tool, device)
        verifier = ClipVerifier(tool, device=device)
        with (
            samples_path.open("a", encoding="utf-8") as sink,
            tqdm(
                total=len(selected), initial=len(selected) - len(todo), desc=f"{args.benchmark}", unit="sample"
            ) as progress,
        ):
            for start in range(0, len(todo), args.batch_size):
                rows = [dataset[i] for i in todo[start : start + args.batch_size]]
                episodes = agent.run(rows)
                calls = [episode.calls for episode in episodes]
                scores = clip_scores(verifier, [episode.image for episode in episodes], calls)
                for row, episode, episode_calls, episode_scores in zip(rows, episodes, calls, scores):
                    record = episode_record(
                        args.benchmark, row, episode, episode_calls, episode_scores, agent.tokenizer
                    )
                    sink.write(json.dumps(record) + "\n")
                sink.flush()
                progress.update(len(rows))

    records = read_samples(samples_path)
    metrics = compute_metrics(records, args.benchmark, skipped_rows=len(skipped))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    index = {row_id: i for i, row_id in enumerate(ids)}

    def image_of(row_id: str):
        try:
            return open_image(dataset[index[row_id]]["image"])
        except Exception:  # a missing or undecodable image is already this sample's recorded failure
            return None

    write_report(
        out / "report.html",
        records,
        image_of,
        metrics=metrics,
        title=f"{args.model_name_or_path} on {args.benchmark}",
        max_samples=args.report_max_samples,
    )
    return metrics


def parse_args(argv: Sequence[str] | None = None) -> tuple[EvalArguments, ToolConfig]:
    """`EvalArguments` and `ToolConfig` from flags and/or a `--config` YAML file (flags win), as the training scripts
    parse them. Settings the command line and YAML leave out come from the checkpoint's `tool_config.json` (what it
    was trained with); a value that differs from that record warns with both."""
    return parse_args_and_record((EvalArguments, ToolConfig), argv)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # skipped rows, say
    args, tool = parse_args(argv)
    metrics = run_evaluation(args, tool)
    print(json.dumps(metrics, indent=2))
    print(f"samples, metrics and report in {args.output_dir}")


if __name__ == "__main__":
    main()
