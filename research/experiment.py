"""`make experiment-curves`: does MAPO's semantic signal act in RL training? Learning curves on CPU, in the world where
RL moves the tiny policy.

`make experiment` measures MAPO's gradient claims at a fixed policy instead (`research/gradient_claims.py`,
research/reports/experiment.md). This route trains: each arm is a whole RL run per seed, evaluated greedily on
held-out rows. It is built to be able to fail, in this order (research/reports/experiment_curves.md states the
criterion before the results):

1. **World and start**: the positive control's (`research/positive_control.py`, research/reports/positive_control.md):
   square images of `--image_side`, an SFT of `--sft_steps` at `--sft_learning_rate`, RL from its checkpoint at
   `--sft_start_step`; the control's RL settings in `research/recipes/config_curves.yaml`. The control's own
   checkpoint, data and verifier are reused when its record names them and they exist (the same world); otherwise the
   demo's stages make them here (`research.runs.prepare`), or `--sft_model` names them.
2. **Positive control** (`control_check`): RL moves this policy only if the control passed. Rather than rerun it
   (three runs), its record (`--control`, the control's results.json) is read and checked before anything trains: it
   passed, it started from the same world, and every RL setting it ran with is this recipe's but the reward. Anything
   else stops the experiment, naming it.
3. **Verifier gate** (`evaluation.verifier_check`): on gold crops of the test rows, the tiny CLIP's AUC of the right
   label against the others on the same crop, and the best constant label's mean z against the right label's, under
   `semantic_score` cosine and contrastive. The `mapo_clip` arm trains under the first scoring that passes, or, if
   none does, the one with the higher AUC, and the report says its gate failed.
4. **Arms** (`ARMS`; `DEFAULT_ARMS` unless `--arms`), `--seeds` each, from the same checkpoint: the outcome is a
   simulated reader (right with probability 0.7 when a valid call framed the target, 0.1 otherwise:
   `research.rewards.simulated_reader_reward`), so only where the policy looked is paid. Only `advantage_estimator`,
   `semantic_verifier`, `semantic_score` and the seed differ between runs; every other parsed field is checked equal
   before anything trains. `--jobs` runs go side by side, one torch thread each. Each run's model is evaluated at
   `--eval_every` steps and at its end; what every run's rollouts framed is logged each step (`target_in_view`,
   weight 0).
5. **Gradient variance** at the SFT checkpoint, per arm, with `--variance_batches` (default 0 here: `make experiment`
   measures it).
6. **Statistics**: per seed, each arm's target-seen minus `grpo`'s and minus the density control's on the same seed
   (paired), their mean and standard error; every evaluation's binomial standard error; the verdict of the stated
   criterion, and the "What it shows" section written from it (with a hash of the results it was written from).

Models and evaluations go to `outputs/experiment/` (`--output_dir`); the report to
`research/reports/experiment_curves.md` (`--report`), with its plots and `results.json` beside it.

    make experiment-curves                               # the control's start when it exists, else made here
    make experiment-curves ARGS="--arms grpo mapo_walk --seeds 0"
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from configs import ToolConfig
from data.benchmarks import load_saved_split
from evaluation.verifier_check import GateResult, check_verifier
from research.report import markdown_table, verdict_sections
from research.rewards import simulated_reader_reward
from research.runs import (  # noqa: F401 (the names the tests and the report read here)
    STEP_METRICS,
    VARIED,
    Paired,
    Spread,
    Start,
    across_seeds,
    binned,
    binomial_se,
    curve,
    difference_se,
    evaluate,
    exceeds,
    format_spread,
    locate,
    paired,
    plot_curves,
    plot_evaluations,
    prepare,
    results_hash,
    row_metrics,
    sft_start,
    shared_fields,
    train_and_evaluate,
    train_and_evaluate_all,
)
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
DEFAULT_ARMS = ("grpo", "mapo_walk", "mapo_clip", "mapo_density")
PRIMARY = "mapo_walk"  # the arm whose verifier carries information in this world
DENSITY = "mapo_density"  # its control: the same bonus per batch, spread over every valid call
REFERENCE = "grpo"  # what every arm is paired against
CONTROL_RECORD = Path("research/reports/positive_control/results.json")
CONTROL_COMMAND = "python -m research.positive_control"  # what makes the record
# The RL settings the control's record holds (`research.positive_control.FIELDS`) that must equal the recipe's: all
# but the reward and the estimator, which the control fixes at GRPO on target_in_view.
CONTROL_FIELDS = ("learning_rate", "lr_scheduler_type", "per_device_train_batch_size", "num_generations",
                  "max_completion_length", "max_tool_calling_iterations", "temperature", "loss_type", "beta",
                  "max_steps")  # fmt: skip
WORLD_FLAGS = ("image_side", "sft_learning_rate", "sft_steps", "sft_start_step")  # where the SFT start comes from
GATE_SCORES = ("contrastive", "cosine")  # the order the clip arm tries them in
DEFAULT_SEEDS = (0, 1, 2)
VERDICT_SIGMAS = 2.0
TRAINING_WINDOW = 10  # steps per point of the training curves (each run's batch means averaged over the bin)

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

# The curves, by `STEP_METRICS` name: title and what the figure is.
CURVES = {
    "target_in_view": (
        "target framed (training rollouts)",
        "batch mean of `target_in_view` (rewards/target_in_view_reward/mean, logged at weight 0): the fraction of the "
        "step's sampled rollouts whose valid call framed the target, what the greedy figure counts, at temperature",
    ),
    "z_mean": (
        "mean z_t",
        "each valid call's z_t from its run's verifier (semantic/z_mean): the walk verifier's (the fraction of valid "
        "calls that framed the target) for every arm but mapo_exact (the fraction that also named it) and mapo_clip "
        "(CLIP's)",
    ),
    "reader_success": (
        "reader success",
        f"batch mean of the simulated reader's outcome (rewards/{simulated_reader_reward.__name__}/mean)",
    ),
    "valid_call_rate": ("valid-call rate", "share of zoom-in calls that returned a crop (1 - tools/zoom_error_rate)"),
    "advantage_std": ("advantage std", "std of the episode advantages (mapo/advantage_std)"),
}


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


# ------------------------------------------------------------------------------------------------------- report
CRITERION = (
    "Stated before the runs, in the code that judges them (`verdict`). The figure is greedy **target-seen** on the "
    "held-out rows at the last step: the fraction of rows where a valid zoom-in call framed the target, which is all "
    "the simulated reader pays for. An arm **beats** another when its target-seen minus the other's on the same seed "
    f"has a mean over seeds above {VERDICT_SIGMAS:g} standard errors of those paired differences *and* above the "
    "binomial standard error of a difference of two evaluations on the same rows. MAPO's semantic signal **acted** "
    "when both hold:\n\n"
    f"1. `{PRIMARY}` (the walk verifier: z_t = 1 when the crop framed the target, so R_sem carries the information) "
    f"beats `{REFERENCE}` (the same outcome, no R_sem);\n"
    f"2. `{PRIMARY}` beats `{DENSITY}` (every valid call paid the batch's mean walk z_t: the same bonus per batch, "
    "nothing about which call framed the target).\n\n"
    "If 1 fails, MAPO's signal did not act here. If 1 holds and 2 fails, a bonus of the same density for calling at "
    "all explains the gain as well as the information in z_t does. The walk verifier ignores the label, so this "
    "tests MAPO's coupling of an informative z_t with the outcome, not label grounding. `mapo_clip` (the paper's "
    "verifier, the kit's tiny CLIP) is judged by the same two rules, and read with its verifier gate: a CLIP that "
    "fails the gate can pay a fixed label more than the right one. Every difference is reported signed, whatever "
    "the verdict."
)


def verdict(results: dict, eval_se: float) -> dict:
    """The criterion (`CRITERION`) on the final evaluations: per arm its `Paired` target-seen against `REFERENCE`
    (`pairs`) and against `DENSITY` (`over_density`, the MAPO arms with a verifier of their own), which arms beat
    which, and whether MAPO's signal acted."""
    finals = {
        arm: {run["seed"]: run["evals"][max(run["evals"])]["target_seen"] for run in runs if run["evals"]}
        for arm, runs in results.items()
    }
    pairs = {arm: paired(values, finals.get(REFERENCE, {})) for arm, values in finals.items() if arm != REFERENCE}
    over_density = {
        arm: paired(values, finals[DENSITY])
        for arm, values in finals.items()
        if DENSITY in finals and arm not in (REFERENCE, DENSITY)
    }

    def beats(pair: Paired | None) -> bool | None:
        return None if pair is None else exceeds(pair, VERDICT_SIGMAS, eval_se)

    walk, walk_density = beats(pairs.get(PRIMARY)), beats(over_density.get(PRIMARY))
    return {
        "pairs": {arm: dataclasses.asdict(p) | {"n": p.n} if p else None for arm, p in pairs.items()},
        "over_density": {arm: dataclasses.asdict(p) | {"n": p.n} if p else None for arm, p in over_density.items()},
        "beats_grpo": {arm: beats(p) for arm, p in pairs.items()},
        "beats_density": {arm: beats(p) for arm, p in over_density.items()},
        "acted": bool(walk and walk_density),
    }


