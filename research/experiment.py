"""`make experiment-curves`: does MAPO's semantic signal act in RL training? Learning curves on CPU, in the world where
RL moves the tiny policy, run and judged as the plan committed before any run says (`research/plans/
experiment_curves.json`, read by `research.curve_stats`).

`make experiment` measures MAPO's gradient claims at a fixed policy instead (`research/gradient_claims.py`,
research/reports/experiment.md). This route trains: each arm is a whole RL run per seed, evaluated greedily on the
same held-out rows. It is built to be able to fail, in this order:

1. **World and start**: the positive control's (`research/positive_control.py`, research/reports/positive_control.md):
   square images of `--image_side`, an SFT of `--sft_steps` at `--sft_learning_rate`, RL from its checkpoint at
   `--sft_start_step`; the control's RL settings in `research/recipes/config_curves.yaml`. The control's own
   checkpoint, data and verifier are reused when its record names them, they exist and hold the plan's held-out rows;
   otherwise the demo's stages make them here (`research.runs.prepare`, with the plan's `eval_rows` test rows), or
   `--sft_model` names them.
2. **Positive control** (`control_check`): RL moves this policy only if the control passed. Rather than rerun it,
   its record (`--control`) is read and checked before anything trains: it passed, it started from the same world,
   and every RL setting it ran with is this recipe's but the reward. Anything else stops the experiment, naming it.
3. **Verifier gate** (`evaluation.verifier_check`) of the tiny CLIP under `semantic_score` cosine and contrastive; the
   `mapo_clip` arm trains under the first scoring that passes, or, if none does, the one with the higher AUC.
4. **Arms** (the plan's, or `--arms`), the plan's seeds (or `--seeds`), from the same checkpoint: the outcome is a
   simulated reader (`rewards.simulated_reader`), so only where the policy looked is paid. Only
   `advantage_estimator`, `semantic_verifier`, `semantic_score` and the seed differ between runs; every other parsed
   field is checked equal before anything trains. `--jobs` runs go side by side, one torch thread each, seed by seed
   (`mapo_clip`, outside the verdict, last). Each run's result, every held-out row's outcome included, is cached in
   `<output_dir>/runs/` as soon as it ends, keyed by its command line, rows and start: a rerun resumes after the last
   finished run.
5. **Statistics** (`research.curve_report.judge`): per seed and row, each arm minus the reference and minus the
   density control; t over seeds and a bootstrap over seeds and rows; the plan's three-valued rule; "What it shows"
   written from it (with a hash of the results).

Models and evaluations go to `outputs/experiment/` (`--output_dir`); the report to
`research/reports/experiment_curves.md` (`--report`), with its plots and `results.json` beside it.

    make experiment-curves                               # the plan: 4 arms x 8 seeds, 512 rows (~2.5-3 h, 2 cores)
    make experiment-curves ARGS="--arms grpo mapo_walk --seeds 0"   # a departure from the plan, and says so
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from configs import ToolConfig
from data.benchmarks import load_saved_split
from evaluation.verifier_check import GateResult, check_verifier
from research.curve_report import judge, what_it_shows, write_report
from research.curve_stats import PLAN, Plan, load_plan
from research.runs import (
    STEP_METRICS,
    Job,
    Start,
    cache_key,
    cached,
    evaluate,
    locate,
    prepare,
    results_hash,
    sft_start,
    shared_fields,
    start_digest,
    train_and_evaluate_all,
)
from research.runs import VARIED as VARIED  # the fields the runs may differ in, as tests read them here
from rewards.verifiers import build_verifier
from tiny import stages
from tools import make_environment_factory
from utils.models import load_processor, pixel_budget

RECIPE = "research/recipes/config_curves.yaml"
# Each arm: the fields it sets on top of the recipe. The recipe's semantic_verifier is `exact_walk`, so the arms that
# do not train on R_sem (grpo, hpo: weight 0) log the same walk z_t as the walk arm. `mapo_walk` is walk only (z_t = 1
# when the crop framed the target, whatever the label: the tiny policy cannot name what it cannot see), `mapo_clip`
# the paper's verifier at the kit's size, `mapo_density` the walk arm's bonus without its information (every valid
# call paid the batch's mean walk z_t). `mapo_exact` (talk and walk), `mapo_shuffled` (the walk's z_t permuted within
# the batch), `hpo` and `mapo+hpo` run when named.
ARMS: dict[str, dict[str, str]] = {
    "grpo": {"advantage_estimator": "grpo"},
    "mapo_walk": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact_walk"},
    "mapo_clip": {"advantage_estimator": "mapo", "semantic_verifier": "clip"},  # semantic_score: the gate's choice
    "mapo_density": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:walk_density"},
    "mapo_exact": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact"},
    "mapo_shuffled": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:shuffled_exact_walk"},
    "hpo": {"advantage_estimator": "hpo"},
    "mapo+hpo": {"advantage_estimator": "mapo+hpo", "semantic_verifier": "research.verifiers:exact_walk"},
}
LAST = ("mapo_clip",)  # outside the verdict: run after every seed of the arms it needs
CONTROL_RECORD = Path("research/reports/positive_control/results.json")
CONTROL_COMMAND = "python -m research.positive_control"  # what makes the record
# The RL settings the control's record holds (`research.positive_control.FIELDS`) that must equal the recipe's: all
# but the reward and the estimator, which the control fixes at GRPO on target_in_view.
CONTROL_FIELDS = ("learning_rate", "lr_scheduler_type", "per_device_train_batch_size", "num_generations",
                  "max_completion_length", "max_tool_calling_iterations", "temperature", "loss_type", "beta",
                  "max_steps")  # fmt: skip
WORLD_FLAGS = ("image_side", "sft_learning_rate", "sft_steps", "sft_start_step")  # where the SFT start comes from
GATE_SCORES = ("contrastive", "cosine")  # the order the clip arm tries them in

# Measured on the 2-core CPU machine (2026-12-04), the cores idle, the recipe from checkpoint 800: they size the
# estimate printed before the run starts. A step of 32 rollouts takes ~2.1 s on 2 threads and ~3.0 s on 1 with
# another 1-thread run beside it; one greedy evaluation row ~0.05 s on 2 threads (128 rows in 6.8 s).
SECONDS_PER_STEP = {1: 2.1, 2: 3.0}  # by --jobs
SECONDS_PER_EVAL_ROW = 0.08  # on one thread beside another run: not measured apart, 1.5x the 2-thread rate
SECONDS_PER_RUN = 15.0  # loading the policy and the verifier; saving checkpoints and the model
SECONDS_TO_PREPARE = 540.0  # without a start: the verifier, data and a 1,200-step SFT

SETUP_FIELDS = (
    "reward_funcs", "reward_weights", "learning_rate", "lr_scheduler_type", "max_steps", "per_device_train_batch_size",
    "num_generations", "max_completion_length", "max_tool_calling_iterations", "temperature", "loss_type", "beta",
    "semantic_beta", "semantic_lambda", "no_tool_semantic", "hpo_omega", "hpo_min_positive_steps",
    "hpo_min_negative_steps", "hpo_text_encoder", "clip_model",
)  # fmt: skip

# ----------------------------------------------------------------------------------------------------------- runs


def check_shared(runs: dict[tuple[str, int], tuple]) -> dict:
    """The fields all runs share; fails naming any field (other than `VARIED`) that differs between two runs."""
    (first_key, first), *rest = runs.items()
    reference = shared_fields(first)
    for key, parsed in rest:
        differ = {k: (reference.get(k), v) for k, v in shared_fields(parsed).items() if reference.get(k) != v}
        if differ:
            raise ValueError(f"runs {first_key} and {key} differ beyond {VARIED}: {differ}")
    return reference


def run_argv(args: argparse.Namespace, start: Start, kit: dict, name: str, seed: int, **overrides) -> list[str]:
    """One `rl.py` command line: the world's recipe from the start, with the fields every run shares and `overrides`."""
    shared = {"hpo_text_encoder": kit["text_encoder"], "seed": seed}
    if args.eval_every and "gradient_variance_batches" not in overrides:
        shared |= {"save_strategy": "steps", "save_steps": args.eval_every, "save_only_model": True}
    return stages.rl_argv(
        start.sft,
        start.data,
        start.clip,
        args.output_dir / "rl" / f"{name}-seed{seed}",
        overrides.pop("max_steps", args.rl_steps),
        recipe=RECIPE,
        **(shared | overrides),
    )


