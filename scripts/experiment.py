"""`make experiment`: advantage estimators compared from one SFT checkpoint, on the tiny models, on CPU.

From ONE SFT checkpoint, with its data and its CLIP verifier, every estimator in `--methods` (default grpo, mapo,
hpo; any of `configs.ADVANTAGE_ESTIMATORS`) trains with the tiny RL recipe (recipes/tiny/rl/config_mapo.yaml)
once per seed in `--seeds`: same data, steps, rollout budget and hyper-parameters. Only `advantage_estimator` and
`seed` change between runs; every other parsed field is compared across runs before anything trains, so no method
can be tuned on its own. The seed is RL's (data order and sampling) and the final evaluation's.

The recipe gets the same overrides in every run:
- `hpo_text_encoder`: the tiny kit's text encoder (the recipe's default, Qwen3-Embedding-0.6B, is a download);
- `hpo_min_positive_steps` = `hpo_min_negative_steps` = 1: with the tiny recipe's groups of 2 rollouts, a group has
  a success and a failure or nothing to transport, and the authors' 4 / 4 would send nearly every group back to the
  episode advantage. Only the hpo estimators read these three fields, so they cannot change the grpo or mapo runs;
- `variance_probe_steps` (`--probe_steps`): the gradient-variance probe, at the same interval in every run; it never
  touches the optimizer.

The stages are the demo's (`tiny.stages`): without `--sft_model` the verifier, the data and the SFT checkpoint are made as `make demo`
makes them (same sizes and flags), else they are reused (`make demo`'s layout: `--sft_model outputs/demo/sft` finds
`outputs/demo/data` and `outputs/demo/clip` beside it). Every step of every run logs, from `trainer.state.log_history`
(`stages.rl_step_log`): mean z_t, valid-call rate, accuracy, reward std, advantage std, and the probe's gradient-norm
variance where it ran; a figure TRL did not log at a step (no valid call: no z_t) stays missing, shown as a gap in
the plots and counted in the tables. Each final RL model is then evaluated on the test split as the demo does.

Models and evaluations go to `outputs/experiment/` (`--output_dir`); the report to `docs/experiment.md` (`--report`),
with its plots and `results.json` (every run's steps and evaluation) in `docs/experiment/`: the command, the setup,
curves per method (mean across seeds, min-max band), tables of final figures, warnings for runs with no signal, and
a "What it shows" section left to a person (a hand-written one survives regeneration).

    make experiment                                      # verifier, data and SFT as the demo makes them, then RL
    make experiment ARGS="--sft_model outputs/demo/sft"  # reuse make demo's SFT checkpoint, data and verifier
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from configs import ADVANTAGE_ESTIMATORS
from data.benchmarks import load_saved_split
from tiny import stages

DEFAULT_METHODS = ("grpo", "mapo", "hpo")
DEFAULT_SEEDS = (0, 1, 2)
# Measured on the 2-core CPU machine (2026-11-30), tiny RL recipe from the demo's 400-step SFT checkpoint, probe at
# every step: 0.6-1.1 s per RL step and 0.3 s per evaluated row with the cores idle, the verifier, data and SFT at
# the demo's sizes about 5 min. A concurrent torch job on the same 2 cores made steps 15-25 s: 20 times slower.
# They size the default run (about 25 min idle) and the estimate printed before it starts.
SECONDS_PER_STEP = 1.0
SECONDS_PER_EVAL_ROW = 0.3
SECONDS_PER_RUN = 6.0  # loading the policy, the verifier and (hpo) the text encoder; saving the model
SECONDS_TO_PREPARE = 300.0  # without --sft_model: the demo's verifier, data and SFT stages
DEFAULT_RL_STEPS = 100

VARIED = ("advantage_estimator", "seed", "output_dir")  # the only fields that may differ between runs
# The fields the report lists as the shared setup (all other fields are shared too, and checked).
SETUP_FIELDS = (
    "reward_funcs", "learning_rate", "per_device_train_batch_size", "num_generations", "max_completion_length",
    "max_tool_calling_iterations", "temperature", "loss_type", "beta", "semantic_beta", "semantic_lambda",
    "semantic_score", "no_tool_semantic", "hpo_omega", "hpo_min_positive_steps", "hpo_min_negative_steps",
    "hpo_text_encoder", "variance_probe_steps", "variance_probe_rows", "clip_model",
)  # fmt: skip

# The curves, by `stages.STEP_METRICS` name: title and what the figure is.
CURVES = {
    "z_mean": ("mean z_t", "CLIP cosine of each valid call's label and crop (semantic/z_mean)"),
    "valid_call_rate": ("valid-call rate", "share of zoom-in calls that returned a crop (1 - tools/zoom_error_rate)"),
    "accuracy": (
        "accuracy",
        f"batch mean of the recipe's binary outcome reward, correct and well formed ({stages.ACCURACY_KEY})",
    ),
    "reward_std": (
        "reward std",
        "TRL's reward_std, the std of the weighted reward sum: for mapo it includes semantic_beta * R_sem, for grpo "
        "and hpo it is the outcome's alone",
    ),
    "advantage_std": (
        "advantage std",
        "std of the episode advantages (mapo/advantage_std); for hpo, before the per-turn step mix",
    ),
    "adv_variance": ("advantage variance per token", "variance of the advantages over trained tokens (adv/variance)"),
    "grad_norm_var": (
        "gradient-norm variance",
        "variance of per-sample policy-gradient norms on the fixed probe batch (probe/grad_norm_var)",
    ),
}
EVAL_COLUMNS = {
    "accuracy": "accuracy",
    "valid_call_rate": "valid-call rate",
    "box_contains_target": "box holds target",
    "mean_z": "mean z_t",
}
WHAT_IT_SHOWS = "## What it shows"
PLACEHOLDER = "_To be written by a person after reading the curves and tables above (the generator keeps this section once it is edited)._"


# ----------------------------------------------------------------------------------------------------- aggregation
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


def across_seeds(values: Sequence[float | None]) -> Spread | None:
    """The `Spread` of one figure over seeds, ignoring missing ones (None, NaN); None when no seed has a value."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None
    return Spread(
        statistics.fmean(present), statistics.pstdev(present), min(present), max(present), len(present), len(values)
    )


