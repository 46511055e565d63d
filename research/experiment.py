"""`make experiment-curves`: does MAPO's semantic signal act in RL training? The learning-curve route, on CPU.

`make experiment` measures MAPO's gradient claims at a fixed policy instead (`research/gradient_claims.py`,
research/reports/experiment.md); this route stays available as an option, and its last verdict is that RL at this budget does
not move the tiny policy (research/reports/experiment_curves.md).

A run that "goes through" shows nothing: the tiny policy may not move under RL, groups of 2 make every advantage 0
or +-0.71, and a verifier may pay a fixed label more than the right one. So the experiment is built to be able to
fail, in this order (research/reports/experiment_curves.md states the criterion before the results):

1. **Start.** One SFT checkpoint, its data and its CLIP verifier, evaluated greedily on the held-out test split: the
   step-0 row of every table. Made by the demo's stages (`tiny.stages`) in the experiment's own world, or reused
   with `--sft_model`: square images of one size (`--image_side`, so the seen frame and the nine cells' boxes are
   the same in every row) and a short SFT (`--sft_steps` 300), which leaves the policy zooming with boxes too large
   to frame the target: room for RL to move it.
2. **Verifier gate** (`evaluation.verifier_check`): on gold crops of the test rows, the tiny CLIP's AUC of the right
   label against the others on the same crop, and the best constant label's mean z against the right label's, under
   `semantic_score` cosine and contrastive. The `mapo_clip` arm runs with the first scoring that passes, or not at
   all, saying why.
3. **Positive control**: GRPO with a noise-free reward (`target_in_view`: 1 when a valid call framed the target),
   on every seed. If greedy target-seen does not rise from the SFT checkpoint, on average over the seeds, by more
   than twice its standard error (the larger of one evaluation's and the seeds'), RL at this budget cannot move the
   policy and the experiment stops: nothing after it would mean anything.
4. **Arms** (`ARMS`), `--seeds` each, from the same checkpoint, with the world's recipe
   (`research/recipes/config_experiment.yaml`): a simulated reader as the outcome (right with probability 0.7 when a
   valid call framed the target, 0.1 otherwise: `research.rewards.simulated_reader_reward`), groups of 4. Only
   `advantage_estimator`, `semantic_verifier`, `semantic_score` and the seed differ between runs; every other parsed
   field is checked equal before anything trains. Each run's model is evaluated at `--eval_every` steps and at its
   end.
5. **Gradient variance** at the SFT checkpoint, per arm (`configs.MAPOConfig.gradient_variance_batches`):
   `--variance_batches` batches at learning rate 0 (so each is drawn from the SFT policy), gradient clipping off,
   the trace of the gradients' covariance and its ratio to the mean gradient's squared norm.
6. **Statistics**: per seed, each arm's target-seen minus `grpo`'s on the same seed (paired), their mean and standard
   error; every evaluation's binomial standard error; the verdict of the stated criterion, and the "What it shows"
   section written from it (with a hash of the results it was written from).

Models and evaluations go to `outputs/experiment/` (`--output_dir`); the report to `research/reports/experiment_curves.md`
(`--report`), with its plots and `results.json` in `research/reports/experiment_curves/`.

    make experiment                                      # verifier, data and SFT as the demo makes them, then all
    make experiment ARGS="--sft_model outputs/demo/sft"  # reuse make demo's SFT checkpoint, data and verifier
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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from configs import ToolConfig
from data.benchmarks import load_saved_split
from evaluation.verifier_check import GateResult, check_verifier
from research.report import markdown_table, verdict_sections
from research.rewards import simulated_reader_reward
from research.runs import (  # noqa: F401 (the names the tests and the report read here)
    STEP_METRICS,
    VARIED,
    Spread,
    Start,
    across_seeds,
    binomial_se,
    curve,
    difference_se,
    evaluate,
    format_spread,
    locate,
    plot_curves,
    plot_evaluations,
    results_hash,
    row_metrics,
    shared_fields,
    train_and_evaluate,
)
from rewards.verifiers import build_verifier
from tiny import stages
from tools import make_environment_factory
from utils.models import load_processor, pixel_budget

RECIPE = "research/recipes/config_experiment.yaml"
# Each arm: the fields it sets on top of the recipe. The recipe's semantic_verifier is `exact_walk`, so the arms
# that do not train on R_sem (grpo, hpo: weight 0) log the same walk z_t as the walk arms, comparable across arms.
# `mapo_exact` is talk and walk (the label must name the target too); `mapo_walk` is walk only, since the tiny SFT
# policy rarely names the target (the previous run: the exact z_t was non-zero in 1 step of 40 in 5 of 15 runs), and
# `mapo_shuffled` is the walk arm's information control.
ARMS: dict[str, dict[str, str]] = {
    "grpo": {"advantage_estimator": "grpo"},
    "mapo_exact": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact"},
    "mapo_walk": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact_walk"},
    "mapo_shuffled": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:shuffled_exact_walk"},
    "mapo_clip": {"advantage_estimator": "mapo", "semantic_verifier": "clip"},  # semantic_score: the gate's choice
    "hpo": {"advantage_estimator": "hpo"},
    "mapo+hpo": {"advantage_estimator": "mapo+hpo", "semantic_verifier": "research.verifiers:exact_walk"},
}
PRIMARY = "mapo_walk"  # the arm whose verifier carries information in this world, judged against its control
INFORMATION_CONTROL = "mapo_shuffled"
REFERENCE = "grpo"  # what every arm is paired against
CONTROL = {"advantage_estimator": "grpo", "reward_funcs": ["research.rewards:target_in_view_reward"]}
GATE_SCORES = ("contrastive", "cosine")  # the order the clip arm tries them in
DEFAULT_SEEDS = (0, 1, 2)
CONTROL_SIGMAS = 2.0  # the control's rise must exceed this many standard errors of the difference
VERDICT_SIGMAS = 2.0

# Measured on the 2-core CPU machine (2026-12-01) with the cores idle, the world's recipe from its 300-step SFT
# checkpoint: they size the estimate printed before the run starts.
SECONDS_PER_STEP = 1.5
SECONDS_PER_EVAL_ROW = 0.13
SECONDS_PER_RUN = 10.0  # loading the policy, the verifier and (hpo) the text encoder; saving the model
SECONDS_TO_PREPARE = 360.0  # without --sft_model: the verifier, data and SFT stages

SETUP_FIELDS = (
    "reward_funcs", "learning_rate", "lr_scheduler_type", "max_steps", "per_device_train_batch_size",
    "num_generations", "max_completion_length", "max_tool_calling_iterations", "temperature", "loss_type", "beta",
    "semantic_beta", "semantic_lambda", "no_tool_semantic", "hpo_omega", "hpo_min_positive_steps",
    "hpo_min_negative_steps", "hpo_text_encoder", "clip_model",
)  # fmt: skip

# The curves, by `STEP_METRICS` name: title and what the figure is.
CURVES = {
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


# ----------------------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Paired:
    """An arm against the reference on the same seeds: the per-seed differences, their mean and its standard error
    (sample std with ddof 1 over sqrt(n); NaN with one seed)."""

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


def exceeds(pair: Paired | None, sigmas: float, floor: float = 0.0) -> bool:
    """Whether the mean paired difference is above `sigmas` standard errors and above `floor`; False with one seed."""
    return pair is not None and not math.isnan(pair.se) and pair.mean > max(sigmas * pair.se, floor)


# ------------------------------------------------------------------------------------------------- row metrics


# ----------------------------------------------------------------------------------------------------- aggregation


# -------------------------------------------------------------------------------------------------------- plots


# ----------------------------------------------------------------------------------------------------------- runs


def prepare(args: argparse.Namespace, start: Start, stage: stages.Stages, kit: dict[str, Path]) -> None:
    """The demo's own stages: verifier, data (square images of `--image_side`), SFT checkpoint."""
    stage("train the CLIP verifier", lambda: stages.train_verifier(start.clip, kit, args.clip_steps))
    side = {"min_size": args.image_side, "max_size": args.image_side}
    stage("generate synthetic data", lambda: stages.make_data(start.data, args.train_rows, args.test_rows, **side))
    stage("SFT cold start", lambda: stages.run_sft(kit["policy"], start.data, start.sft, args.sft_steps))


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