def verifier_gate(start: Start, rows: int) -> dict[str, dict[str, GateResult]]:
    """`check_verifier` of the run's CLIP and of the exact verifier (a sanity row: it must pass) on the first
    `rows` test rows, under both scorings."""
    processor = load_processor(start.sft)
    tool = ToolConfig(clip_model=str(start.clip)).resolved(pixel_budget(processor))
    make_env = make_environment_factory(tool, pixel_budget(processor))
    test = load_saved_split(str(start.data), "test").select(range(rows))
    return {
        name: check_verifier(build_verifier(spec, tool), list(test), make_env, semantic_scores=GATE_SCORES)
        for name, spec in (("clip", "clip"), ("exact", "research.verifiers:exact"))
    }


def clip_scoring(gate: dict[str, GateResult]) -> tuple[str, bool]:
    """The `semantic_score` the clip arm trains with and whether its gate passed: the first of `GATE_SCORES` that
    passed, else the one with the highest AUC (the first on a tie)."""
    passed = next((how for how in GATE_SCORES if gate[how].passed), None)
    if passed:
        return passed, True
    return max(GATE_SCORES, key=lambda how: (gate[how].auc, -GATE_SCORES.index(how))), False


def command_flags(command: str, names: Sequence[str]) -> dict[str, str | None]:
    """The values of `--name value` flags in a recorded command line, as written (None where absent)."""
    words = shlex.split(command)
    return {name: words[words.index(f"--{name}") + 1] if f"--{name}" in words[:-1] else None for name in names}


