"""What the learning-curve runs share (`research/experiment.py`, `research/positive_control.py`): where the runs start,
one RL run and the greedy evaluations of its checkpoints, per-row rates, statistics across seeds, and the curves'
plots. Not a runnable: the runnables import it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import multiprocessing
import resource
import shutil
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from data.task import normalize
from evaluation.run import read_samples
from research.rewards import simulated_reader_reward, target_in_view_reward
from tiny import stages
from tiny.stages import binomial_se, difference_se  # noqa: F401 (research's names for them)

VARIED = (
    "advantage_estimator",
    "semantic_verifier",
    "semantic_score",
    "seed",
    "output_dir",
)  # what the experiment's runs may differ in (`shared_fields`)

# The step figures of `stages.STEP_METRICS`, and the experiment world's rewards.
STEP_METRICS: stages.StepMetrics = stages.STEP_METRICS | {
    "reader_success": (f"rewards/{simulated_reader_reward.__name__}/mean", None),
    "target_in_view": (f"rewards/{target_in_view_reward.__name__}/mean", None),
}


def row_metrics(records: Sequence[dict]) -> dict:
    """Per-row rates of one evaluation (`samples.jsonl` records): `target_seen`, the rows where some valid call's box
    framed the target (`tiny.stages.framing_calls`: what the simulated reader rewards), and `named_and_seen`, those where
    such a call also named the target (what the exact verifier scores 1), over `n` rows; `outcomes`, each row's
    target-seen (1 or 0) in the evaluation's row order, which the learning-curve statistics pair by row."""
    seen, named = [], []
    for record in records:
        frames = stages.framing_calls(record)
        seen.append(bool(frames))
        target = normalize(record.get("target_label") or "")
        named.append(any(normalize(str(call["label"])) == target for call in frames))
    n = len(records)
    return {
        "n": n,
        "target_seen": sum(seen) / n if n else float("nan"),
        "named_and_seen": sum(named) / n if n else float("nan"),
        "outcomes": [int(x) for x in seen],
    }


@dataclass(frozen=True)
class Spread:
    """One figure across seeds: the mean, population std (ddof 0), min and max of the seeds that have a value, and
    how many do (`n`) out of how many there were (`of`)."""

    mean: float
    std: float
    low: float
    high: float
    n: int
    of: int

    @property
    def se(self) -> float:
        """The standard error of the mean: the sample std (ddof 1) over sqrt(n), std / sqrt(n - 1); NaN with one."""
        return self.std / math.sqrt(self.n - 1) if self.n > 1 else float("nan")