def pair_text(pair: dict | None) -> str:
    """A paired difference as the report writes it: `+0.123 ± 0.045 (n = 3 seeds)`, or `not run`."""
    return "not run" if pair is None else f"{pair['mean']:+.3f} ± {pair['se']:.3f} (n = {pair['n']} seeds)"


def what_it_shows(outcome: dict, gate: dict, clip: tuple[str, bool] | None) -> list[str]:
    """The "What it shows" paragraphs, written from the results (never by hand, so never stale)."""
    v, control = outcome["verdict"], outcome["control"]
    pairs, dense = v["pairs"], v["over_density"]
    seeds = ", ".join(f"{k}: {x['after']:.3f}" for k, x in control["per_seed"].items())
    lines = [
        f"- Positive control (`{control['report']}`: the same world and RL settings, GRPO on the noise-free "
        f"`target_in_view`): greedy target-seen {control['before']:.3f} (SFT) → {seeds} by seed: passed.",
    ]
    lines.append(
        f"- `{PRIMARY}` − `{REFERENCE}`: {pair_text(pairs.get(PRIMARY))}; `{PRIMARY}` − `{DENSITY}`: "
        f"{pair_text(dense.get(PRIMARY))}; `{DENSITY}` − `{REFERENCE}`: {pair_text(pairs.get(DENSITY))}; the "
        f"evaluation's standard error of a difference {outcome['eval_se']:.3f}."
    )
    walk, walk_density = v["beats_grpo"].get(PRIMARY), v["beats_density"].get(PRIMARY)
    if v["acted"]:
        lines.append(
            "- **MAPO's signal acted**: with an informative verifier, MAPO beat GRPO on the same outcome and beat a "
            "bonus of the same density that carries no information. The walk verifier reads where the policy looked, "
            "not its label: this shows the coupling at work, not label grounding."
        )
    elif walk and walk_density is None:
        lines.append(f"- **Not shown**: `{PRIMARY}` beat `{REFERENCE}`, but the density control did not run.")
    elif walk:
        lines.append(
            f"- **Not shown**: `{PRIMARY}` beat `{REFERENCE}` but not `{DENSITY}`: a bonus of the same density for "
            "calling at all explains the gain as well as the information in z_t does."
        )
    else:
        lines.append(
            f"- **MAPO's signal did not act measurably here**: `{PRIMARY}` did not beat `{REFERENCE}` by the stated "
            "margin."
        )
    if "mapo_exact" in pairs:
        judged = "beat" if v["beats_grpo"]["mapo_exact"] else "did not beat"
        lines.append(
            f"- Talk and walk: `mapo_exact` − `{REFERENCE}`: {pair_text(pairs['mapo_exact'])}, so it {judged} "
            f"`{REFERENCE}` by the stated margin; the SFT policy named the target on a call that framed it in "
            f"{outcome['sft']['named_and_seen']:.3f} of greedy rows."
        )
    gate_text = ", ".join(
        f"{how}: AUC {r.auc:.2f}, right-label z {r.right_z:.3f} vs best constant `{r.best_constant}` "
        f"{r.best_constant_z:.3f} ({'pass' if r.passed else 'fail'})"
        for how, r in gate["clip"].items()
    )
    if clip is None or "mapo_clip" not in pairs:
        lines.append(f"- The tiny CLIP's verifier gate: {gate_text}; `mapo_clip` did not run.")
    else:
        how, passed = clip
        status = (
            f"passed the gate under `{how}`" if passed else f"failed the gate (trained under `{how}`, its best AUC)"
        )
        over = v["beats_grpo"]["mapo_clip"], v["beats_density"].get("mapo_clip")
        lines.append(
            f"- The tiny CLIP {status} ({gate_text}); `mapo_clip` − `{REFERENCE}`: {pair_text(pairs['mapo_clip'])}, "
            f"so it {'beat' if over[0] else 'did not beat'} `{REFERENCE}`; `mapo_clip` − `{DENSITY}`: "
            f"{pair_text(dense.get('mapo_clip'))}"
            + ("." if over[1] is None else f", so it {'beat' if over[1] else 'did not beat'} the density control.")
        )
    return lines