def clip_scoring(gate: dict[str, GateResult]) -> str | None:
    """The `semantic_score` the clip arm trains with: the first of `GATE_SCORES` whose gate passed, else None."""
    return next((how for how in GATE_SCORES if gate[how].passed), None)


def control_verdict(sft: dict, controls: dict[int, dict]) -> dict:
    """The positive control's figures over its seeds (`{seed: final evaluation}`): target-seen before and after
    (the mean over seeds, and each seed's), the mean rise, its standard error, and whether the rise exceeds
    `CONTROL_SIGMAS` of them. The standard error is the larger of one evaluation's (a difference of two rates on the
    same `n` rows) and the seeds' (sample std of the rises over sqrt(seeds)): one lucky data order must not pass."""
    before, n = sft["target_seen"], sft["n"]
    per_seed = {seed: control["target_seen"] for seed, control in controls.items()}
    rises = [after - before for after in per_seed.values()]
    rise = statistics.fmean(rises)
    seeds_se = statistics.stdev(rises) / math.sqrt(len(rises)) if len(rises) > 1 else float("nan")
    se = max(difference_se(before, before + rise, n), 0.0 if math.isnan(seeds_se) else seeds_se)
    return {
        "before": before,
        "after": before + rise,
        "per_seed": per_seed,
        "rise": rise,
        "se": se,
        "seeds_se": seeds_se,
        "n": n,
        "passed": rise > CONTROL_SIGMAS * se,
    }


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
    "Stated before the runs, in the code that judges them (`verdict`). The primary figure is greedy **target-seen** "
    "on the held-out rows: the fraction of rows where a valid zoom-in call framed the target, which is what the "
    "simulated reader rewards. Paired per seed against `grpo`, MAPO's signal **acted** when both hold:\n\n"
    f"1. `{PRIMARY}` (the walk verifier: z_t = 1 when the crop framed the target, so R_sem carries the information) "
    f"beats `grpo` by a mean paired difference above {VERDICT_SIGMAS:g} standard errors of the paired differences "
    "*and* above the binomial standard error of a difference of two evaluations;\n"
    f"2. `{INFORMATION_CONTROL}` (the same z_t values, permuted within each batch: the same advantage sizes, no "
    f"information) does **not** beat `grpo` by {VERDICT_SIGMAS:g} standard errors.\n\n"
    "If 1 fails, MAPO's signal did not act here. If 1 and 2 both hold, the gain came from the information in z_t, "
    "not from larger advantages. If 2 fails too, bigger advantages explain the gain as well as information does. "
    "The walk verifier ignores the label, so this tests MAPO's coupling of an informative z_t with the outcome, not "
    "label grounding. `mapo_exact` (talk and walk: the label must name the target too) and `mapo_clip` (only if the "
    "tiny CLIP passed the verifier gate) are judged by the same rule 1."
)


