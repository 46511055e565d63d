"""An evaluation run: the agent on a benchmark's rows, resumable, written as `samples.jsonl`, `metrics.json` and
`report.html` in its output folder (`evaluate.py` is its command line).

Data-parallel under `accelerate launch --num_processes N evaluate.py ...` (or `torchrun`): process r of N takes every
N-th selected row from the r-th, less those already recorded, and appends its records to `samples.rank<r>.jsonl`, on GPU `cuda:<LOCAL_RANK>`; the first process
waits until every selected row is recorded in some file, then merges the parts into `samples.jsonl` and writes the
metrics and report. No process group is needed: the launcher stops every process when one fails. An interrupted run
resumes with any number of processes (the rows done are those recorded in `samples.jsonl` or any part)."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import torch
from tqdm import tqdm
from transformers import set_seed
from trl import ModelConfig

from configs import EvalArguments
from data.benchmarks import read_benchmark
from evaluation.agent import Episode, TransformersBackend, VLLMBackend, ZoomAgent, open_image
from evaluation.grounding import grounding, z_by_hit
from evaluation.metrics import (
    clip_scores,
    compute_metrics,
    episode_record,
    judge_records,
    no_valid_call,
    reply_metrics,
)
from evaluation.report import write_report
from evaluation.robustness import (
    RELEASED,
    SHUFFLED,
    Unit,
    avg_at_k,
    check_samples,
    draw_seed,
    fixed_gold_letter,
    order_check,
    plan_units,
    shuffle_seed,
    unit_row,
)
from evaluation.tool_effect import tool_effect
from repairs.token_budget import check_token_budget
from rewards import get_reward_funcs
from rewards.judge import JudgeSettings, judge_settings
from rewards.verifiers import ClipVerifier
from tools import ToolConfig
from utils.checks import check_vllm_model, model_config
from utils.models import context_length, load_model, load_processor, pixel_budget

logger = logging.getLogger(__name__)

# Fields that change what a run measures: a resumed run must not mix samples scored under different values (every
# `ToolConfig` field counts too).
RESULT_FIELDS = (
    "model_name_or_path", "benchmark", "data_path", "split", "backend", "dtype", "max_completion_length",
    "max_tool_calling_iterations", "temperature", "top_p", "seed", "sample_seed", "reward_funcs", "judge",
    "judge_model", "judge_prompt", "judge_verdict", "samples", "option_shuffle_seed", "no_tools",
)  # fmt: skip
# What a run recorded before a field existed meant: its value then (one greedy sample in the released order, tools on).
UNRECORDED_RESULT_FIELDS = {"samples": 1, "option_shuffle_seed": None, "no_tools": False}
SAMPLES_FILE = "samples.jsonl"  # one record a sample (`evaluation.metrics.episode_record`), in the output folder
PART_GLOB = "samples.rank*.jsonl"  # a data-parallel process's records, merged into SAMPLES_FILE at the end
ROLLOUT_FIELDS = ("max_completion_length", "max_tool_calling_iterations")  # the rollout budget, `GRPOConfig`'s fields
MERGE_POLL_SECONDS = 5.0
# The verifier's z_t over crops that hit and missed the target box (`grounding.z_by_hit`), beside metrics.json, whose
# figures a data-parallel run reproduces up to float rounding: this split depends on which label went with which crop,
# which the tests' scripted policy sets by batch position (docs/evaluation.md, "Grounding").
GROUNDING_FILE = "grounding_z.json"


def read_samples(path: Path, *, mend: bool = True) -> list[dict]:
    """The records of `samples.jsonl` (or a part). A run killed mid-write leaves a partial last line: it is dropped
    (and, with `mend`, cut from the file, so the next append starts on a fresh line) and that sample runs again.
    Another process's part, still being written, is read with `mend=False`. Any other line that is not a record is
    an error naming the file and the line: the writer never leaves one, so it is not ours to guess what to drop."""
    if not path.exists():
        return []
    # split as bytes: a write cut inside a multi-byte character must not make the whole file undecodable
    complete, _, partial = path.read_bytes().rpartition(b"\n")
    if partial and mend:
        logger.warning("%s: dropping a partial last line (%d bytes) an interrupted write left", path, len(partial))
        path.write_bytes(complete + b"\n" if complete else b"")
    return [_sample(path, number, line) for number, line in enumerate(complete.split(b"\n"), 1) if line]


def _sample(path: Path, number: int, line: bytes) -> dict:
    """The record on line `number` of `path`, or a ValueError naming both and how to recover."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        problem = f"not UTF-8 (byte {err.start})"
    except RecursionError:
        problem = "not JSON: nested too deep to parse"
    except ValueError as err:
        problem = f"not JSON: {str(err)[:120]}"
    else:
        if isinstance(record, dict) and isinstance(record.get("id"), str):
            return record
        problem = "not a JSON object with a string id"
    raise ValueError(
        f"{path}: line {number} is not a sample record ({problem}); delete that line (its sample runs again) or "
        "evaluate into another --output_dir"
    )