def gate_table(gate: dict[str, dict[str, GateResult]]) -> str:
    rows = [
        [
            name,
            how,
            r.rows,
            r.labels,
            f"{r.auc:.3f}",
            f"{r.mean_rank:.1f}",
            f"{r.right_z:.3f}",
            f"`{r.best_constant}`",
            f"{r.best_constant_z:.3f}",
            f"{r.constant_wins:.2f}",
            "pass" if r.passed else "**fail**",
        ]
        for name, by_score in gate.items()
        for how, r in by_score.items()
    ]
    header = ["verifier", "semantic_score", "rows", "labels", "AUC right vs wrong", "right label's mean rank",
              "right label's mean z", "best constant label", "its mean z", "rows it beats the right label",
              "gate"]  # fmt: skip
    return markdown_table(header, rows)


def evaluation_table(results: dict, sft: dict) -> str:
    """One row per arm and one for the SFT checkpoint: target-seen (mean ± population std across seeds, then each
    seed's value), named-and-seen, accuracy against the answers (the tiny policy reads little), and the binomial SE."""
    rows = [["SFT (step 0)", f"{sft['target_seen']:.3f}", "—", f"{sft['named_and_seen']:.3f}",
             f"{sft['accuracy']:.3f}", f"{binomial_se(sft['target_seen'], sft['n']):.3f}"]]  # fmt: skip
    for arm, runs in results.items():
        finals = [run["evals"][max(run["evals"])] for run in runs if run["evals"]]
        seen = [f["target_seen"] for f in finals]
        rows.append(
            [
                arm,
                format_spread(across_seeds(seen)),
                ", ".join(f"{v:.3f}" for v in seen),
                format_spread(across_seeds([f["named_and_seen"] for f in finals])),
                format_spread(across_seeds([f["accuracy"] for f in finals])),
                f"{statistics.fmean(binomial_se(v, f['n']) for v, f in zip(seen, finals)):.3f}" if finals else "—",
            ]
        )
    header = ["model", "target-seen", "per seed", "named and seen", "answer accuracy", "binomial SE of one evaluation"]
    return markdown_table(header, rows)


