"""The report of `make experiment-curves` (research/reports/experiment_curves.md): the verdict of the plan's rule on
the runs' per-row outcomes (`judge`, `research.curve_stats`), the tables and the curves, every section written from
the results. `research/experiment.py` runs the arms and calls `write_report`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from evaluation.verifier_check import GateResult
from research.curve_stats import ACTED, DID_NOT_ACT, Comparison, Plan, compare, verdict
from research.report import markdown_table, verdict_sections
from research.rewards import simulated_reader_reward
from research.runs import (
    VARIED,
    across_seeds,
    binomial_se,
    curve,
    format_spread,
    plot_curves,
    plot_evaluations,
    results_hash,
)

TRAINING_WINDOW = 10  # steps per point of the training curves (each run's batch means averaged over the bin)

# The curves, by `research.runs.STEP_METRICS` name: title and what the figure is.
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


# ------------------------------------------------------------------------------------------------------ verdict
def finals(results: dict) -> dict[str, dict[int, list[int]]]:
    """Per arm, `{seed: per-row outcomes}` of each run's last evaluation."""
    return {
        arm: {run["seed"]: run["evals"][max(run["evals"])]["outcomes"] for run in runs if run["evals"]}
        for arm, runs in results.items()
    }


def judge(results: dict, plan: Plan) -> dict:
    """The plan's comparisons and rule on the runs' final evaluations: every arm against the reference
    (`over_reference`), every arm with a verifier of its own against the density control (`over_density`), each a
    `Comparison` as a dict with its `detectable`, and the primary arm's `verdict` (`research.curve_stats.verdict`)."""
    outcomes = finals(results)

    def against(base: str, arms: list[str]) -> dict[str, Comparison | None]:
        theirs = outcomes.get(base, {})
        return {arm: compare(outcomes[arm], theirs, plan) if set(outcomes[arm]) & set(theirs) else None
                for arm in arms}  # fmt: skip

    over_reference = against(plan.reference, [a for a in outcomes if a != plan.reference])
    over_density = against(plan.density, [a for a in outcomes if a not in (plan.reference, plan.density)])
    if plan.density not in outcomes:
        over_density = {}

    def as_dict(c: Comparison | None) -> dict | None:
        return None if c is None else dataclasses.asdict(c) | {"detectable": c.detectable}

    return {
        "over_reference": {arm: as_dict(c) for arm, c in over_reference.items()},
        "over_density": {arm: as_dict(c) for arm, c in over_density.items()},
        "verdict": verdict(over_reference.get(plan.primary), over_density.get(plan.primary)),
    }


def criterion(plan: Plan, raw: dict, origin: str) -> str:
    """ "What would count": the plan file's figure, analysis and rule, as committed (`origin` says where and when)."""
    analysis = raw["analysis"]
    rules = "\n".join(f"- {rule}" for rule in raw["rule"])
    return (
        f"Stated before any run in the plan file `{origin}`, and applied by `research/curve_stats.py`, which reads "
        f"it. **Figure**: {raw['figure']}. **Arms** ({len(plan.seeds)} seeds each, from the same SFT checkpoint): "
        + "; ".join(f"`{arm}`: {what}" for arm, what in raw["arms"].items())
        + f". **Analysis**: {analysis['paired']}; {analysis['bootstrap']} ({plan.replicates:,} replicates, seed "
        f"{plan.bootstrap_seed}), at alpha {plan.alpha:g}; the smallest effect of interest {plan.smallest_effect:g}."
        f"\n\n**Rule**:\n\n{rules}"
    )


def comparison_text(c: dict | None) -> str:
    """One comparison as the report's prose gives it: `+0.012 (SE 0.010, t = 1.20 with 7 df; bootstrap [-0.004,
    +0.030]): undecided`, or `not run`."""
    if c is None:
        return "not run"
    return (f"{c['mean']:+.3f} (SE {c['se']:.3f}, t = {c['t']:.2f} with {c['df']} df; bootstrap [{c['lo']:+.3f}, "
            f"{c['hi']:+.3f}]): {c['call']}")  # fmt: skip