def curve(runs: Sequence[Sequence[dict]], metric: str) -> tuple[list[int], list[Spread | None]]:
    """`metric` per step across runs (one `stages.rl_step_log` per seed), steps matched by number: every step any run
    logged, and its `Spread` (None where no run has a value)."""
    by_step = [{row["step"]: row.get(metric) for row in run} for run in runs]
    steps = sorted({step for run in by_step for step in run})
    return steps, [across_seeds([run.get(step) for run in by_step]) for step in steps]


def last_steps_mean(steps: Sequence[dict], metric: str, k: int) -> float | None:
    """Mean of `metric` over the last `k` logged steps of one run, over those steps that have it; None if none do."""
    values = [row.get(metric) for row in steps[-k:]]
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(present) if present else None


def format_spread(spread: Spread | None) -> str:
    """`mean ± std`, with `(n/of seeds)` when some seeds had no value, and `—` when none had."""
    if spread is None:
        return "— (no value)"
    text = f"{spread.mean:.3f} ± {spread.std:.3f}"
    return text if spread.n == spread.of else f"{text} ({spread.n}/{spread.of} seeds)"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; `|` inside a cell is escaped so it cannot split the row."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row needs {len(header)} cells: {[len(row) for row in rows]}")

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


# -------------------------------------------------------------------------------------------------------- plots
def plot_curves(curves: dict[str, tuple[list[int], list[Spread | None]]], title: str, path: Path) -> Path:
    """One PNG: per method, the mean across seeds (line and points) and the min-max band; a step where no seed
    logged the figure is a gap, and a method with no value at all says so in the legend."""
    fig = Figure(figsize=(6.4, 3.6), dpi=100)  # the object API: no pyplot, no display backend, nothing to close
    ax = fig.subplots()
    every_step = sorted({step for steps, _ in curves.values() for step in steps})
    for method, (steps, spreads) in curves.items():
        nan = float("nan")
        mean = [s.mean if s else nan for s in spreads]
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
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


# ------------------------------------------------------------------------------------------------------- report
def kept_section(report: Path) -> str | None:
    """The "What it shows" section of an existing report, if a person has written it (not the placeholder)."""
    if not report.exists():
        return None
    text = report.read_text(encoding="utf-8")
    if WHAT_IT_SHOWS not in text:
        return None
    section = text.split(WHAT_IT_SHOWS, 1)[1].split("\n## ", 1)[0].strip()
    return None if not section or section == PLACEHOLDER else section