def process_shard() -> tuple[int, int, int]:
    """(rank, world size, local rank) of this process as `accelerate launch` / `torchrun` set them, else (0, 1, 0)."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def recorded_ids(out: Path) -> set[str]:
    """Ids of the samples recorded in `out`: in `samples.jsonl` and in every process's part, whatever the number of
    processes of the run that wrote them."""
    paths = [out / SAMPLES_FILE, *sorted(out.glob(PART_GLOB))]
    return {record["id"] for path in paths for record in read_samples(path, mend=path.name == SAMPLES_FILE)}


def merge_parts(out: Path) -> list[dict]:
    """Append each part's records not yet in `samples.jsonl` to it, delete the parts, and return every record."""
    main = out / SAMPLES_FILE
    records = read_samples(main)
    seen = {record["id"] for record in records}
    with main.open("a", encoding="utf-8") as sink:
        for part in sorted(out.glob(PART_GLOB)):
            for record in read_samples(part, mend=False):
                if record["id"] not in seen:
                    seen.add(record["id"])
                    records.append(record)
                    sink.write(json.dumps(record) + "\n")
    for part in out.glob(PART_GLOB):
        part.unlink()
    return records


def process_share(selected: list[int], ids: Sequence[str], done: set[str], rank: int, world: int) -> list[int]:
    """Process `rank`'s rows: every `world`-th of the selection from the `rank`-th, less those recorded. A share of
    the selection, not of the rows left: the processes read what is done at different moments (one may have
    recorded a row in between), and shares of what each saw left could leave a row to no one."""
    return [i for i in selected[rank::world] if ids[i] not in done]


def select_rows(n: int, limit: int | None, sample_seed: int | None) -> list[int]:
    """Indices of the rows to evaluate: the first `limit`, or with `sample_seed` a seeded random sample of `limit` across
    all `n` (the same on every process and every resume)."""
    order = list(range(n))
    if sample_seed is not None:
        random.Random(sample_seed).shuffle(order)
    return order if limit is None else order[:limit]


def reward_scores(
    specs: Sequence[str], rows: Sequence[dict], episodes: Sequence[Episode]
) -> list[dict[str, float | None]]:
    """Each rollout scored by the RL rewards `specs`, called as TRL's `_calculate_rewards` calls them: the parsed
    completion, the prompt, the environment, and every other dataset column as a keyword (docs/evaluation.md)."""
    columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "image")} if rows else {}
    scores = [{} for _ in rows]
    for spec, func in zip(specs, get_reward_funcs(specs)):
        values = func(
            prompts=[row["prompt"] for row in rows],
            completions=[episode.completion for episode in episodes],
            completion_ids=[episode.completion_ids for episode in episodes],
            environments=[episode.env for episode in episodes],
            **columns,
        )
        for record, value in zip(scores, values):
            record[spec] = None if value is None else float(value)
    return scores


def _check_resume(out: Path, args: EvalArguments, tool: ToolConfig, seed: int | None = None) -> None:
    """Record the run's settings (with the option-shuffling seed `seed` they resolve to); refuse to resume a run made
    with different result-defining ones."""
    path = out / "eval_args.json"
    current = asdict(args) | {"tool": asdict(tool), "option_shuffle_seed": seed}
    if path.exists():
        try:
            previous = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise ValueError(
                f"{path} is not the JSON a run writes ({type(err).__name__}: {str(err)[:120]}); choose another "
                "--output_dir (deleting it would resume without checking the samples there were made the same way)"
            ) from err
        if not isinstance(previous, dict):
            raise ValueError(
                f"{path} holds a JSON {type(previous).__name__}, not a run's settings; choose another --output_dir"
            )
        recorded = {k: previous.get(k, UNRECORDED_RESULT_FIELDS.get(k)) for k in (*RESULT_FIELDS, "tool")}
        changed = {k: (recorded[k], current[k]) for k in (*RESULT_FIELDS, "tool") if recorded[k] != current[k]}
        if changed:
            raise ValueError(f"{out} holds a run with other settings {changed}; choose another --output_dir")
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")