def what_it_shows(outcome: dict, gate: dict[str, dict[str, GateResult]], plan: Plan) -> list[str]:
    """The "What it shows" paragraphs, written from the results (never by hand, so never stale)."""
    judged, control = outcome["judged"], outcome["control"]
    ref, dens = judged["over_reference"], judged["over_density"]
    p, r, d = plan.primary, plan.reference, plan.density
    seeds = ", ".join(f"{k}: {x['after']:.3f}" for k, x in control["per_seed"].items())
    lines = [
        f"- Positive control (`{control['report']}`: the same world and RL settings, GRPO on the noise-free "
        f"`target_in_view`): greedy target-seen {control['before']:.3f} (SFT) → {seeds} by seed: passed.",
        f"- `{p}` − `{r}`: {comparison_text(ref.get(p))}.",
        f"- `{p}` − `{d}`: {comparison_text(dens.get(p))}.",
        f"- `{d}` − `{r}`: {comparison_text(ref.get(d))}.",
    ]
    if outcome.get("departures"):
        lines.append(f"- **This run departs from the plan** ({'; '.join(outcome['departures'])}): its verdict is "
                     "the rule applied to what ran, not the plan's test.")  # fmt: skip
    v = judged["verdict"]
    if v == ACTED:
        lines.append(
            f"- **Verdict: MAPO's signal acted.** With an informative verifier, `{p}` is above `{r}` on the same "
            f"outcome and above `{d}`, a bonus of the same density that carries no information. The walk verifier "
            "reads where the policy looked, not its label: this shows the coupling at work, not label grounding."
        )
    elif v == DID_NOT_ACT:
        over = ref.get(p) or {}
        why = (
            f"`{p}` is not above `{r}` by the smallest effect of interest ({plan.smallest_effect:g}) or is below it"
            if over.get("call") != "above"
            else f"`{p}` is above `{r}`, but not above `{d}`: a bonus of the same density explains the gain"
        )
        lines.append(f"- **Verdict: MAPO's signal did not act here**: {why}.")
    else:
        detectable = [c["detectable"] for c in (ref.get(p), dens.get(p)) if c and math.isfinite(c["detectable"])]
        smallest = f"; the smallest difference this run could detect (80% power) was {max(detectable):.3f}" if (
            detectable) else ""  # fmt: skip
        lines.append(f"- **Verdict: inconclusive**: the comparisons neither pass the rule nor rule out an effect of "
                     f"{plan.smallest_effect:g}{smallest}.")  # fmt: skip
    gate_text = ", ".join(
        f"{how}: AUC {g.auc:.2f}, right-label z {g.right_z:.3f} vs best constant `{g.best_constant}` "
        f"{g.best_constant_z:.3f} ({'pass' if g.passed else 'fail'})"
        for how, g in gate["clip"].items()
    )
    if "mapo_clip" not in ref:
        lines.append(f"- The tiny CLIP's verifier gate: {gate_text}; `mapo_clip` did not run.")
    else:
        how, passed = outcome["clip"]
        status = (
            f"passed the gate under `{how}`" if passed else f"failed the gate (trained under `{how}`, its best AUC)"
        )
        lines.append(
            f"- `mapo_clip`, outside the verdict: the tiny CLIP {status} ({gate_text}); `mapo_clip` − `{r}`: "
            f"{comparison_text(ref['mapo_clip'])}; `mapo_clip` − `{d}`: {comparison_text(dens.get('mapo_clip'))}."
        )
    return lines


# ------------------------------------------------------------------------------------------------------- tables
def gate_table(gate: dict[str, dict[str, GateResult]]) -> str:
    rows = [
        [
            name,
            how,
            g.rows,
            g.labels,
            f"{g.auc:.3f}",
            f"{g.mean_rank:.1f}",
            f"{g.right_z:.3f}",
            f"`{g.best_constant}`",
            f"{g.best_constant_z:.3f}",
            f"{g.constant_wins:.2f}",
            "pass" if g.passed else "**fail**",
        ]  # fmt: skip
        for name, by_score in gate.items()
        for how, g in by_score.items()
    ]
    header = ["verifier", "semantic_score", "rows", "labels", "AUC right vs wrong", "right label's mean rank",
              "right label's mean z", "best constant label", "its mean z", "rows it beats the right label",
              "gate"]  # fmt: skip
    return markdown_table(header, rows)


def evaluation_table(results: dict, sft: dict) -> str:
    """One row per arm and one for the SFT checkpoint: target-seen (mean ± population std across seeds, then each
    seed's value), named-and-seen, accuracy against the answers (the tiny policy reads little), and one evaluation's
    binomial SE (for scale: the verdict pairs rows and seeds instead)."""
    rows = [["SFT (step 0)", f"{sft['target_seen']:.3f}", "—", f"{sft['named_and_seen']:.3f}",
             f"{sft['accuracy']:.3f}", f"{binomial_se(sft['target_seen'], sft['n']):.3f}"]]  # fmt: skip
    for arm, runs in results.items():
        last = [run["evals"][max(run["evals"])] for run in runs if run["evals"]]
        seen = [f["target_seen"] for f in last]
        rows.append(
            [
                arm,
                format_spread(across_seeds(seen)),
                ", ".join(f"{v:.3f}" for v in seen),
                format_spread(across_seeds([f["named_and_seen"] for f in last])),
                format_spread(across_seeds([f["accuracy"] for f in last])),
                f"{statistics.fmean(binomial_se(v, f['n']) for v, f in zip(seen, last)):.3f}" if last else "—",
            ]
        )
    header = ["model", "target-seen", "per seed", "named and seen", "answer accuracy", "binomial SE of one evaluation"]
    return markdown_table(header, rows)