def final_tables(results: dict[str, list[dict]], last_k: int) -> tuple[str, str]:
    """Two tables, one row per method: the curves' figures over each run's last `last_k` steps, and the final
    evaluation's; each cell the mean ± std across seeds."""
    training = [
        [
            method,
            *(format_spread(across_seeds([last_steps_mean(r["steps"], m, last_k) for r in runs])) for m in CURVES),
        ]
        for method, runs in results.items()
    ]
    evaluation = [
        [method, *(format_spread(across_seeds([(r["eval"] or {}).get(m) for r in runs])) for m in EVAL_COLUMNS)]
        for method, runs in results.items()
    ]
    return (
        markdown_table(["method", *(CURVES[m][0] for m in CURVES)], training),
        markdown_table(["method", *EVAL_COLUMNS.values()], evaluation),
    )


def write_report(report: Path, results: dict[str, list[dict]], setup: dict, last_k: int) -> Path:
    """docs/experiment.md and its plots (in the folder named like it, `docs/experiment/`)."""
    figures = report.with_suffix("")
    lines = [
        "# Advantage estimators compared on the tiny world: " + ", ".join(results),
        "",
        f"_Generated by `experiment.py` on {setup['date']}; rerun it to regenerate every section but the last._",
        "",
        "## Command",
        "",
        "```bash",
        setup["command"],
        "```",
        "",
        "## Setup",
        "",
        *setup["lines"],
        "",
        "Hyper-parameters, the same in every run (every parsed field but "
        f"{', '.join(f'`{v}`' for v in VARIED)} was checked equal across runs before training):",
        "",
        markdown_table(["field", "value"], [[f"`{k}`", f"`{v}`"] for k, v in setup["shared"].items()]),
        "",
        "## Curves",
        "",
        "Per method: the mean across seeds (line) and the min-max band across seeds. A gap is a step where no seed "
        "logged the figure (no valid zoom-in call, so no z_t; the probe between its steps).",
        "",
    ]
    for metric, (title, meaning) in CURVES.items():
        curves = {method: curve([r["steps"] for r in runs], metric) for method, runs in results.items()}
        path = plot_curves(curves, title, figures / f"{metric}.png")
        lines += [f"**{title}**: {meaning}.", "", f"![{title}]({figures.name}/{path.name})", ""]
    training, evaluation = final_tables(results, last_k)
    lines += [
        "## Final figures",
        "",
        f"Training, each run's mean over its last {last_k} steps, then mean ± std (population) across seeds; "
        "`(n/N seeds)` when only n seeds logged the figure, `—` when none did:",
        "",
        training,
        "",
        f"Final evaluation of each RL model on the test split ({setup['eval']}), mean ± std across seeds:",
        "",
        evaluation,
        "",
        "## Warnings",
        "",
        *([f"- {w}" for w in setup["warnings"]] or ["None: every run and evaluation made valid zoom-in calls."]),
        "",
        WHAT_IT_SHOWS,
        "",
        kept_section(report) or PLACEHOLDER,
        "",
    ]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines), encoding="utf-8")
    (figures / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return report


# ----------------------------------------------------------------------------------------------------------- runs
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


def prepare(args: argparse.Namespace, start: Start, stage: stages.Stages, kit: dict[str, Path]) -> None:
    """The demo's own stages, at the demo's sizes unless overridden: verifier, data, SFT checkpoint."""
    stage("train the CLIP verifier", lambda: stages.train_verifier(start.clip, kit, args.clip_steps))
    stage("generate synthetic data", lambda: stages.make_data(start.data, args.train_rows, args.test_rows))
    stage("SFT cold start", lambda: stages.run_sft(kit["policy"], start.data, start.sft, args.sft_steps))


def shared_fields(parsed: tuple) -> dict:
    """Every parsed field of one run but those allowed to vary (`VARIED`)."""
    values = {}
    for part in parsed:
        values |= {k: v for k, v in dataclasses.asdict(part).items() if k not in VARIED}
    return values


def check_shared(runs: dict[tuple[str, int], tuple]) -> dict:
    """The fields all runs share; fails naming any field (other than `VARIED`) that differs between two runs."""
    (first_key, first), *rest = runs.items()
    reference = shared_fields(first)
    for key, parsed in rest:
        differ = {k: (reference.get(k), v) for k, v in shared_fields(parsed).items() if reference.get(k) != v}
        if differ:
            raise ValueError(f"runs {first_key} and {key} differ beyond {VARIED}: {differ}")
    return reference


def estimate_seconds(n_runs: int, steps: int, eval_rows: int, prepare: bool) -> float:
    """Wall time of the whole experiment at the rates measured on 2 idle cores."""
    runs = n_runs * (SECONDS_PER_RUN + steps * SECONDS_PER_STEP + eval_rows * SECONDS_PER_EVAL_ROW)
    return runs + (SECONDS_TO_PREPARE if prepare else 0.0)


def plan_runs(args: argparse.Namespace, start: Start, kit: dict[str, Path]) -> dict[tuple[str, int], list[str]]:
    """Each run's `rl.py` command line, seed-major (a run cut short still holds every method for its first seeds):
    the tiny recipe with the same overrides for all, and only the estimator, the seed and the folder per run."""
    shared = {
        "hpo_text_encoder": kit["text_encoder"],
        "hpo_min_positive_steps": 1,
        "hpo_min_negative_steps": 1,
        "variance_probe_steps": args.probe_steps,
    }
    return {
        (method, seed): stages.rl_argv(
            start.sft,
            start.data,
            start.clip,
            args.output_dir / "rl" / f"{method}-seed{seed}",
            args.rl_steps,
            advantage_estimator=method,
            seed=seed,
            **shared,
        )
        for seed in args.seeds
        for method in args.methods
    }


def run_one(argv: list[str], data: Path, eval_dir: Path, eval_rows: int, stage: stages.Stages) -> dict:
    """One RL run (`rl.py` on `argv`) and the evaluation of its model: its steps (`stages.rl_step_log`), the
    evaluation's summary (None when `eval_rows` is 0) and the zero-signal warnings of both (`stages.signal_warnings`)."""
    training_args = stages.rl_args(argv)[1]
    name = f"{training_args.advantage_estimator} seed {training_args.seed}"
    rl_dir = Path(training_args.output_dir)
    shutil.rmtree(rl_dir, ignore_errors=True)  # a rerun never mixes with an earlier run's files
    log_history = stage(f"RL {name}", lambda: stages.run_rl(argv))
    steps = stages.rl_step_log(log_history)
    summary = None
    if eval_rows:
        metrics = stage(
            f"evaluate {name}", lambda: stages.evaluate(rl_dir, data, eval_dir, eval_rows, seed=training_args.seed)
        )
        summary = stages.eval_summary(metrics, eval_dir)
    warnings = stages.signal_warnings({"eval": {"test": summary} if summary else {}, "rl_steps": steps})
    return {"seed": training_args.seed, "steps": steps, "eval": summary, "warnings": warnings}


def describe_setup(
    args: argparse.Namespace,
    argv: Sequence[str],
    start: Start,
    fields: dict,
    results: dict,
    eval_rows: int,
    stage: stages.Stages,
) -> dict:
    """The report's generated setup: the command, where the runs started, sizes, shared fields, wall time."""
    runs = [run for method_runs in results.values() for run in method_runs]
    seconds = [run["seconds"] for run in runs]
    chance = next((run["eval"]["chance"] for run in runs if run["eval"]), None)
    rows = {split: len(load_saved_split(str(start.data), split)) for split in ("train", "test")}
    made = (
        f"given (`--sft_model`), data `{start.data}`, verifier `{start.clip}`"
        if args.sft_model
        else f"made by this run as `make demo` makes it: verifier {args.clip_steps} steps, SFT {args.sft_steps} steps"
    )
    batch, group = fields["per_device_train_batch_size"], fields["num_generations"]
    return {
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", "-m", "scripts.experiment", *argv])
        + '   # make experiment ARGS="..." runs the same',
        "lines": [
            f"- Start: SFT checkpoint `{start.sft}`, {made}.",
            f"- Data: synthetic, {rows['train']} train rows, {rows['test']} test rows (`{start.data}`).",
            f"- Methods: {', '.join(args.methods)}; seeds: {', '.join(map(str, args.seeds))} (RL's seed, which "
            "orders the data and seeds sampling, and the evaluation's).",
            f"- RL: recipe `{stages.RL_RECIPE}`, {args.rl_steps} steps of {batch} rollouts (groups of {group}), "
            f"{args.rl_steps * batch} rollouts per run; only `advantage_estimator` and `seed` differ between runs.",
            "- `hpo_text_encoder`, `hpo_min_positive_steps` and `hpo_min_negative_steps` are read only by the hpo "
            "estimators: the other runs get the same values, unused.",
            f"- Wall time: {stage.total() / 60:.1f} min in all; one run (RL and its evaluation) "
            f"{min(seconds):.0f}-{max(seconds):.0f} s.",
        ],
        "shared": {k: fields[k] for k in SETUP_FIELDS if k in fields},
        "eval": "not run" if chance is None else f"greedy, the first {eval_rows} rows; chance {chance:.3f}",
        "warnings": [
            f"{m} seed {run['seed']}: {w}" for m, rs in results.items() for run in rs for w in run["warnings"]
        ],
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=ADVANTAGE_ESTIMATORS)
    add("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    add("--rl_steps", type=int, default=DEFAULT_RL_STEPS, help="RL steps of every run")
    add("--probe_steps", type=int, default=1, help="variance_probe_steps of every run (0: off)")
    add("--eval_rows", type=int, default=None, help="test rows per final evaluation (default: all; 0: none)")
    add("--last_k", type=int, default=10, help="the final-figures table averages each run's last K steps")
    add("--output_dir", type=Path, default=Path("outputs/experiment"))
    add("--report", type=Path, default=Path("docs/experiment.md"), help="plots go in <report without .md>/")
    add("--sft_model", type=Path, default=None, help="reuse this SFT checkpoint (default: make one as the demo does)")
    add("--data", type=Path, default=None, help="with --sft_model: its data (default: data/ beside it)")
    add("--clip", type=Path, default=None, help="with --sft_model: the verifier (default: clip/ beside it)")
    stages.add_stage_arguments(parser)
    args = parser.parse_args(argv)
    if len(set(args.methods)) < len(args.methods) or len(set(args.seeds)) < len(args.seeds):
        parser.error("--methods and --seeds must not repeat a value")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    stage = stages.Stages()
    kit = stages.tiny_kit()
    start = locate(args)
    test_rows = len(load_saved_split(str(start.data), "test")) if args.sft_model else args.test_rows
    eval_rows = test_rows if args.eval_rows is None else min(args.eval_rows, test_rows)
    n_runs = len(args.methods) * len(args.seeds)
    estimate = estimate_seconds(n_runs, args.rl_steps, eval_rows, prepare=not args.sft_model)
    print(
        f"{n_runs} runs ({', '.join(args.methods)} x seeds {args.seeds}) of {args.rl_steps} RL steps and {eval_rows} "
        f"eval rows{'' if args.sft_model else ', after the verifier, data and SFT'}: about {estimate / 60:.0f} min "
        f"at {SECONDS_PER_STEP:.1f} s/step, {SECONDS_PER_EVAL_ROW:.1f} s/eval row (2 idle cores; another torch job "
        "on the same cores can make it 20 times slower)",
        flush=True,
    )
    if not args.sft_model:
        prepare(args, start, stage, kit)
    runs = plan_runs(args, start, kit)
    fields = check_shared({key: stages.rl_args(argv) for key, argv in runs.items()})
    results: dict[str, list[dict]] = {method: [] for method in args.methods}
    spent = []
    for i, ((method, seed), argv_rl) in enumerate(runs.items(), start=1):
        t0 = time.perf_counter()
        eval_dir = args.output_dir / "eval" / f"{method}-seed{seed}"
        run = run_one(argv_rl, start.data, eval_dir, eval_rows, stage)
        spent.append(time.perf_counter() - t0)
        results[method].append(run | {"seconds": round(spent[-1], 1)})
        left = statistics.fmean(spent) * (len(runs) - i)
        print(f"run {i}/{len(runs)} ({method}, seed {seed}) took {spent[-1]:.0f} s; about {left / 60:.1f} min left")

    setup = describe_setup(args, argv, start, fields, results, eval_rows, stage)
    report = write_report(args.report, results, setup, args.last_k)
    print(f"\nreport: {report}   plots: {report.with_suffix('')}/   runs: {args.output_dir}")
    for warning in setup["warnings"]:
        print(f"WARNING: {warning}")
    return results


if __name__ == "__main__":
    main()
