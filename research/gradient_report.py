"""The report of `make experiment` (research/reports/experiment.md): its plots, tables and results.json, written from
the analysis; it refuses a headline with a number results.json does not hold."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from research import gradient_stats as gs
from research.gradient_arms import ESTIMATORS, PERMUTATIONS, Q0, QUALITIES, REFERENCE, REINFORCE, WALK
from research.gradient_products import DIRECTIONS
from research.gradient_verdicts import EASY_P, RECIPE_PROMPTS
from research.gradient_words import (
    CONTRASTS,
    CRITERIA,
    STEPS,
    constant_noise,
    crossing_words,
    estimator_table,
    fmt,
    fmt_signed,
    interval,
    pm,
    prompts_of,
    sci,
    significance,
    what_it_shows,
)
from research.report import markdown_table, unbacked_numbers, verdict_sections


def plot_quality(path: Path, results: dict) -> None:
    """The quality sweep's signed gain minus GRPO's, with 2 SE bars, one panel per batch size, one curve per
    scaling."""
    from matplotlib.figure import Figure

    sizes = results["batch_sizes"]
    fig = Figure(figsize=(9.6, 3.8), dpi=100)
    axes = fig.subplots(1, len(sizes), squeeze=False)[0]
    for ax, n in zip(axes, sizes):
        for s, sweep in results["quality"].items():
            rows = [sweep["rows"][f"{q:.2f}"][f"b{n}"]["minus_grpo"] for q in QUALITIES]
            ax.errorbar(QUALITIES, [x["value"] for x in rows], yerr=[gs.SIGMAS * x["se"] for x in rows], marker="o",
                        markersize=3, capsize=3, label=f"scale_rewards: {s}")  # fmt: skip
        ax.axhline(0.0, linestyle="--", color="gray", linewidth=1)
        ax.set_title(f"B = {n} prompts: signed gain minus GRPO's", fontsize=9)
        ax.set_xlabel("verifier quality q (0: verdicts at random at the same rate)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("gain minus GRPO's (± 2 SE)")
    fig.suptitle("Walk verifier of quality q, E[z | valid] held fixed (pooled primary)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def plot_batch(path: Path, results: dict) -> None:
    """The signed expected gain of GRPO, the walk arm, its q = 0 arm and `C_zoom` against the batch size, from the
    pooled primary's point statistics (`gs.expected_gain`), at the recipe's scaling."""
    from matplotlib.figure import Figure

    s = results["scaling"]
    sizes = np.geomspace(1, 4 * RECIPE_PROMPTS, 200)
    fig = Figure(figsize=(6.4, 3.8), dpi=100)
    ax = fig.subplots()
    for name, label in ((REFERENCE, "grpo"), (WALK, "mapo_walk"), (Q0, "walk verdicts at random (q = 0)"),
                        ("C_zoom", "C_zoom")):  # fmt: skip
        stats = results["prop2"]["a"][s]["point"][name]
        ax.plot(sizes, [gs.expected_gain(stats, n) for n in sizes], label=label)
    for n in results["batch_sizes"]:
        ax.axvline(n, linestyle=":", color="gray", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("prompts a batch (B)")
    ax.set_ylabel("signed expected gain towards grad Q*")
    ax.set_title(f"Signed expected gain against the batch size (scale_rewards: {s}, point estimates)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def contrast_rows(results: dict) -> list[list]:
    rows = []
    for s, a in results["prop2"]["a"].items():
        for n in results["batch_sizes"]:
            for key, words in CONTRASTS.items():
                d = a[f"b{n}"][key]
                cross = a["crossing"].get(key)
                reading = f"Prop. 2 (a) {a[f'b{n}']['verdict']}" if key == "information" else significance(d)
                rows.append([f"`{s}`", n, words, pm(d), fmt(d["z"], 1), interval((d["lo"], d["hi"])),
                             "" if cross is None else crossing_words(cross), reading])  # fmt: skip
    return rows


def run_rows(results: dict, replications: list[dict]) -> list[list]:
    s = results["scaling"]
    sizes = results["batch_sizes"]
    pooled = {
        "checkpoint": results["checkpoint"], "seed": " + ".join(str(x) for x in results["seeds"]), "label": "pooled",
        "prompts": results["prompts"], "rollouts": results["rollouts"], "rate": results["rate"],
        "undefined_replicates": results["undefined_replicates"], "measurable": True, "prop2a": results["prop2"]["a"],
    }  # fmt: skip
    rows = []
    for x in [pooled, *results["runs"], *replications]:
        label = x.get("label") or (prompts_of(x) if "prompt_range" in x else "")
        if not x["measurable"]:
            rows.append([x["checkpoint"], x["seed"], label, x["rollouts"], f"{x['rate']:.1%}", x["undefined_replicates"],
                         *["not measurable"] * (2 * len(sizes) + 1)])  # fmt: skip
            continue
        a = x["prop2a"][s]
        rows.append([
            x["checkpoint"], x["seed"], label, x["rollouts"], f"{x['rate']:.1%}", x["undefined_replicates"],
            *[pm(a[f"b{n}"]["information"]) for n in sizes], *[pm(a[f"b{n}"]["density"]) for n in sizes],
            " / ".join(a[f"b{n}"]["verdict"] for n in sizes),
        ])  # fmt: skip
    return rows


def write_report(report: Path, results: dict, replications: list[dict], setup: dict) -> Path:
    """The report (`report`), its PNGs and results.json (in `report` without its suffix), from the analysis; refuses
    to write a headline with a number results.json does not hold (`headline_check`)."""
    folder = report.with_suffix("")
    shows = what_it_shows(results, replications, setup.get("gate"))
    record = results | {"replications": replications, "setup": setup}
    unbacked = unbacked_numbers("\n".join(shows), json.loads(json.dumps(record, default=str)))
    if unbacked:
        raise AssertionError(f"the headline states numbers results.json does not hold: {unbacked}")
    for stale in folder.glob("*.png"):
        stale.unlink()
    plot_quality(folder / "quality.png", results)
    plot_batch(folder / "gain_vs_batch.png", results)
    payload = json.dumps(record, indent=1, sort_keys=True, default=str)
    (folder / "results.json").write_text(payload + "\n", encoding="utf-8")
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    rel, scaling, sizes = folder.name, results["scaling"], results["batch_sizes"]
    p1 = results["prop1"]
    power = results["power"]
    chain_rows = [
        [f"`{k}`", STEPS[k], *[pm(v[x][f"b{n}"]) for x in DIRECTIONS for n in sizes]]
        for k, v in results["chain"].items()
    ]
    p1_rows = [
        [world, fmt(e["moments"]["rho"], 3), fmt(e["moments"]["mu"], 3), fmt(e["moments"]["predicted_ratio"], 3),
         f"{e['trace_ratio']:.3f} ± {e['trace_ratio_se']:.3f}", interval(e["trace_ratio_interval"], 3, signed=False),
         fmt(e["below_one_z"], 1), f"{fmt(e['prediction_z'], 1)} ({e['prediction']})",
         f"{e['per_rollout_ratio']:.3f} ± {e['per_rollout_ratio_se']:.3f}",
         sci(e["cross"]["grpo"]), sci(e["cross"][REINFORCE]), e["verdict"]]
        for world, e in p1.items()
    ]  # fmt: skip
    q_rows = [
        [f"{q:.2f}", *[f"{sci(r[f'b{n}']['gain'])} ± {sci(r[f'b{n}']['gain_se'])} ({pm(r[f'b{n}']['minus_grpo'])})"
                       for s in results["quality"] for n in sizes for r in [results["quality"][s]["rows"][f"{q:.2f}"]]]]
        for q in QUALITIES
    ]  # fmt: skip
    gate = setup.get("gate") or {}
    clip_rows = [
        [f"`{n}`", fmt(gate.get(ESTIMATORS[n]["semantic_score"], {}).get("walk_auc"), 2), fmt(c["z_valid"], 3),
         f"{c['z_minus_no_tool']:+.3f}", *[pm(c[f"b{b}"]["minus_grpo"]) for b in sizes]]
        for n, c in results["clip"].items()
    ]  # fmt: skip
    runs = results["runs"]
    b = results["prop2"]["b"]
    lines = [
        "# MAPO's gradient claims, measured on the trainer's own code",
        "",
        f"_Generated by `research/gradient_claims.py` on {setup['date']} from results `{digest}` "
        f'(`{rel}/results.json`); every section, "What it shows" included, is written from them, and every number of '
        '"What it shows" is checked against them: rerun it to regenerate._',
        "",
        *verdict_sections(CRITERIA, shows, setup["command"]),
        "",
        f"- Policies: the experiment world's SFT checkpoints under `{setup['start']}` (rounds of {setup['sft_steps']} "
        "steps of the tiny SFT recipe, each from the last, from the tiny Qwen2.5-VL; 768 px square images, region hints), "
        f"built once and cached, not timed below. Primary: `{results['checkpoint']}`.",
        f"- The pooled primary: {len(runs)} independent runs at `{results['checkpoint']}`, "
        + ", ".join(
            f"seed {r['seed']} on {prompts_of(r)} of the train split ({r['rollouts']:,} rollouts)" for r in runs
        )
        + f"; {results['rollouts']:,} rollouts in groups of {results['group']} ({results['prompts']:,} prompts), "
        f"{results['steps']:,} steps (assistant turns), sampled at the recipe's temperature through "
        "`MAPOTrainer._generate_and_score_completions` (TRL's tool loop, the real zoom-in tool), batches of "
        f"{results['batch_prompts']} prompts as the experiment's recipe trains. Each run's statistics are unbiased on "
        "their own; pooled by their prompts (`gs.pool`) they stay so, and the figures are formed from the pooled ones. "
        "Every arm is replayed on each run; `C_zoom`'s c and the q = 0 arm's rate are each run's own.",
        "- Score vectors: per step, the gradient of the trainer's loss term without its advantage (`loss_type: grpo`: "
        f"the mean over the rollout's trained tokens, tool responses masked), over all {setup['parameters']:,} trainable "
        "parameters; kept as their Gram matrix. A slow test checks them against autograd through the trainer's "
        "`compute_loss` with one-hot advantages.",
        "- References: grad E[Q*] and grad E[V] (V: well formed with a valid call) from unnormalised sequence scores "
        "(each rollout's score vectors times its trained-token count, so their mean is 0) with a leave-one-out baseline; "
        "the framing direction is grad Q* with grad E[V] projected out (coefficient "
        f"{results['projection']:.3f}, estimated from products of different prompts, pooled). The arms keep the "
        "trainer's own loss terms.",
        "- Noise: every squared norm and squared inner product is an unbiased U-statistic over different prompts "
        "(a prompt never pairs with itself or, in a bootstrap replicate, with its own repeat), so the reference's own "
        "noise inflates no denominator; the per-batch columns (batches with a gradient, cosines) are the experiment's "
        f"batches of {results['batch_prompts']}, each cosine against the reference on the other {results['folds'] - 1} "
        f"of {results['folds']} folds over the unbiased |grad J*|. Randomised controls are averaged over {PERMUTATIONS} "
        "draws through their mean products, which gives their expected figures exactly.",
        f"- B = {sizes[-1]}: arms marked (b) compute their advantages over the batch (HPO's normalisation, the centred "
        f"CLIP's centring); their figures at B = {sizes[-1]} keep the advantages of batches of {results['batch_prompts']}.",
        f"- Standard errors and intervals: {results['bootstrap']} stratified bootstrap replicates over prompts (within "
        "each run's folds) of the whole computation, the references included.",
        f"- Power: the first version's walk-minus-control difference was {power['first_version']['walk_minus_control']} "
        f"± {power['first_version']['se']} in batch cosine on {power['first_version']['prompts']} prompts; detecting it "
        f"with 80% power at the 2 SE bar needs {power['prompts_needed']:,} prompts, beyond any CPU budget. The pooled "
        f"primary takes {results['prompts']:,} (the score vectors of 640 prompts fill ~6 GB of memory, so each run "
        "is measured on its own) and states what it can detect.",
        f"- Time: {setup['minutes']:.1f} min wall on {setup['cores']} cores ("
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in setup["timings"].items())
        + f"), {setup['cpu_minutes']:.1f} min of CPU; the load average was {setup['load']:.1f} at the end"
        + (
            " (the machine was shared with other jobs, which inflates the wall time)."
            if setup["load"] > setup["cores"]
            else "."
        ),
        "- Recipe: `research/recipes/config_experiment.yaml`; each arm overrides only `advantage_estimator`, "
        f"`semantic_verifier`, `semantic_score`, `reward_funcs` (oracle) and `scale_rewards` (recipe: `{scaling}`).",
        "",
        "## Proposition 2 (a): information and density",
        "",
        "Signed expected gain towards grad Q* on the pooled primary, each contrast ± its paired SE, its size in SE, its "
        "percentile interval, and the batch size where its point estimate changes sign:",
        "",
        markdown_table(
            ["scaling", "B", "contrast", "value ± SE", "SE units", "interval", "changes sign", "reading"],
            contrast_rows(results),
        ),  # fmt: skip
        "",
        f"![gain against the batch size]({rel}/gain_vs_batch.png)",
        "",
        "## Runs",
        "",
        "The pooled primary, each of its runs alone, and the other checkpoints alone (recipe's scaling; undefined: "
        f"bootstrap replicates of {results['bootstrap']} without a measurable |grad J*|^2):",
        "",
        markdown_table(
            [
                "checkpoint",
                "seed",
                "prompts",
                "rollouts",
                "Q* rate",
                "undefined",
                *[f"information, B = {n}" for n in sizes],
                *[f"density, B = {n}" for n in sizes],
                "Prop. 2 (a), B = " + " / ".join(str(n) for n in sizes),
            ],
            run_rows(results, replications),
        ),  # fmt: skip
        "",
        "## Proposition 2 (b)",
        "",
        f"Noise over projected signal (one prompt; a batch of B divides it by B): `grpo` {fmt(b['grpo'], 1)}, "
        f"`mapo_walk` {fmt(b['walk'], 1)}; log ratio {fmt_signed(b['log_ratio'], 3)}, interval "
        f"{interval(b['interval'], 3)}. The constant bonuses, which say nothing of which crop framed the target: "
        + ", ".join(f"`{arm}` {fmt(v, 1)}" for arm, v in constant_noise(results).items())
        + ". It carries the information of Proposition 2 (a)'s walk - GRPO on a reciprocal "
        "scale (1 / gain less the squared cosine of E g with grad J*), where a replicate with no measurable signal sends "
        "it to infinity: an SE of the raw ratio measures those replicates, not the arms.",
        "",
        "## The walk arm, decomposed",
        "",
        f"Differences of signed expected gain at the recipe's scaling (`{scaling}`), each ± its paired SE; towards grad Q* "
        f"and towards the framing direction. c = {results['walk_rate']:.3f} (the walk arm's mean z on valid calls); "
        f"{results['zoom_share']:.0%} of valid calls are zooms (at most a quarter of the image).",
        "",
        markdown_table(
            ["step", "what it adds", *[f"towards {x}, B = {n}" for x in ("grad Q*", "framing") for n in sizes]],
            chain_rows,
        ),  # fmt: skip
        "",
        f"## Every arm, `scale_rewards: {scaling}` (the recipe's)",
        "",
        "Randomised controls' per-batch columns are not shown: their figures come from mean products.",
        "",
        estimator_table(results, scaling),
        "",
        "## Every arm, `scale_rewards: none` (A = r - mean of the group)",
        "",
        estimator_table(results, "none"),
        "",
        "## Proposition 1",
        "",
        f"The same rollouts read by the recipe's reader, and by a reader of mixed difficulty (even-numbered prompts "
        f"answered right with probability {EASY_P} wherever the policy looked). The variance trace of `grpo` "
        "(`scale_rewards: none`) over REINFORCE's, split exactly from the Gram matrix into the per-rollout terms "
        "A_i^2 |S_i|^2 and the rest (products of different rollouts, and the mean's), pooled over the runs:",
        "",
        markdown_table(
            [
                "world",
                "rho",
                "mu",
                "predicted ratio",
                "trace ratio ± SE",
                "interval",
                "below 1 (SE)",
                "from the prediction (SE)",
                "per-rollout ratio ± SE",
                "cross part, grpo",
                "cross part, REINFORCE",
                "verdict",
            ],
            p1_rows,
        ),  # fmt: skip
        "",
        "## Verifier quality",
        "",
        "Among valid zoom calls, each verdict kept with probability q and otherwise drawn afresh at the verdicts' own "
        f"rate, so E[z | valid] is the same at every q ({PERMUTATIONS} draws, shared by every q). Signed expected gain "
        "towards grad Q* ± SE, and (minus GRPO's ± SE); q = 1 minus q = 0 is the information contrast above:",
        "",
        markdown_table(["q", *[f"`{s}`, B = {n}" for s in results["quality"] for n in sizes]], q_rows),
        "",
        f"![quality sweep]({rel}/quality.png)",
        "",
        "## The tiny CLIP",
        "",
        "The verifier gate's walk AUC (`evaluation.verifier_check` on held-out gold crops) beside z_t's mean on valid "
        "calls minus the value of a rollout without calls: a positive gap is a bonus for calling, whatever the crop; "
        "centring on the batch removes it.",
        "",
        markdown_table(
            [
                "arm",
                "walk AUC (uncentred score)",
                "E[z | valid]",
                "minus no_tool_semantic",
                *[f"minus grpo's, B = {n}" for n in sizes],
            ],
            clip_rows,
        ),  # fmt: skip
        "",
    ]
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