def paired_table(judged: dict, plan: Plan) -> str:
    """One row per comparison: against the reference, then against the density control."""
    rows = []
    for against, comparisons in ((plan.reference, judged["over_reference"]), (plan.density, judged["over_density"])):
        for arm, c in comparisons.items():
            cells = ["—"] * 8 if c is None else [
                ", ".join(f"{d:+.3f}" for d in c["diffs"]), f"{c['mean']:+.3f}", f"{c['se']:.3f}",
                f"{c['t']:.2f} ({c['df']})", f"{c['t_crit']:.2f}", f"[{c['lo']:+.3f}, {c['hi']:+.3f}]", c["call"],
                f"{c['detectable']:.3f}"]  # fmt: skip
            rows.append([f"{arm} − {against}", *cells])
    header = ["difference", "per seed", "mean", "standard error", "t (df)", "t bar", "bootstrap interval", "call",
              "detectable (80% power)"]  # fmt: skip
    return markdown_table(header, rows)


def variance_table(variance: dict[str, dict]) -> str:
    rows = [
        [arm, f"{v['trace']:.4g}" if v else "—", f"{v['relative']:.3g}" if v else "—"] for arm, v in variance.items()
    ]
    return markdown_table(["arm", "trace of the gradient covariance", "trace / squared norm of the mean"], rows)


def control_table(control: dict) -> str:
    rows = [[seed, f"{control['before']:.3f}", f"{x['after']:.3f}", f"{x['rise']:+.3f}", "yes" if x["passed"] else "no"]
            for seed, x in control["per_seed"].items()]  # fmt: skip
    return markdown_table(["seed", "SFT", "final", "rise", "passed"], rows)


# ------------------------------------------------------------------------------------------------------- report
def write_report(report: Path, outcome: dict, gate: dict[str, dict[str, GateResult]], setup: dict, plan: Plan,
                 raw_plan: dict) -> Path:  # fmt: skip
    """research/reports/experiment_curves.md, its plots (in `research/reports/experiment_curves/`) and `results.json`,
    every section generated."""
    figures = report.with_suffix("")
    for stale in figures.glob("*.png"):  # an earlier run's plots, which this report may not redraw
        stale.unlink()
    results, sft, control = outcome["results"], outcome["sft"], outcome["control"]
    lines = [
        "# Does MAPO's semantic signal act? A controlled experiment on the tiny world",
        "",
        f"_Generated by `research/experiment.py` on {setup['date']} from results `{results_hash(outcome)}` "
        f'(`{figures.name}/results.json`, every row\'s outcome included); every section, "What it shows" included, '
        "is written from them: rerun it to regenerate._",
        "",
        *verdict_sections(
            criterion(plan, raw_plan, setup["plan_origin"]), what_it_shows(outcome, gate, plan), setup["command"]
        ),  # fmt: skip
        "",
        *setup["lines"],
        "",
        f"Hyper-parameters, the same in every arm (every parsed field but {', '.join(f'`{v}`' for v in VARIED)} was "
        "checked equal across runs before training):",
        "",
        markdown_table(["field", "value"], [[f"`{k}`", f"`{v}`"] for k, v in setup["shared"].items()]),
        "",
        "## Verifier gate",
        "",
        "Gold crops of the held-out rows (the tool's crop of the box SFT's gold call uses), every label of those rows "
        "scored against every crop (`evaluation.verifier_check`). A verifier passes when the AUC is at least 0.75, "
        "the right label's mean z is above the best constant label's (otherwise RL can raise z_t by writing one fixed "
        "label) and its walk AUC is at least 0.75. The exact verifier is a sanity row.",
        "",
        gate_table(gate),
        "",
        "## Positive control",
        "",
        f"Not rerun here: its record, `{control['record']}` (results `{control['hash']}`), checked before anything "
        f"trained (`control_check`): it passed, it started from the same world (`{control['start']}`), and every RL "
        f"setting of it but the reward and the estimator is this recipe's. GRPO on `target_in_view`, greedy "
        f"target-seen on {control['n']} held-out rows:",
        "",
        control_table(control),
        "",
        f"Its command: `{control['command']}`.",
        "",
    ]
    if results:
        lines += [
            "## Final evaluation",
            "",
            f"Greedy, on the first {sft['n']} held-out rows, the same rows for every run; each arm's cell is the mean "
            "± population std over seeds.",
            "",
            evaluation_table(results, sft),
            "",
            "## Paired differences",
            "",
            f"Final target-seen of each arm minus `{plan.reference}`'s, and of each arm with a verifier of its own "
            f"minus `{plan.density}`'s, on the same seed and rows: the per-seed differences, their mean, its standard "
            f"error (sample std over sqrt(seeds)), t with its degrees of freedom against the two-sided {1 - plan.alpha:.0%} "
            f"bar, the {1 - plan.alpha:.0%} bootstrap interval over seeds then rows, the rule's call, and the "
            "smallest difference the run detects with 80% power ((t bar + 0.84) x SE). Signed: negative is worse.",
            "",
            paired_table(outcome["judged"], plan),
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