def rollout_budgets(args: EvalArguments, tool: ToolConfig) -> dict[str, Any]:
    """The pixel and token budgets the rollouts ran under, as the report states them (None: the processor's own)."""
    pixels = {name: getattr(tool, name) for name in ("min_pixels", "max_pixels", "crop_max_pixels", "crop_min_pixels")}
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
        # before its engine starts: an architecture the installed vLLM lacks, a dtype its CPU build cannot run
        check_vllm_model(args.model_name_or_path, model_config(ModelConfig(args.model_name_or_path)), args.dtype)
        backend = VLLMBackend(
            args.model_name_or_path, processor, **sampling, max_images=args.vllm_max_images, dtype=args.dtype,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_len=args.vllm_max_model_len,
            enforce_eager=args.vllm_enforce_eager, seed=args.seed,
        )  # fmt: skip
    else:
        model = load_model(args.model_name_or_path, dtype=args.dtype, attn_implementation=args.attn_implementation)
        backend = TransformersBackend(model.to(device), processor, **sampling)
    return ZoomAgent(backend, processor, tool, **rollout, withhold_tools=args.no_tools)


def run_evaluation(
    args: EvalArguments, tool: ToolConfig, shard: tuple[int, int, int] | None = None
) -> dict[str, Any] | None:
    """Evaluate (or resume evaluating) `args.model_name_or_path` on `args.benchmark` with the zoom-in tool and CLIP
    verifier of `tool` (training's: see `parse_args`); returns the metrics written to `<output_dir>/metrics.json` (on
    the first process; the others return None once their rows are recorded). `shard`: (rank, world size, local
    rank), by default the launcher's (`process_shard`)."""
    out = Path(args.output_dir)
    rank, world, local_rank = shard or process_shard()
    check_samples(args.samples, args.temperature)
    shuffle_seed(args.shuffle_options)  # a setting that is not one fails before the data is read
    # a sampled selection draws from every row, so the synthetic split is drawn whole
    rows_needed = args.limit if args.sample_seed is None else None
    dataset, skipped = read_benchmark(
        args.benchmark, args.data_path, split=args.split, skip_bad_rows=args.skip_bad_rows, rows=rows_needed
    )
    # "auto" shuffles where every right option sits under one letter, as V*'s annotation order has it: from the rows
    fixed = fixed_gold_letter(dataset["answer"], dataset["options"])
    seed = shuffle_seed(args.shuffle_options, fixed)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        _check_resume(out, args, tool, seed)
    else:
        _wait_for(lambda: (out / "eval_args.json").is_file(), "the first process's eval_args.json", out)
    # Rows are decoded by the agent, so that an image that does not decode fails its sample, not the run.
    dataset = dataset.cast_column("image", datasets.Image(decode=False))
    ids = dataset["id"]
    units = plan_units(ids, select_rows(len(dataset), args.limit, args.sample_seed), args.samples, seed)
    unit_ids = [unit.id for unit in units]
    mine = process_share(list(range(len(units))), unit_ids, recorded_ids(out), rank, world)
    samples_path = out / (SAMPLES_FILE if world == 1 else f"samples.rank{rank}.jsonl")

    judge = eval_judge_settings(args) if args.judge else None
    if mine:
        set_seed(args.seed + rank)
        cuda = f"cuda:{local_rank}" if world > 1 else "cuda"
        device = args.device or (cuda if torch.cuda.is_available() else "cpu")
        agent = build_agent(args, tool, device)
        verifier = ClipVerifier(tool, device=device)
        total = len(units) if world == 1 else len(mine)
        progress = tqdm(
            total=total, initial=total - len(mine), desc=f"{args.benchmark} [{rank}/{world}]", unit="sample"
        )
        with samples_path.open("a", encoding="utf-8") as sink, progress:
            for start in range(0, len(mine), args.batch_size):
                rows = [
                    _unit_row(dataset[units[i].row], units[i], seed, args)
                    for i in mine[start : start + args.batch_size]
                ]
                if args.temperature > 0:  # each batch's draw fixed by the seed and its first unit, whoever runs it
                    set_seed(draw_seed(args.seed, rows[0]["id"]))
                episodes = agent.run(rows)
                calls = [episode.calls for episode in episodes]
                scores = clip_scores(verifier, [episode.image for episode in episodes], calls)
                # a row, its episode, its calls, their scores
                records = [
                    episode_record(args.benchmark, *s, agent.tokenizer) for s in zip(rows, episodes, calls, scores)
                ]
                if judge is not None:
                    records = judge_records(records, args.benchmark, judge)
                if args.reward_funcs:
                    for record, paid in zip(records, reward_scores(args.reward_funcs, rows, episodes)):
                        record["rewards"] = paid
                sink.writelines(json.dumps(record) + "\n" for record in records)
                sink.flush()
                progress.update(len(rows))

    if rank != 0:
        return None
    wanted = set(unit_ids)
    _wait_for(lambda: wanted <= recorded_ids(out), f"the other {world - 1} processes' samples", out)
    records = [record for record in merge_parts(out) if record["id"] in wanted]
    metrics = run_metrics(records, args, seed, skipped_rows=len(skipped))
    if seed is not None:
        metrics["answer_order"]["why"] = (
            f"auto: every multiple-choice row's right option is {fixed} as read"
            if str(args.shuffle_options).strip().lower() == "auto"
            else f"--shuffle_options {args.shuffle_options}"
        )
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    if "grounding" in metrics:  # z_t of the crops that hit and missed: `GROUNDING_FILE`
        z_split = {"z_by_hit": z_by_hit(records_in_order(records, seed))}
        (out / GROUNDING_FILE).write_text(json.dumps(z_split, indent=2) + "\n", encoding="utf-8")
    silent = no_valid_call(records, args.max_completion_length, args.max_tool_calling_iterations)
    if silent is not None:
        logger.warning(silent)
    index = {unit.id: unit.row for unit in units}

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