def verdict(results: dict, eval_se: float) -> dict:
    """The criterion (`CRITERION`) on the final evaluations: per arm its `Paired` target-seen against `REFERENCE`, and
    whether MAPO's signal acted."""
    finals = {
        arm: {run["seed"]: run["evals"][max(run["evals"])]["target_seen"] for run in runs if run["evals"]}
        for arm, runs in results.items()
    }
    pairs = {arm: paired(values, finals.get(REFERENCE, {})) for arm, values in finals.items() if arm != REFERENCE}
    walk = exceeds(pairs.get(PRIMARY), VERDICT_SIGMAS, eval_se)
    shuffled = exceeds(pairs.get(INFORMATION_CONTROL), VERDICT_SIGMAS)
    exact = exceeds(pairs.get("mapo_exact"), VERDICT_SIGMAS, eval_se) if "mapo_exact" in pairs else None
    clip = exceeds(pairs.get("mapo_clip"), VERDICT_SIGMAS, eval_se) if "mapo_clip" in pairs else None
    return {
        "pairs": {arm: dataclasses.asdict(p) | {"n": p.n} if p else None for arm, p in pairs.items()},
        "walk_beats_grpo": walk,
        "shuffled_beats_grpo": shuffled,
        "exact_beats_grpo": exact,
        "clip_beats_grpo": clip,
        "acted": walk and not shuffled,
    }