def control_check(record: dict | None, fields: dict, world: dict, start: Start) -> list[str]:
    """What stops the arms, from the positive control's record (its results.json; None: none found): the control did
    not pass; it started from another checkpoint than `start` and another world (`WORLD_FLAGS` of its command against
    `world`, this run's); or an RL setting of `CONTROL_FIELDS` differs from `fields` (this run's shared fields). Empty:
    the arms may run."""
    if record is None:
        return ["no record of the positive control"]
    problems = [] if record["passed"] else ["the positive control did not pass"]
    if record["start"]["sft"] != str(start.sft):
        flags = command_flags(record["command"], WORLD_FLAGS)
        differ = {k: (flags[k], v) for k, v in world.items() if flags[k] is None or float(flags[k]) != float(v)}
        if differ:
            problems.append(f"it started from {record['start']['sft']}, and its world differs (control, here): "
                            f"{differ}")  # fmt: skip
    differ = {k: (record["fields"].get(k), fields.get(k)) for k in CONTROL_FIELDS
              if record["fields"].get(k) != fields.get(k)}  # fmt: skip
    if differ:
        problems.append(f"its RL settings differ (control, here): {differ}")
    return problems


def control_start(record: dict | None, world: dict) -> Start | None:
    """The control's checkpoint, data and verifier, when its record names them, they exist, and its command made them
    in `world`: the start to reuse."""
    if record is None:
        return None
    start = Start(*(Path(record["start"][k]) for k in ("sft", "data", "clip")))
    flags = command_flags(record["command"], WORLD_FLAGS)
    same = all(flags[k] is not None and float(flags[k]) == float(v) for k, v in world.items())
    return start if same and all(path.exists() for path in vars(start).values()) else None