def _unit_row(row: dict, unit: Unit, seed: int | None, args: EvalArguments) -> dict:
    """The dataset row as `unit` shows it (`robustness.unit_row`), its id the unit's; a run of one greedy sample in
    the released order keeps its rows (and records) as they were."""
    if args.samples == 1 and seed is None:
        return row
    shown = unit_row(row, unit, seed)
    extra = {"question_id": unit.question_id, "order": unit.order, "sample": unit.sample}
    return shown | {"id": unit.id} | extra | ({} if seed is None else {"option_order": shown["option_order"]})


def records_in_order(records: list[dict], seed: int | None) -> list[dict]:
    """The records of the headline order: the shuffled one when options are shuffled, else the released one."""
    headline = SHUFFLED if seed is not None else RELEASED
    return [record for record in records if record.get("order", RELEASED) == headline]


def run_metrics(records: list[dict], args: EvalArguments, seed: int | None, skipped_rows: int = 0) -> dict[str, Any]:
    """metrics.json: `compute_metrics` of the headline order's records (the shuffled order when options are
    shuffled) with the reply-level reading beside (`reply_metrics`), their grounding on rows with a target box
    (`grounding`), their Avg@k with its interval (`avg_at_k`), and with shuffling the released order's figure beside it
    and the verdicts that flip (`answer_order`)."""
    primary = records_in_order(records, seed)
    metrics = compute_metrics(primary, args.benchmark, skipped_rows=skipped_rows) | reply_metrics(primary)
    metrics["avg_at_k"] = avg_at_k(args.benchmark, primary, args.samples, args.temperature)
    if seed is not None:
        metrics["answer_order"] = order_check(args.benchmark, records, seed)
    grounded = grounding(primary)
    if grounded is not None:
        metrics["grounding"] = grounded
    metrics["tools_withheld"] = args.no_tools
    if args.with_tools_run is not None:  # matched by sample id: the same rows, orders and samples
        metrics["tool_effect"] = tool_effect(read_samples(Path(args.with_tools_run) / SAMPLES_FILE), records)
    return metrics


def _wait_for(ready, what: str, out: Path) -> None:
    """Poll `ready()` (a data-parallel evaluation's hand-over, through files in `out`), saying every minute what it
    waits for; the launcher stops this process if another one fails, so the wait cannot outlive the run."""
    start = last = time.monotonic()
    while not ready():
        time.sleep(MERGE_POLL_SECONDS)
        if time.monotonic() - last >= 60:
            last = time.monotonic()
            logger.warning("waiting %.0f s for %s in %s", last - start, what, out)