def what_it_shows(outcome: dict, control: dict, gate: dict, clip_score: str | None) -> list[str]:
    """The "What it shows" paragraphs, written from the results (never by hand, so never stale)."""
    v = outcome["verdict"]
    pairs = v["pairs"]

    def pair_text(arm: str) -> str:
        p = pairs.get(arm)
        return "not run" if p is None else f"{p['mean']:+.3f} ± {p['se']:.3f} (n = {p['n']} seeds)"

    lines = [
        f"- Positive control: GRPO on the noise-free reward moved greedy target-seen from {control['before']:.3f} to "
        f"{control['after']:.3f} on average over {len(control['per_seed'])} seeds ({control['rise']:+.3f}, standard "
        f"error {control['se']:.3f}): "
        + ("RL at this budget moves the policy." if control["passed"] else "**not** a measurable move."),
    ]
    if control["passed"]:
        lines.append(
            f"- `{PRIMARY}` − `grpo`, target-seen: {pair_text(PRIMARY)}; `{INFORMATION_CONTROL}` − `grpo`: "
            f"{pair_text(INFORMATION_CONTROL)}; evaluation standard error of a difference {outcome['eval_se']:.3f}."
        )
    if not control["passed"]:
        lines.append(
            "- **Not tested**: the positive control failed, so no arm ran: whether MAPO's signal acts cannot be "
            "told from RL that does not move the policy."
        )
    elif v["acted"]:
        lines.append(
            "- **MAPO's signal acted**: with an informative verifier, MAPO raised target-seen beyond GRPO's by more "
            "than the noise, and the shuffled control, with the same advantage sizes and no information, did not. "
            "The walk verifier reads where the policy looked, not its label: this shows the coupling at work, not "
            "label grounding."
        )
    elif v["walk_beats_grpo"] and v["shuffled_beats_grpo"]:
        lines.append(
            f"- **Not shown**: `{PRIMARY}` beat `grpo`, but so did `{INFORMATION_CONTROL}`: larger advantages "
            "explain the gain as well as the information in z_t does."
        )
    else:
        lines.append(
            f"- **MAPO's signal did not act measurably here**: `{PRIMARY}` did not beat `grpo` by the stated margin."
        )
    if v.get("exact_beats_grpo") is not None:
        named = outcome["sft"]["named_and_seen"]
        judged = "beat" if v["exact_beats_grpo"] else "did not beat"
        lines.append(
            f"- Talk and walk: `mapo_exact` − `grpo`: {pair_text('mapo_exact')}, so it {judged} `grpo` by the stated "
            f"margin; the SFT policy named the target on a call that framed it in {named:.3f} of greedy rows."
        )
    clip = gate["clip"]
    gate_text = ", ".join(
        f"{how}: AUC {r.auc:.2f}, right-label z {r.right_z:.3f} vs best constant `{r.best_constant}` "
        f"{r.best_constant_z:.3f} ({'pass' if r.passed else 'fail'})"
        for how, r in clip.items()
    )
    if clip_score is None:
        lines.append(f"- The tiny CLIP failed the verifier gate ({gate_text}); `mapo_clip` did not run.")
    else:
        judged = "beat" if v["clip_beats_grpo"] else "did not beat"
        lines.append(
            f"- The tiny CLIP passed the gate under `{clip_score}` ({gate_text}); `mapo_clip` − `grpo`: "
            f"{pair_text('mapo_clip')}, so it {judged} `grpo` by the stated margin."
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
    rows = []
    for arm, p in outcome["verdict"]["pairs"].items():
        if p is None:
            rows.append([arm, "—", "—", "—"])
            continue
        rows.append([arm, ", ".join(f"{d:+.3f}" for d in p["diffs"]), f"{p['mean']:+.3f}", f"{p['se']:.3f}"])
    return markdown_table([f"arm − {REFERENCE}", "per seed", "mean", "standard error"], rows)


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
        *verdict_sections(CRITERION, what_it_shows(outcome, control, gate, outcome["clip_score"]), setup["command"]),
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
        f"GRPO with the noise-free reward (`target_in_view`), {setup['steps']} steps, on every seed: greedy "
        f"target-seen {control['before']:.3f} (SFT) → {control['after']:.3f} on {control['n']} rows, the mean over "
        f"seeds ({', '.join(f'seed {k}: {v:.3f}' for k, v in control['per_seed'].items())}), a rise of "
        f"{control['rise']:+.3f} against a standard error of {control['se']:.3f} (the larger of one evaluation's and "
        "the seeds'): "
        + ("**passed**" if control["passed"] else "**failed**")
        + f" (the bar: {CONTROL_SIGMAS:g} standard errors).",
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
            "## Paired against grpo",
            "",
            "Target-seen of each arm minus `grpo`'s on the same seed; the standard error is the paired differences' "
            "sample std over sqrt(seeds).",
            "",
            paired_table(outcome),
            "",
            "## Curves",
            "",
            "Per arm: the mean across seeds (line) and the min-max band. A gap is a step where no seed logged the "
            "figure.",
            "",
        ]
        path = plot_evaluations(results, sft, figures / "target_seen.png")
        lines += ["**greedy target-seen** per evaluation point (0: the SFT checkpoint).", "",
                  f"![target-seen]({figures.name}/{path.name})", ""]  # fmt: skip
        for metric, (title, meaning) in CURVES.items():
            curves = {arm: curve([r["steps"] for r in runs], metric) for arm, runs in results.items()}
            path = plot_curves(curves, title, figures / f"{metric}.png")
            lines += [f"**{title}**: {meaning}.", "", f"![{title}]({figures.name}/{path.name})", ""]
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


