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
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch
from tqdm import tqdm
from transformers import set_seed
from trl import TrlParser

from agent import Episode, TransformersBackend, VLLMBackend, ZoomAgent, open_image
from data.benchmarks import BENCHMARKS, read_benchmark
from mapo_trainer import ClipVerifier
from models import load_model, load_processor
from report import write_report
from task import OPTION_LETTERS, is_correct, parse_choice

# Fields that change what a run measures: a resumed run must not mix samples scored under different values.
RESULT_FIELDS = (
    "model_name_or_path", "benchmark", "data_path", "split", "backend", "dtype", "max_turns", "max_new_tokens",
    "temperature", "top_p", "seed", "min_pixels", "max_pixels", "clip_model", "clip_pretrained", "max_label_words",
    "max_label_chars",
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
    max_turns: int = field(
        default=6,
        metadata={"help": "Most assistant turns per sample: training's max_tool_calling_iterations (5) + 1."},
    )
    max_new_tokens: int = field(default=1024, metadata={"help": "Most tokens per assistant turn."})
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy decoding (the default)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling, when temperature > 0."})
    seed: int = field(default=0, metadata={"help": "Seed for sampled decoding."})
    min_pixels: int | None = field(default=None, metadata={"help": "Image processor min pixels (None: the model's)."})
    max_pixels: int | None = field(
        default=None, metadata={"help": "Image processor max pixels (None: the model's); use training's value."}
    )
    dtype: str = field(default="auto", metadata={"help": "Model dtype (auto, bfloat16, float32...)."})
    attn_implementation: str | None = field(default=None, metadata={"help": "e.g. sdpa or flash_attention_2."})
    device: str | None = field(
        default=None, metadata={"help": "Device for the model and CLIP (default: cuda if any)."}
    )
    clip_model: str = field(
        default="ViT-B-32", metadata={"help": "open_clip model scoring z_t, or a local directory; use training's."}
    )
    clip_pretrained: str | None = field(default="openai", metadata={"help": "open_clip pretrained tag."})
    max_label_words: int = field(default=12, metadata={"help": "Zoom-in tool label limit; use training's."})
    max_label_chars: int = field(default=80, metadata={"help": "Zoom-in tool label limit; use training's."})
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


# ------------------------------------------------------------------------------------------------------- scoring
_MME_PREFIXES = (
    "The best answer is", "The correct answer is", "The answer is", "The answer", "The best option is",
    "The correct option is", "Best answer:", "Best option:",
)  # fmt: skip


def mme_choice(prediction: str, options: Sequence[str]) -> int | None:
    """The option MME-RealWorld's reference scorer reads in `prediction` (`eval_your_results.py`,
    `extract_characters_regex`): the first capital A-E anywhere, once answer prefixes are removed; without one, the
    option whose "(X) text" contains the prediction. Looser than `task.parse_choice`, and kept so because the
    benchmark's published numbers use it."""
    text = prediction.strip()
    for prefix in _MME_PREFIXES:
        text = text.replace(prefix, "")
    letter = re.search(r"[ABCDE]", text)
    if letter is None:
        if len(text.split()) > 10:
            return None
        choices = [f"({OPTION_LETTERS[i]}) {option}".lower() for i, option in enumerate(options)]
        return next((i for i, choice in enumerate(choices) if text.lower() in choice), None)
    index = OPTION_LETTERS.index(letter.group())
    return index if index < len(options) else None


def score_answer(
    benchmark: str, prediction: str | None, answer: str, options: Sequence[str]
) -> tuple[bool, str | None]:
    """(correct, failure reason) of a final answer under the benchmark's rule.

    Every benchmark uses training's rule (`task.is_correct`: the option letter or the option's text, else normalised
    equality), except MME-RealWorld, whose reference scorer is looser (`mme_choice`). A multiple-choice answer that
    names no option is a failure; a missing answer is the agent's failure, already recorded.
    """
    if prediction is None:
        return False, None
    if not prediction.strip():
        return False, "empty <answer>"
    if not options:
        return is_correct(prediction, answer), None
    if benchmark == "mme_realworld":
        choice = mme_choice(prediction, options)
        correct = choice is not None and choice == parse_choice(answer, options)
    else:
        choice = parse_choice(prediction, options)
        correct = is_correct(prediction, answer, options)
    if choice is None:
        return False, f"answer outside the options: {prediction[:100]!r}"
    return correct, None


def clip_scores(verifier: ClipVerifier, episodes: Iterable[Episode]) -> dict[int, tuple[float, float]]:
    """For every call that returned a crop, keyed by `id(call)`: z_t, the CLIP cosine of its label with its crop,
    and the cosine of the label with the whole image. One batched CLIP call."""
    pairs = [(call, episode.image) for episode in episodes for call in episode.calls if call.ok]
    if not pairs:
        return {}
    labels = [call.label for call, _ in pairs]
    cosine = verifier.similarity(labels * 2, [call.crop for call, _ in pairs] + [image for _, image in pairs]).tolist()
    return {id(call): (cosine[i], cosine[len(pairs) + i]) for i, (call, _) in enumerate(pairs)}


def episode_record(benchmark: str, row: dict, episode: Episode, scores: dict[int, tuple[float, float]]) -> dict:
    """The `samples.jsonl` line of one sample."""
    correct, reason = score_answer(benchmark, episode.prediction, row["answer"], row["options"])
    calls = []
    for call in episode.calls:
        z, z_full = scores.get(id(call), (None, None))
        calls.append(
            {
                "turn": call.turn,
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
        "image_size": list(episode.image.size) if episode.image else None,
        "seen_size": list(episode.seen_size) if episode.seen_size else None,
        "target_bbox": row.get("target_bbox"),
        "target_label": row.get("target_label"),
        "messages": episode.messages,
        "calls": calls,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _accuracy_by(records: Iterable[dict], key) -> dict[str, float]:
    groups = defaultdict(list)
    for record in records:
        groups[key(record)].append(float(record["correct"]))
    return {name: _mean(values) for name, values in sorted(groups.items())}


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
        "accuracy": _mean([float(record["correct"]) for record in records]),
        "accuracy_by_source": _accuracy_by(records, lambda r: r["source"]),
        "turns_per_sample": _mean([record["num_turns"] for record in records]),
        "calls_per_sample": _mean([len(record["calls"]) for record in records]),
        "tool_call_rate": _mean([float(bool(record["calls"])) for record in records]),
        "valid_call_rate": len(valid) / len(calls) if calls else None,
        "mean_z": _mean([call["z"] for call in scored]),
        "gap_rate": _mean([float(call["gap"]) for call in scored]),
    }
    if benchmark == "hrbench":  # the reference reports each category and their mean
        by_category = _accuracy_by(records, lambda r: r["source"].rsplit("/", 1)[-1])
        single, cross = by_category.get("single"), by_category.get("cross")
        metrics |= {"single": single, "cross": cross, "mean": _mean([v for v in (single, cross) if v is not None])}
    if benchmark == "mme_realworld":  # sources are <variant>/<Task>/<Subtask>/<Category>
        metrics["accuracy_by_task"] = _accuracy_by(records, lambda r: r["source"].split("/")[1])
        metrics["accuracy_by_subtask"] = _accuracy_by(records, lambda r: "/".join(r["source"].split("/")[1:3]))
    return metrics


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


def _check_resume(out: Path, args: EvalArguments) -> None:
    """Record the run's arguments; refuse to resume a run made with different result-defining ones."""
    path = out / "eval_args.json"
    current = asdict(args)
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        changed = {k: (previous.get(k), current[k]) for k in RESULT_FIELDS if previous.get(k) != current[k]}
        if changed:
            raise ValueError(f"{out} holds a run with other settings {changed}; choose another --output_dir")
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")


def build_agent(args: EvalArguments, device: str) -> ZoomAgent:
    """The policy behind the chosen backend, with its processor, loaded as training loads them."""
    processor = load_processor(args.model_name_or_path, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    generation = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    if args.backend == "vllm":
        backend = VLLMBackend(
            args.model_name_or_path,
            processor,
            **generation,
            max_images=args.vllm_max_images,
            dtype=args.dtype,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_len=args.vllm_max_model_len,
            seed=args.seed,
        )
    else:
        model = load_model(args.model_name_or_path, dtype=args.dtype, attn_implementation=args.attn_implementation)
        backend = TransformersBackend(model.to(device), processor, **generation)
    return ZoomAgent(
        backend,
        processor,
        max_turns=args.max_turns,
        max_label_words=args.max_label_words,
        max_label_chars=args.max_label_chars,
    )


def run_evaluation(args: EvalArguments) -> dict[str, Any]:
    """Evaluate (or resume evaluating) `args.model_name_or_path` on `args.benchmark`; returns the metrics written to
    `<output_dir>/metrics.json`."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_resume(out, args)
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
        agent = build_agent(args, device)
        verifier = ClipVerifier(args.clip_model, args.clip_pretrained, device=device)
        with (
            samples_path.open("a", encoding="utf-8") as sink,
            tqdm(
                total=len(selected), initial=len(selected) - len(todo), desc=f"{args.benchmark}", unit="sample"
            ) as progress,
        ):
            for start in range(0, len(todo), args.batch_size):
                rows = [dataset[i] for i in todo[start : start + args.batch_size]]
                episodes = agent.run(rows)
                scores = clip_scores(verifier, episodes)
                for row, episode in zip(rows, episodes):
                    sink.write(json.dumps(episode_record(args.benchmark, row, episode, scores)) + "\n")
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


def parse_args(argv: Sequence[str] | None = None) -> EvalArguments:
    """`EvalArguments` from command-line flags and/or a `--config` YAML file (flags win), as the training scripts."""
    (args,) = TrlParser((EvalArguments,)).parse_args_and_config(argv)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # skipped rows, say
    args = parse_args(argv)
    metrics = run_evaluation(args)
    print(json.dumps(metrics, indent=2))
    print(f"samples, metrics and report in {args.output_dir}")


if __name__ == "__main__":
    main()