def paired_table(outcome: dict) -> str:
    """One row per paired comparison: against `REFERENCE`, then against `DENSITY`."""
    v = outcome["verdict"]
    rows = []
    for against, pairs in ((REFERENCE, v["pairs"]), (DENSITY, v["over_density"])):
        for arm, p in pairs.items():
            cells = ["—"] * 3 if p is None else [", ".join(f"{d:+.3f}" for d in p["diffs"]), f"{p['mean']:+.3f}",
                                                 f"{p['se']:.3f}"]  # fmt: skip
            rows.append([f"{arm} − {against}", *cells])
    return markdown_table(["difference", "per seed", "mean", "standard error"], rows)


def variance_table(variance: dict[str, dict]) -> str:
    rows = [
        [arm, f"{v['trace']:.4g}" if v else "—", f"{v['relative']:.3g}" if v else "—"] for arm, v in variance.items()
    ]
    return markdown_table(["arm", "trace of the gradient covariance", "trace / squared norm of the mean"], rows)


def write_report(report: Path, outcome: dict, gate: dict[str, dict[str, GateResult]], setup: dict) -> Path:
    """research/reports/experiment_curves.md, its plots (in `research/reports/experiment_curves/`) and `results.json`, every section generated."""
    figures = report.with_suffix("")
    for stale in figures.glob("*.png"):  # an earlier run's plots, which this report may not redraw
        stale.unlink()
    results, sft, control = outcome["results"], outcome["sft"], outcome["control"]
    digest = results_hash(outcome)
    lines = [
        "# Does MAPO's semantic signal act? A controlled experiment on the tiny world",
        "",
        f"_Generated by `research/experiment.py` on {setup['date']} from results `{digest}` "
        "(`experiment/results.json`); "
        'every section, "What it shows" included, is written from them: rerun it to regenerate._',
        "",
        *verdict_sections(CRITERION, what_it_shows(outcome, gate, outcome["clip"]), setup["command"]),
        "",
        *setup["lines"],
        "",
        "Hyper-parameters, the same in every arm (every parsed field but "
        f"{', '.join(f'`{v}`' for v in VARIED)} was checked equal across runs before training):",
        "",
        markdown_table(["field", "value"], [[f"`{k}`", f"`{v}`"] for k, v in setup["shared"].items()]),
        "",
        "## Verifier gate",
        "",
        "Gold crops of the held-out rows (the tool's crop of the box SFT's gold call uses), every label of those rows "
        "scored against every crop (`evaluation.verifier_check`). A verifier passes when the AUC is at least 0.75 and "
        "the right label's mean z is above the best constant label's: otherwise RL can raise z_t by writing one "
        "fixed label. The exact verifier is a sanity row.",
        "",
        gate_table(gate),
        "",
        "## Positive control",
        "",
        f"Not rerun here: its record, `{control['record']}` (results `{control['hash']}`), checked before anything "
        "trained (`control_check`): it passed, it started from the same world "
        f"(`{control['start']}`), and every RL setting of it but the reward and the estimator is this recipe's. "
        f"GRPO on `target_in_view`, greedy target-seen on {control['n']} held-out rows:",
        "",
        markdown_table(
            ["seed", "SFT", "final", "rise", "passed"],
            [
                [
                    seed,
                    f"{control['before']:.3f}",
                    f"{x['after']:.3f}",
                    f"{x['rise']:+.3f}",
                    "yes" if x["passed"] else "no",
                ]
                for seed, x in control["per_seed"].items()
            ],
        ),  # fmt: skip
        "",
        f"Its command: `{control['command']}`.",
        "",
    ]
    if results:
        lines += [
            "## Final evaluation",
            "",
            f"Greedy, on the first {sft['n']} held-out rows; each arm's cell is the mean ± population std over seeds.",
            "",
            evaluation_table(results, sft),
            "",
            "## Paired differences",
            "",
            f"Final target-seen of each arm minus `{REFERENCE}`'s, and of each MAPO arm with a verifier of its own "
            f"minus `{DENSITY}`'s, on the same seed; the standard error is the paired differences' sample std over "
            "sqrt(seeds). Signed: negative is worse.",
            "",
            paired_table(outcome),
            "",
            "## Curves",
            "",
            "Per arm: the mean across seeds (line) and ±1 standard error of that mean (band: the seeds' sample std "
            "over sqrt(seeds)). A gap is a step where no seed logged the figure.",
            "",
        ]
        control_runs = {"control: GRPO on target_in_view": control["runs"]}
        path = plot_evaluations(results | control_runs, sft, figures / "target_seen.png", band="se")
        lines += ["**greedy target-seen** per evaluation point (0: the SFT checkpoint), with the positive control's "
                  "runs (its record) for scale.", "", f"![target-seen]({figures.name}/{path.name})", ""]  # fmt: skip
        for metric, (title, meaning) in CURVES.items():
            curves = {arm: curve([r["steps"] for r in runs], metric, TRAINING_WINDOW) for arm, runs in results.items()}
            path = plot_curves(curves, title, figures / f"{metric}.png", band="se")
            lines += [f"**{title}**: {meaning}; each run's mean over bins of {TRAINING_WINDOW} steps.", "",
                      f"![{title}]({figures.name}/{path.name})", ""]  # fmt: skip
    if outcome["variance"]:
        lines += [
            "## Gradient variance at the SFT checkpoint",
            "",
            f"Per arm, {setup['variance_batches']} batches drawn from the SFT policy (learning rate 0, clipping off, "
            "seed 0; `gradient_variance_batches`): the trace of the covariance of the policy-gradient estimate across "
            "batches, and that trace over the squared norm of the mean gradient.",
            "",
            variance_table(outcome["variance"]),
            "",
        ]
    lines += [
        "## Warnings",
        "",
        *([f"- {w}" for w in setup["warnings"]] or ["None: every run and evaluation made valid zoom-in calls."]),
        "",
    ]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines), encoding="utf-8")
    figures.mkdir(parents=True, exist_ok=True)
    (figures / "results.json").write_text(json.dumps(outcome, indent=1) + "\n", encoding="utf-8")
    return report


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
    add("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS))
    add("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    add("--rl_steps", type=int, default=None, help="RL steps of every run (default: the recipe's max_steps)")
    add("--eval_every", type=int, default=0, help="also evaluate every K steps (default 0: at the end only)")
    add("--eval_rows", type=int, default=None, help="held-out rows per evaluation (default: all)")
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
    parser.set_defaults(test_rows=128, sft_steps=1200)
    args = parser.parse_args(argv)
    if len(set(args.arms)) < len(args.arms) or len(set(args.seeds)) < len(args.seeds):
        parser.error("--arms and --seeds must not repeat a value")
    if args.arms and REFERENCE not in args.arms:
        parser.error(f"--arms must include {REFERENCE}, which every arm is paired against")
    if args.variance_batches == 1:
        parser.error("--variance_batches needs at least 2 batches (0: skip)")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    if not 0 <= args.sft_start_step < args.sft_steps:
        parser.error(
            f"--sft_start_step {args.sft_start_step}: a step inside --sft_steps {args.sft_steps} (0: its end)"
        )
    recipe_steps = stages.rl_args(["--config", RECIPE])[1].max_steps
    args.rl_steps = args.rl_steps or recipe_steps
    if args.eval_every and args.eval_every >= args.rl_steps:
        args.eval_every = 0
    return args


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
    stage = stages.Stages()
    kit = stages.tiny_kit()
    world = world_of(args)
    record = read_control(args.control)
    reused = None if args.sft_model else control_start(record, world)
    start = reused or locate(args)
    if not args.sft_model and not reused:
        start = dataclasses.replace(start, sft=sft_start(start.sft, args.sft_start_step))
    arms = {name: dict(ARMS[name]) for name in args.arms}
    # Planned (and checked to differ only in the arms' fields, and against the control's record) before anything
    # trains or is made.
    planned = {(arm, seed): run_argv(args, start, kit, arm, seed, **overrides)
               for seed in args.seeds for arm, overrides in arms.items()}  # fmt: skip
    fields = check_shared({key: stages.rl_args(a) for key, a in planned.items()})
    problems = control_check(record, fields, world, start)
    if problems:
        raise SystemExit(
            f"positive control ({args.control}): {'; '.join(problems)}. RL must move the policy in this world before "
            f"an arm's result means anything: run `{CONTROL_COMMAND} ...` (its command: research/positive_control.py) "
            "with this world's settings and RL settings, or name its record with --control."
        )
    control = control_summary(record, args.control, problems)
    test_rows = len(load_saved_split(str(start.data), "test")) if start.data.exists() else args.test_rows
    eval_rows = test_rows if args.eval_rows is None else min(args.eval_rows, test_rows)
    if eval_rows < 1:
        raise SystemExit("--eval_rows: the experiment needs at least one held-out row; its verdict is an evaluation")
    evals = 1 + (args.rl_steps // args.eval_every - (args.rl_steps % args.eval_every == 0) if args.eval_every else 0)
    made = not (args.sft_model or reused)
    estimate = estimate_seconds(len(planned), args.jobs, args.rl_steps, eval_rows, evals, args.variance_batches,
                                len(arms), made)  # fmt: skip
    print(
        f"{len(planned)} runs ({', '.join(args.arms)} x seeds {args.seeds}), {args.jobs} at a time, from {start.sft}"
        f"{' (the control’s)' if reused else ''}: {args.rl_steps} RL steps each, {evals} evaluation(s) of {eval_rows} "
        f"rows per run: about {estimate / 60:.0f} min on 2 idle cores (another torch job on the same cores can make "
        "it many times slower)",
        flush=True,
    )
    if made:
        start = prepare(args, dataclasses.replace(start, sft=args.output_dir / "sft"), stage)
    budget = stages.rollout_budget(RECIPE)
    sft = stage("evaluate the SFT checkpoint", lambda: evaluate(start.sft, start, args.output_dir / "eval" / "sft",
                                                                  eval_rows, budget))  # fmt: skip
    gate_objects = stage("verifier gate", lambda: verifier_gate(start, min(args.gate_rows, test_rows)))
    clip = clip_scoring(gate_objects["clip"])
    if "mapo_clip" in arms:
        arms["mapo_clip"]["semantic_score"] = clip[0]
        planned |= {("mapo_clip", seed): run_argv(args, start, kit, "mapo_clip", seed, **arms["mapo_clip"])
                    for seed in args.seeds}  # fmt: skip
    outcome = {
        "sft": sft,
        "gate": {name: {how: r.as_dict() for how, r in by.items()} for name, by in gate_objects.items()},
        "clip": clip,
        "control": control,
        "results": {},
        "variance": {},
        "eval_se": difference_se(sft["target_seen"], sft["target_seen"], eval_rows),
    }
    jobs = [(argv_rl, start, args.output_dir / "eval" / f"{arm}-seed{seed}", eval_rows, f"{arm} seed {seed}",
             args.eval_every) for (arm, seed), argv_rl in planned.items()]  # fmt: skip
    done = stage(f"{len(jobs)} RL runs, {args.jobs} at a time", lambda: train_and_evaluate_all(jobs, args.jobs))
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for (arm, _), run in zip(planned, done, strict=True):
        results[arm].append(run)
    if args.variance_batches and arms:
        outcome["variance"] = gradient_variance(args, start, kit, arms, stage)
    outcome["results"] = results
    outcome["verdict"] = verdict(results, outcome["eval_se"])
    setup = describe_setup(args, argv, start, fields, results, eval_rows, stage, made)
    report = write_report(args.report, outcome, gate_objects, setup)
    print(f"\nreport: {report}   plots: {report.with_suffix('')}/   runs: {args.output_dir}")
    for line in what_it_shows(outcome, gate_objects, clip):
        print(line)
    for warning in setup["warnings"]:
        print(f"WARNING: {warning}")
    return outcome


def describe_setup(args, argv, start: Start, fields: dict, results: dict, eval_rows: int, stage, made: bool) -> dict:
    """The report's generated setup: the command, where the runs started, sizes, shared fields, wall time."""
    rows = {split: len(load_saved_split(str(start.data), split)) for split in ("train", "test")}
    if made:
        origin = (f"made by this run with the demo's stages: verifier {args.clip_steps} steps, {args.image_side} px "
                  f"square images, SFT {args.sft_steps} steps at {args.sft_learning_rate:g}, its checkpoint at step "
                  f"{args.sft_start_step}")  # fmt: skip
    elif args.sft_model:
        origin = f"given (`--sft_model`), data `{start.data}`, verifier `{start.clip}`"
    else:
        origin = f"the positive control's (its record's), data `{start.data}`, verifier `{start.clip}`"
    seconds = [run["seconds"] for runs in results.values() for run in runs]
    batch, group = fields.get("per_device_train_batch_size"), fields.get("num_generations")
    return {
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", "-m", "research.experiment", *argv])
        + '   # make experiment-curves ARGS="..."',
        "steps": args.rl_steps,
        "variance_batches": args.variance_batches,
        "lines": [
            f"- Start: SFT checkpoint `{start.sft}`, {origin}.",
            f"- Data: synthetic, {rows['train']} train rows, {rows['test']} test rows; every evaluation greedy on the "
            f"first {eval_rows}.",
            f"- Arms: {', '.join(results) or 'none ran'}; seeds {', '.join(map(str, args.seeds))} (RL's seed: data "
            "order and sampling).",
            f"- RL: recipe `{RECIPE}`, {args.rl_steps} steps of {batch} rollouts (groups of {group}); evaluated every "
            f"{args.eval_every or args.rl_steps} steps and at the end; {args.jobs} run(s) at a time"
            + (", one torch thread each." if args.jobs > 1 else "."),
            f"- Wall time: {stage.total() / 60:.1f} min in all"
            + (f"; one arm run (RL and its evaluations) {min(seconds):.0f}-{max(seconds):.0f} s." if seconds else "."),
        ],
        "shared": {k: fields[k] for k in SETUP_FIELDS if k in fields},
        "warnings": [
            f"{arm} seed {run['seed']}: {w}" for arm, rs in results.items() for run in rs for w in run["warnings"]
        ],
    }


if __name__ == "__main__":
    main()