def estimate_seconds(arms: int, seeds: int, steps: int, eval_rows: int, evals_per_run: int, variance: int,
                     prepare: bool) -> float:  # fmt: skip
    """Wall time of the whole experiment at the rates measured on 2 idle cores: `arms` x `seeds` runs evaluated
    `evals_per_run` times, a control per seed (evaluated at its end), the SFT evaluation, a gradient-variance run per
    arm, and the preparation."""
    train = SECONDS_PER_RUN + steps * SECONDS_PER_STEP
    evaluation = eval_rows * SECONDS_PER_EVAL_ROW
    runs = arms * seeds * (train + evals_per_run * evaluation) + seeds * (train + evaluation)
    gradvar = arms * (variance and SECONDS_PER_RUN + variance * SECONDS_PER_STEP)
    return runs + evaluation + gradvar + (SECONDS_TO_PREPARE if prepare else 0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    add("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    add("--rl_steps", type=int, default=None, help="RL steps of every run (default: the recipe's max_steps)")
    add(
        "--eval_every",
        type=int,
        default=0,
        help="also evaluate every K steps (default 0: at the end only, which keeps 18 runs within 45 min on 2 cores)",
    )
    add("--eval_rows", type=int, default=None, help="held-out rows per evaluation (default: all)")
    add("--gate_rows", type=int, default=64, help="held-out rows of the verifier gate")
    add("--variance_batches", type=int, default=16, help="batches of the gradient-variance measurement (0: skip)")
    add("--output_dir", type=Path, default=Path("outputs/experiment"))
    add(
        "--report",
        type=Path,
        default=Path("research/reports/experiment_curves.md"),
        help="plots go in <report without .md>/",
    )
    add("--sft_model", type=Path, default=None, help="reuse this SFT checkpoint (default: make one as the demo does)")
    add("--data", type=Path, default=None, help="with --sft_model: its data (default: data/ beside it)")
    add("--clip", type=Path, default=None, help="with --sft_model: the verifier (default: clip/ beside it)")
    add("--image_side", type=int, default=768, help="without --sft_model: the side of every synthetic image")
    stages.add_stage_arguments(parser)
    parser.set_defaults(test_rows=128, sft_steps=300)
    args = parser.parse_args(argv)
    if len(set(args.arms)) < len(args.arms) or len(set(args.seeds)) < len(args.seeds):
        parser.error("--arms and --seeds must not repeat a value")
    if args.arms and REFERENCE not in args.arms:
        parser.error(f"--arms must include {REFERENCE}, which every arm is paired against")
    if args.variance_batches == 1:
        parser.error("--variance_batches needs at least 2 batches (0: skip)")
    recipe_steps = stages.rl_args(["--config", RECIPE])[1].max_steps
    args.rl_steps = args.rl_steps or recipe_steps
    if args.eval_every and args.eval_every >= args.rl_steps:
        args.eval_every = 0
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    stage = stages.Stages()
    kit = stages.tiny_kit()
    start = locate(args)
    test_rows = len(load_saved_split(str(start.data), "test")) if args.sft_model else args.test_rows
    eval_rows = test_rows if args.eval_rows is None else min(args.eval_rows, test_rows)
    if eval_rows < 1:
        raise SystemExit("--eval_rows: the experiment needs at least one held-out row; its verdict is an evaluation")
    runs_n = len(args.arms) * len(args.seeds)
    evals = 1 + (args.rl_steps // args.eval_every - (args.rl_steps % args.eval_every == 0) if args.eval_every else 0)
    estimate = estimate_seconds(
        len(args.arms), len(args.seeds), args.rl_steps, eval_rows, evals, args.variance_batches, not args.sft_model
    )
    print(
        f"{runs_n} runs ({', '.join(args.arms)} x seeds {args.seeds}) and a control per seed, {args.rl_steps} RL "
        "steps each, "
        f"{evals} evaluation(s) of {eval_rows} rows per run: about {estimate / 60:.0f} min on 2 idle cores (another "
        "torch job on the same cores can make it many times slower)",
        flush=True,
    )
    if not args.sft_model:
        prepare(args, start, stage, kit)
    budget = stages.rollout_budget(RECIPE)
    sft = stage("evaluate the SFT checkpoint", lambda: evaluate(start.sft, start, args.output_dir / "eval" / "sft",
                                                                  eval_rows, budget))  # fmt: skip
    gate_objects = stage("verifier gate", lambda: verifier_gate(start, min(args.gate_rows, test_rows)))
    clip_score = clip_scoring(gate_objects["clip"])
    arms = {name: dict(ARMS[name]) for name in args.arms}
    if "mapo_clip" in arms:
        if clip_score is None:
            print("the tiny CLIP failed the verifier gate under every scoring: mapo_clip does not run")
            del arms["mapo_clip"]
        else:
            arms["mapo_clip"]["semantic_score"] = clip_score

    # Planned (and checked to differ only in the arms' fields) before anything trains, so the report states the
    # shared settings even when the control stops the experiment.
    planned = {(arm, seed): run_argv(args, start, kit, arm, seed, **overrides)
               for seed in args.seeds for arm, overrides in arms.items()}  # fmt: skip
    fields = check_shared({key: stages.rl_args(a) for key, a in planned.items()}) if planned else {}
    control_runs = {}
    for seed in args.seeds:
        control_argv = run_argv(args, start, kit, "control", seed, **CONTROL)
        eval_dir = args.output_dir / "eval" / f"control-seed{seed}"
        control_runs[seed] = train_and_evaluate(control_argv, start, eval_dir, eval_rows, stage,
                                                f"positive control seed {seed}", 0)  # fmt: skip
    control = control_verdict(sft, {seed: run["evals"][args.rl_steps] for seed, run in control_runs.items()})
    control |= {"steps": {seed: run["steps"] for seed, run in control_runs.items()}}
    outcome = {
        "sft": sft,
        "gate": {name: {how: r.as_dict() for how, r in by.items()} for name, by in gate_objects.items()},
        "clip_score": clip_score,
        "control": control,
        "results": {},
        "variance": {},
        "eval_se": difference_se(sft["target_seen"], sft["target_seen"], eval_rows),
    }
    setup = describe_setup(args, argv, start, fields, {}, eval_rows, stage)
    if not control["passed"]:
        outcome["verdict"] = verdict({}, outcome["eval_se"])
        write_report(args.report, outcome, gate_objects, setup)
        raise SystemExit(
            f"positive control failed: GRPO on the noise-free reward moved greedy target-seen by {control['rise']:+.3f}"
            f" (SFT {control['before']:.3f}, RL {control['after']:.3f}, the mean over seeds {args.seeds}), not above "
            f"{CONTROL_SIGMAS:g} standard errors ({control['se']:.3f}): RL at this budget does not move the policy, so "
            f"no arm's result would mean anything. Report: {args.report}"
        )

    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    spent = []
    for i, ((arm, seed), argv_rl) in enumerate(planned.items(), start=1):
        t0 = time.perf_counter()
        eval_dir = args.output_dir / "eval" / f"{arm}-seed{seed}"
        run = train_and_evaluate(argv_rl, start, eval_dir, eval_rows, stage, f"{arm} seed {seed}", args.eval_every)
        spent.append(time.perf_counter() - t0)
        results[arm].append(run | {"seconds": round(spent[-1], 1)})
        left = statistics.fmean(spent) * (len(planned) - i)
        print(f"run {i}/{len(planned)} ({arm}, seed {seed}) took {spent[-1]:.0f} s; about {left / 60:.1f} min left")
    if args.variance_batches and arms:
        outcome["variance"] = gradient_variance(args, start, kit, arms, stage)
    outcome["results"] = results
    outcome["verdict"] = verdict(results, outcome["eval_se"])
    setup = describe_setup(args, argv, start, fields, results, eval_rows, stage)
    report = write_report(args.report, outcome, gate_objects, setup)
    print(f"\nreport: {report}   plots: {report.with_suffix('')}/   runs: {args.output_dir}")
    for line in what_it_shows(outcome, control, gate_objects, clip_score):
        print(line)
    for warning in setup["warnings"]:
        print(f"WARNING: {warning}")
    return outcome


def describe_setup(args, argv, start: Start, fields: dict, results: dict, eval_rows: int, stage) -> dict:
    """The report's generated setup: the command, where the runs started, sizes, shared fields, wall time."""
    rows = {split: len(load_saved_split(str(start.data), split)) for split in ("train", "test")}
    made = (
        f"given (`--sft_model`), data `{start.data}`, verifier `{start.clip}`"
        if args.sft_model
        else f"made by this run with the demo's stages: verifier {args.clip_steps} steps, {args.image_side} px "
        f"square images, SFT {args.sft_steps} steps"
    )
    seconds = [run["seconds"] for runs in results.values() for run in runs]
    batch, group = fields.get("per_device_train_batch_size"), fields.get("num_generations")
    return {
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", "-m", "research.experiment", *argv]) + '   # make experiment ARGS="..."',
        "steps": args.rl_steps,
        "variance_batches": args.variance_batches,
        "lines": [
            f"- Start: SFT checkpoint `{start.sft}`, {made}.",
            f"- Data: synthetic, {rows['train']} train rows, {rows['test']} test rows; every evaluation greedy on the "
            f"first {eval_rows}.",
            f"- Arms: {', '.join(results) or 'none ran'}; seeds {', '.join(map(str, args.seeds))} (RL's seed: data "
            "order and sampling).",
            f"- RL: recipe `{RECIPE}`, {args.rl_steps} steps of {batch} rollouts (groups of {group}); evaluated every "
            f"{args.eval_every or args.rl_steps} steps and at the end.",
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