def across_seeds(values: Sequence[float | None]) -> Spread | None:
    """The `Spread` of one figure over seeds, ignoring missing ones (None, NaN); None when no seed has a value."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None
    return Spread(
        statistics.fmean(present), statistics.pstdev(present), min(present), max(present), len(present), len(values)
    )


def curve(runs: Sequence[Sequence[dict]], metric: str, window: int = 1) -> tuple[list[int], list[Spread | None]]:
    """`metric` per step across runs (one `stages.rl_step_log` per seed), steps matched by number: every step any run
    logged, and its `Spread` (None where no run has a value). With `window` > 1, each run's values are first averaged
    over bins of `window` steps (steps 1..window at step `window`, and so on; a bin's missing values left out)."""
    by_step = [binned({row["step"]: row.get(metric) for row in run}, window) for run in runs]
    steps = sorted({step for run in by_step for step in run})
    return steps, [across_seeds([run.get(step) for run in by_step]) for step in steps]


def binned(values: dict[int, float | None], window: int) -> dict[int, float | None]:
    """`{step: value}` averaged over bins of `window` steps, each keyed by its last step (`ceil(step / window) *
    window`), missing values (None, NaN) left out; a bin with none is None. `window` 1: unchanged."""
    if window <= 1:
        return values
    bins: dict[int, list[float]] = {}
    for step, value in values.items():
        present = bins.setdefault(-(-step // window) * window, [])
        if value is not None and not math.isnan(value):
            present.append(value)
    return {step: statistics.fmean(v) if v else None for step, v in sorted(bins.items())}


@dataclass(frozen=True)
class Paired:
    """An arm against another on the same seeds: the per-seed differences, their mean and its standard error (sample
    std with ddof 1 over sqrt(n); NaN with one seed). `research/training_tail.py` reads it; the learning-curve verdict
    pairs by row as well (`research.curve_stats`)."""

    diffs: tuple[float, ...]
    mean: float
    se: float

    @property
    def n(self) -> int:
        return len(self.diffs)


def paired(arm: dict[int, float], reference: dict[int, float]) -> Paired | None:
    """`Paired` over the seeds both have a value for; None when they share none."""
    seeds = sorted(set(arm) & set(reference))
    diffs = tuple(arm[s] - reference[s] for s in seeds)
    if not diffs:
        return None
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return Paired(diffs, statistics.fmean(diffs), se)


def format_spread(spread: Spread | None) -> str:
    """`mean ± std`, with `(n/of seeds)` when some seeds had no value, and `—` when none had."""
    if spread is None:
        return "— (no value)"
    text = f"{spread.mean:.3f} ± {spread.std:.3f}"
    return text if spread.n == spread.of else f"{text} ({spread.n}/{spread.of} seeds)"


def plot_curves(
    curves: dict[str, tuple[list[int], list[Spread | None]]],
    title: str,
    path: Path,
    xlabel: str = "RL step",
    band: str = "range",
) -> Path:
    """One PNG: per arm, the mean across seeds (line and points) and a band, the min-max `range` or +-1 standard
    error (`se`; none at a step with one seed); a step where no seed logged the figure is a gap, and an arm with no
    value at all says so in the legend."""
    fig = Figure(figsize=(6.4, 3.6), dpi=100)  # the object API: no pyplot, no display backend, nothing to close
    ax = fig.subplots()
    every_step = sorted({step for steps, _ in curves.values() for step in steps})
    for method, (steps, spreads) in curves.items():
        nan = float("nan")
        mean = [s.mean if s else nan for s in spreads]
        if band == "se":
            low = [s.mean - s.se if s else nan for s in spreads]
            high = [s.mean + s.se if s else nan for s in spreads]
        else:
            low = [s.low if s else nan for s in spreads]
            high = [s.high if s else nan for s in spreads]
        seeds = max((s.of for s in spreads if s), default=0)
        label = f"{method} ({seeds} seeds)" if any(spreads) else f"{method} (no value logged)"
        (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=label)
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if not any(spread for _, spreads in curves.values() for spread in spreads):
        ax.text(0.5, 0.5, "no run logged this figure", transform=ax.transAxes, ha="center", va="center")
    if every_step:
        ax.set_xlim(every_step[0] - 0.5, every_step[-1] + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


@dataclass(frozen=True)
class Start:
    """What every run starts from: the SFT checkpoint, the data it was trained on, and the verifier."""

    sft: Path
    data: Path
    clip: Path


def locate(args: argparse.Namespace) -> Start:
    """Where the runs start: `--sft_model` with its data and verifier (beside it unless named), which must exist,
    or the folders in `--output_dir` that `prepare` fills."""
    if not args.sft_model:
        return Start(args.output_dir / "sft", args.output_dir / "data", args.output_dir / "clip")
    parent = args.sft_model.parent
    start = Start(args.sft_model, args.data or parent / "data", args.clip or parent / "clip")
    missing = [f"{name} {path}" for name, path in vars(start).items() if not path.exists()]
    if missing:
        raise FileNotFoundError(f"--sft_model: {', '.join(missing)} not found (name them with --data / --clip)")
    return start


def world(args: argparse.Namespace) -> dict:
    """`build_synthetic`'s keywords over the SFT recipe's world: square images of `--image_side` (0: none)."""
    return {"min_size": args.image_side, "max_size": args.image_side} if args.image_side else {}


def sft_overrides(args: argparse.Namespace) -> dict:
    """The SFT recipe's fields a run sets: `--sft_learning_rate`, and with `--sft_start_step` a checkpoint saved at
    that step (model only: RL starts from its weights, not its optimizer)."""
    fields = {"learning_rate": args.sft_learning_rate} if args.sft_learning_rate else {}
    if args.sft_start_step:
        fields |= {"save_strategy": "steps", "save_steps": args.sft_start_step, "save_only_model": True}
    return fields


def sft_start(sft_dir: Path, step: int) -> Path:
    """The checkpoint RL starts from: the SFT's end (`step` 0), or its checkpoint at `step` (`sft_overrides`)."""
    return sft_dir / f"checkpoint-{step}" if step else sft_dir


def prepare(args: argparse.Namespace, start: Start, stage: stages.Stages) -> Start:
    """The demo's stages in the run's world (`world`): verifier, data, SFT of `--sft_steps` (`sft_overrides`); returns
    `start` with the SFT checkpoint RL starts from (`sft_start`)."""
    kit = stages.tiny_kit()
    threads = stages.alone_threads()
    stage("train the CLIP verifier", lambda: stages.train_verifier(start.clip, kit, args.clip_steps))
    stage("generate synthetic data", lambda: stages.make_data(start.data, args.train_rows, args.test_rows,
                                                              **world(args)))  # fmt: skip
    fields = sft_overrides(args)
    stage(
        "SFT cold start",
        lambda: stages.run_sft(kit["policy"], start.data, start.sft, args.sft_steps, threads, **fields),
    )
    return dataclasses.replace(start, sft=sft_start(start.sft, args.sft_start_step))


def shared_fields(parsed: tuple) -> dict:
    """Every parsed field of one run but those allowed to vary (`VARIED`); enum values as the recipe writes them
    (`constant`, not `SchedulerType.CONSTANT`)."""
    values = {}
    for part in parsed:
        values |= {k: getattr(v, "value", v) for k, v in dataclasses.asdict(part).items() if k not in VARIED}
    return values


def evaluate(model: Path, start: Start, eval_dir: Path, rows: int, budget: dict) -> dict:
    """Greedy evaluation of `model` on the first `rows` test rows (`stages.evaluate`, CLIP's z_t): the summary the
    demo reports, plus `row_metrics`."""
    metrics = stages.evaluate(model, start.data, eval_dir, rows, clip_model=start.clip, **budget)
    return stages.eval_summary(metrics, eval_dir) | row_metrics(read_samples(eval_dir / stages.SAMPLES_FILE))


def train_and_evaluate(
    argv: list[str],
    start: Start,
    eval_dir: Path,
    rows: int,
    stage: stages.Stages,
    name: str,
    eval_every: int,
    threads: int = 1,
) -> dict:
    """One RL run on `threads` torch threads and the evaluation of its model at every `eval_every` steps and at its
    end: its steps (`stages.rl_step_log`), `{step: evaluation}` and the zero-signal warnings."""
    training_args = stages.rl_args(argv)[1]
    rl_dir = Path(training_args.output_dir)
    shutil.rmtree(rl_dir, ignore_errors=True)  # a rerun never mixes with an earlier run's files
    steps = stages.rl_step_log(stage(f"RL {name}", lambda: stages.run_rl(argv, threads)), STEP_METRICS)
    points = {}
    if rows:
        last = training_args.max_steps
        for step in range(eval_every, last, eval_every) if eval_every else ():
            checkpoint = rl_dir / f"checkpoint-{step}"
            points[step] = stage(
                f"evaluate {name} at step {step}",
                lambda checkpoint=checkpoint, step=step: evaluate(
                    checkpoint, start, eval_dir / f"step{step}", rows, {}
                ),
            )
        points[last] = stage(f"evaluate {name}", lambda: evaluate(rl_dir, start, eval_dir / "final", rows, {}))
    final = points[max(points)] if points else None
    warnings = stages.signal_warnings({"eval": {"test": final} if final else {}, "rl_steps": steps})
    return {"seed": training_args.seed, "steps": steps, "evals": points, "warnings": warnings}


@dataclass(frozen=True)
class Job:
    """One run of `train_and_evaluate_all`: `rl.py`'s argv, the start, where its evaluations go, the held-out rows of
    each, its name in the stages' log, the evaluation interval, and where its result is cached (None: not cached)."""

    argv: list[str]
    start: Start
    eval_dir: Path
    rows: int
    name: str
    eval_every: int
    cache: Path | None = None
    key: str = ""  # what the cached result must have been made from (`cache_key`)


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its children it has waited for (`rl.py`) so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cache_key(argv: Sequence[str], rows: int, start_digest: str) -> str:
    """What a cached run must match to be reused: its command line, its evaluations' rows and its start's contents."""
    return hashlib.sha256(json.dumps([list(map(str, argv)), rows, start_digest]).encode()).hexdigest()[:16]


def start_digest(start: Start) -> str:
    """A hash of the files of the start (the SFT checkpoint, the data, the verifier): a start remade with other
    weights or rows invalidates every cached run."""
    digest = hashlib.sha256()
    for root in (start.sft, start.data, start.clip):
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode())
            with path.open("rb") as handle:
                for block in iter(lambda handle=handle: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def cached(job: Job) -> dict | None:
    """The job's cached result when its cache file holds one made from the same `key`, else None; evaluation steps
    back to integers (JSON keys are strings)."""
    if job.cache is None or not job.cache.exists():
        return None
    saved = json.loads(job.cache.read_text(encoding="utf-8"))
    if saved.get("key") != job.key:
        return None
    result = saved["result"]
    return result | {"evals": {int(step): e for step, e in result["evals"].items()}}


def run_job(job: Job, threads: int) -> dict:
    """`train_and_evaluate` of one job on `threads` torch threads, with its wall time (`seconds`) and CPU time
    (`cpu_seconds`, its evaluations' and its `rl.py`'s); the result is written to the job's cache as soon as it ends,
    so an interrupted experiment resumes after its last finished run."""
    stage = stages.Stages()
    cpu = cpu_seconds()
    result = train_and_evaluate(job.argv, job.start, job.eval_dir, job.rows, stage, job.name, job.eval_every, threads)
    result |= {"seconds": stage.total(), "cpu_seconds": cpu_seconds() - cpu}
    if job.cache is not None:
        job.cache.parent.mkdir(parents=True, exist_ok=True)
        partial = job.cache.with_suffix(".partial")
        partial.write_text(json.dumps({"key": job.key, "argv": job.argv, "result": result}) + "\n", encoding="utf-8")
        partial.replace(job.cache)  # atomic: a run killed while writing leaves no half-written result
    return result


def _one_job(job: Job) -> dict:
    """`run_job` in a worker process of `train_and_evaluate_all`, on one torch thread (the rollouts' `rl.py` and the
    in-process evaluations alike)."""
    import torch  # in the worker: spawn starts it bare

    torch.set_num_threads(1)
    return run_job(job, threads=1)


def train_and_evaluate_all(jobs: Sequence[Job], workers: int) -> list[dict]:
    """`run_job` of every job, in order. One worker runs them in series on `stages.alone_threads()`; more run that
    many at once on one torch thread each. On the idle 2-core machine two 1-thread RL runs side by side took 60 s for
    16 steps each, one alone 59 s, and one on 2 threads 1.46x less than alone (2026-12-04): 2 workers finish a series
    1.3x sooner."""
    if workers <= 1:
        return [run_job(job, stages.alone_threads()) for job in jobs]
    # spawn: a forked worker would inherit the parent's torch thread pool and any loaded model.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_one_job, jobs))


def results_hash(payload: dict) -> str:
    """A short hash of everything the report's numbers come from, as `results.json` holds them (keys as strings)."""
    as_saved = json.loads(json.dumps(payload))
    return hashlib.sha256(json.dumps(as_saved, sort_keys=True).encode()).hexdigest()[:12]


def plot_evaluations(results: dict, sft: dict, path: Path, band: str = "range") -> Path:
    """Greedy target-seen per evaluation point (step 0 is the SFT checkpoint), mean across seeds per arm with a band
    (`plot_curves`): Figure 1's kind, on the held-out rows."""
    curves = {}
    for arm, runs in results.items():
        by_step = [
            {0: sft["target_seen"], **{int(k): e["target_seen"] for k, e in run["evals"].items()}} for run in runs
        ]
        steps = sorted({s for run in by_step for s in run})
        curves[arm] = (steps, [across_seeds([run.get(s) for run in by_step]) for s in steps])
    return plot_curves(curves, "greedy target-seen (held-out)", path, xlabel="RL step (0: SFT)", band=band)