def gradient_variance(args, start: Start, kit: dict, arms: dict[str, dict], stage: stages.Stages) -> dict[str, dict]:
    """Per arm, `gradvar/trace` and `gradvar/relative` over `--variance_batches` batches at the SFT checkpoint
    (learning rate 0, no clipping, seed 0)."""
    out = {}
    for name, overrides in arms.items():
        argv = run_argv(
            args,
            start,
            kit,
            f"gradvar-{name}",
            0,
            **overrides,
            max_steps=args.variance_batches,
            learning_rate=0.0,
            max_grad_norm=0.0,
            gradient_variance_batches=args.variance_batches,
        )
        steps = stages.rl_step_log(
            stage(f"gradient variance {name}", lambda argv=argv: stages.run_rl(argv)), STEP_METRICS
        )
        logged = [s for s in steps if s.get("gradvar_trace") is not None]
        out[name] = (
            {"trace": logged[-1]["gradvar_trace"], "relative": logged[-1]["gradvar_relative"]} if logged else {}
        )
    return out


def estimate_seconds(runs: int, jobs: int, steps: int, eval_rows: int, evals_per_run: int, variance: int,
                     arms: int, prepare: bool) -> float:  # fmt: skip
    """Wall time of the whole experiment at the rates measured on 2 idle cores: `runs` runs `jobs` at a time, each
    evaluated `evals_per_run` times, the SFT evaluation, a gradient-variance run per arm, and the preparation."""
    step = SECONDS_PER_STEP[min(jobs, 2)]
    run = SECONDS_PER_RUN + steps * step + evals_per_run * eval_rows * SECONDS_PER_EVAL_ROW
    gradvar = arms * (variance and SECONDS_PER_RUN + variance * SECONDS_PER_STEP[1])
    evaluation = eval_rows * SECONDS_PER_EVAL_ROW
    return math.ceil(runs / jobs) * run + evaluation + gradvar + (SECONDS_TO_PREPARE if prepare else 0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--plan", type=Path, default=PLAN, help="the plan file: arms, seeds, rows and the rule the report applies")
    add("--arms", nargs="+", default=None, choices=list(ARMS), help="default: the plan's")
    add("--seeds", nargs="+", type=int, default=None, help="default: the plan's")
    add("--rl_steps", type=int, default=None, help="RL steps of every run (default: the recipe's max_steps)")
    add("--eval_every", type=int, default=0, help="also evaluate every K steps (default 0: at the end only)")
    add("--eval_rows", type=int, default=None, help="held-out rows per evaluation (default: the plan's)")
    add("--jobs", type=int, default=2, help="runs side by side, one torch thread each (1: in series, on all threads)")
    add("--gate_rows", type=int, default=64, help="held-out rows of the verifier gate")
    add("--variance_batches", type=int, default=0, help="batches of the gradient-variance measurement (0: skip)")
    add("--control", type=Path, default=CONTROL_RECORD, help="the positive control's results.json")
    add("--output_dir", type=Path, default=Path("outputs/experiment"))
    add(
        "--report",
        type=Path,
        default=Path("research/reports/experiment_curves.md"),
        help="plots go in <report without .md>/",
    )
    add("--sft_model", type=Path, default=None, help="start from this checkpoint (default: the control's, or made)")
    add("--data", type=Path, default=None, help="with --sft_model: its data (default: data/ beside it)")
    add("--clip", type=Path, default=None, help="with --sft_model: the verifier (default: clip/ beside it)")
    add("--image_side", type=int, default=768, help="the side of every synthetic image")
    add("--sft_learning_rate", type=float, default=1e-3, help="the SFT's peak learning rate")
    add("--sft_start_step", type=int, default=800, help="RL starts from the SFT's checkpoint at this step")
    stages.add_stage_arguments(parser)
    parser.set_defaults(test_rows=None, sft_steps=1200)
    args = parser.parse_args(argv)
    # Absolute, so a run's cache key (its command line) is one whether the directory was named relative or absolute.
    args.output_dir = args.output_dir.resolve()
    try:
        args.plan_read = load_plan(args.plan)
    except (OSError, KeyError, ValueError) as error:
        parser.error(f"--plan {args.plan}: {error!r}")
    plan: Plan = args.plan_read
    args.arms = list(plan.arms) if args.arms is None else args.arms
    args.seeds = list(plan.seeds) if args.seeds is None else args.seeds
    args.eval_rows = plan.eval_rows if args.eval_rows is None else args.eval_rows
    args.test_rows = args.test_rows or args.eval_rows  # the made data holds every evaluated row
    if len(set(args.arms)) < len(args.arms) or len(set(args.seeds)) < len(args.seeds):
        parser.error("--arms and --seeds must not repeat a value")
    if plan.reference not in args.arms:
        parser.error(f"--arms must include {plan.reference}, which every arm is paired against (the plan's reference)")
    if args.variance_batches == 1:
        parser.error("--variance_batches needs at least 2 batches (0: skip)")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    if args.eval_rows < 1:
        parser.error("--eval_rows: the experiment needs at least one held-out row; its verdict is an evaluation")
    if not 0 <= args.sft_start_step < args.sft_steps:
        parser.error(
            f"--sft_start_step {args.sft_start_step}: a step inside --sft_steps {args.sft_steps} (0: its end)"
        )
    recipe_steps = stages.rl_args(["--config", RECIPE])[1].max_steps
    args.rl_steps = args.rl_steps or recipe_steps
    if args.eval_every and args.eval_every >= args.rl_steps:
        args.eval_every = 0
    return args


def departures(args: argparse.Namespace, eval_rows: int) -> list[str]:
    """How this run differs from its plan (arms, seeds, rows): the report says so beside its verdict."""
    plan: Plan = args.plan_read
    out = []
    if set(args.arms) != set(plan.arms):
        out.append(f"arms {', '.join(args.arms)} (planned: {', '.join(plan.arms)})")
    if set(args.seeds) != set(plan.seeds):
        out.append(f"seeds {', '.join(map(str, args.seeds))} (planned: {', '.join(map(str, plan.seeds))})")
    if eval_rows != plan.eval_rows:
        out.append(f"{eval_rows} held-out rows (planned: {plan.eval_rows})")
    return out


def run_order(arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """The runs in the order they start: seed by seed, every arm of the verdict, then the arms outside it (`LAST`), so
    an experiment stopped part way has whole seeds of the verdict's arms to resume from."""
    first = [a for a in arms if a not in LAST]
    return [(a, s) for s in seeds for a in first] + [(a, s) for a in arms if a in LAST for s in seeds]


def plan_origin(plan: Path) -> str:
    """The plan file and the commit that first added it (`git log`), which the report quotes: the plan predates the
    results in git. Without git history, the path alone."""
    try:
        added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h %cs", "--", str(plan)], cwd=stages.REPO,
                               capture_output=True, text=True, check=True).stdout.split("\n")[-2:]  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return str(plan)
    first = next((line for line in reversed(added) if line.strip()), "")
    return f"{plan}, first committed in {first.replace(' ', ' on ')}" if first else str(plan)


def world_of(args: argparse.Namespace) -> dict:
    """This run's `WORLD_FLAGS`, as `control_check` compares them with the control's command."""
    return {name: getattr(args, name) for name in WORLD_FLAGS}


def read_control(path: Path) -> dict | None:
    """The positive control's record, or None when there is none at `path`."""
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def control_summary(record: dict, path: Path, problems: list[str]) -> dict:
    """What the report says of the control: where its record is, its hash, start, command and figures per seed, and
    its runs' greedy evaluations (for the curves' plot)."""
    return {
        "record": str(path),
        "report": str(path.parent.with_suffix(".md")),
        "hash": results_hash(record),
        "start": record["start"]["sft"],
        "command": record["command"],
        "n": record["rows"],
        "before": record["sft"]["target_seen"],
        "per_seed": {int(k): {n: x[n] for n in ("after", "rise", "passed")} for k, x in record["per_seed"].items()},
        "runs": [
            {"seed": r["seed"], "evals": {int(k): {"target_seen": e["target_seen"]} for k, e in r["evals"].items()}}
            for r in record["runs"]
        ],  # fmt: skip
        "problems": problems,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    plan: Plan = args.plan_read
    stage = stages.Stages()
    kit = stages.tiny_kit()
    world = world_of(args)
    record = read_control(args.control)
    reused = None if args.sft_model else control_start(record, world)
    if reused and len(load_saved_split(str(reused.data), "test")) < args.eval_rows:
        reused = None  # the control's data holds fewer held-out rows than the plan evaluates: made here
    start = reused or locate(args)
    if not args.sft_model and not reused:
        start = dataclasses.replace(start, sft=sft_start(start.sft, args.sft_start_step))
    arms = {name: dict(ARMS[name]) for name in args.arms}
    order = run_order(args.arms, args.seeds)
    # Planned (and checked to differ only in the arms' fields, and against the control's record) before anything
    # trains or is made.
    planned = {(arm, seed): run_argv(args, start, kit, arm, seed, **arms[arm]) for arm, seed in order}
    fields = check_shared({key: stages.rl_args(a) for key, a in planned.items()})
    problems = control_check(record, fields, world, start)
    if problems:
        raise SystemExit(
            f"positive control ({args.control}): {'; '.join(problems)}. RL must move the policy in this world before "
            f"an arm's result means anything: run `{CONTROL_COMMAND} ...` (its command: research/positive_control.py) "
            "with this world's settings and RL settings, or name its record with --control."
        )
    control = control_summary(record, args.control, problems)
    made = not (args.sft_model or reused) and not all(path.exists() for path in vars(start).values())
    if made:
        start = prepare(args, dataclasses.replace(start, sft=args.output_dir / "sft"), stage)
    test_rows = len(load_saved_split(str(start.data), "test"))
    eval_rows = min(args.eval_rows, test_rows)
    digest = start_digest(start)
    evals = 1 + (args.rl_steps // args.eval_every - (args.rl_steps % args.eval_every == 0) if args.eval_every else 0)
    budget = stages.rollout_budget(RECIPE)
    sft = stage("evaluate the SFT checkpoint", lambda: evaluate(start.sft, start, args.output_dir / "eval" / "sft",
                                                                  eval_rows, budget))  # fmt: skip
    gate_objects = stage("verifier gate", lambda: verifier_gate(start, min(args.gate_rows, test_rows)))
    clip = clip_scoring(gate_objects["clip"])
    if "mapo_clip" in arms:
        arms["mapo_clip"]["semantic_score"] = clip[0]
        planned |= {("mapo_clip", seed): run_argv(args, start, kit, "mapo_clip", seed, **arms["mapo_clip"])
                    for seed in args.seeds}  # fmt: skip
    jobs = {
        key: Job(
            argv,
            start,
            args.output_dir / "eval" / f"{key[0]}-seed{key[1]}",
            eval_rows,
            f"{key[0]} seed {key[1]}",
            args.eval_every,
            args.output_dir / "runs" / f"{key[0]}-seed{key[1]}.json",
            cache_key(argv, eval_rows, digest),
        )  # fmt: skip
        for key, argv in planned.items()
    }
    found = {key: result for key, job in jobs.items() if (result := cached(job)) is not None}
    todo = [key for key in order if key not in found]
    estimate = estimate_seconds(len(todo), args.jobs, args.rl_steps, eval_rows, evals, args.variance_batches,
                                len(arms), False)  # fmt: skip
    print(
        f"{len(planned)} runs ({', '.join(args.arms)} x seeds {args.seeds}) from {start.sft}"
        f"{' (the control’s)' if reused else ''}: {args.rl_steps} RL steps each, {evals} evaluation(s) of {eval_rows} "
        f"rows per run; {len(found)} cached in {args.output_dir / 'runs'}, {len(todo)} to run, {args.jobs} at a time: "
        f"about {estimate / 60:.0f} min on 2 idle cores (another torch job on the same cores can make it many times "
        "slower)",
        flush=True,
    )
    done = stage(f"{len(todo)} RL runs, {args.jobs} at a time",
                 lambda: train_and_evaluate_all([jobs[key] for key in todo], args.jobs))  # fmt: skip
    finished = found | dict(zip(todo, done, strict=True))
    results = {arm: [finished[(arm, seed)] for seed in args.seeds] for arm in args.arms}
    outcome = {
        "plan": str(args.plan),
        "departures": departures(args, eval_rows),
        "sft": sft,
        "gate": {name: {how: r.as_dict() for how, r in by.items()} for name, by in gate_objects.items()},
        "clip": clip,
        "control": control,
        "results": results,
        "variance": gradient_variance(args, start, kit, arms, stage) if args.variance_batches and arms else {},
        "cpu_seconds": sum(run["cpu_seconds"] for runs in results.values() for run in runs),
    }
    outcome["judged"] = judge(results, plan)
    setup = describe_setup(args, argv, start, fields, results, eval_rows, stage, made, outcome["cpu_seconds"])
    raw_plan = json.loads(args.plan.read_text(encoding="utf-8"))
    report = write_report(args.report, outcome, gate_objects, setup, plan, raw_plan)
    print(f"\nreport: {report}   plots: {report.with_suffix('')}/   runs: {args.output_dir}")
    for line in what_it_shows(outcome, gate_objects, plan):
        print(line)
    for warning in setup["warnings"]:
        print(f"WARNING: {warning}")
    return outcome


def shown(path: Path) -> Path:
    """`path` relative to the working directory when inside it (the repository's `outputs/...`), else as is: the
    report names where the runs started, not the machine's layout."""
    path = Path(path)
    return path.relative_to(Path.cwd()) if path.is_absolute() and path.is_relative_to(Path.cwd()) else path


def describe_setup(args, argv, start: Start, fields: dict, results: dict, eval_rows: int, stage, made: bool,
                   cpu_seconds: float) -> dict:  # fmt: skip
    """The report's generated setup: the command, where the runs started, sizes, shared fields, wall and CPU time."""
    rows = {split: len(load_saved_split(str(start.data), split)) for split in ("train", "test")}
    if made:
        origin = (f"made by this run with the demo's stages: verifier {args.clip_steps} steps, {args.image_side} px "
                  f"square images, SFT {args.sft_steps} steps at {args.sft_learning_rate:g}, its checkpoint at step "
                  f"{args.sft_start_step}")  # fmt: skip
    elif args.sft_model:
        origin = f"given (`--sft_model`), data `{shown(start.data)}`, verifier `{shown(start.clip)}`"
    else:
        origin = f"`{shown(start.sft.parent.parent)}`'s, data `{shown(start.data)}`, verifier `{shown(start.clip)}`"
    seconds = [run["seconds"] for runs in results.values() for run in runs]
    batch, group = fields.get("per_device_train_batch_size"), fields.get("num_generations")
    return {
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", "-m", "research.experiment", *argv])
        + '   # make experiment-curves ARGS="..."',
        "plan_origin": plan_origin(args.plan),
        "steps": args.rl_steps,
        "variance_batches": args.variance_batches,
        "lines": [
            f"- Start: SFT checkpoint `{shown(start.sft)}`, {origin}.",
            f"- Data: synthetic, {rows['train']} train rows, {rows['test']} test rows; every evaluation greedy on the "
            f"first {eval_rows}.",
            f"- Arms: {', '.join(results) or 'none ran'}; seeds {', '.join(map(str, args.seeds))} (RL's seed: data "
            "order and sampling).",
            f"- RL: recipe `{RECIPE}`, {args.rl_steps} steps of {batch} rollouts (groups of {group}); evaluated every "
            f"{args.eval_every or args.rl_steps} steps and at the end; {args.jobs} run(s) at a time"
            + (", one torch thread each." if args.jobs > 1 else "."),
            f"- Time: {cpu_seconds / 3600:.2f} CPU hours over the runs (each run's own and its `rl.py`'s, whenever it "
            f"ran: runs are cached and resumed); this invocation's wall time {stage.total() / 60:.1f} min"
            + (
                f"; one run (RL and its evaluations) {min(seconds):.0f}-{max(seconds):.0f} s of wall time."
                if seconds
                else "."
            ),  # fmt: skip
        ],
        "shared": {k: fields[k] for k in SETUP_FIELDS if k in fields},
        "warnings": [
            f"{arm} seed {run['seed']}: {w}" for arm, rs in results.items() for run in rs for w in run["warnings"]
        ],
    }


if __name__ == "__main__":
    main()
