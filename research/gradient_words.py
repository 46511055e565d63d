"""The words of `make experiment`'s report: the criteria stated before the numbers, every figure's format, the findings
("What it shows") and the summaries the README and docs/demo.md quote, each written from results.json."""

from __future__ import annotations

import math
from collections.abc import Sequence

from research import gradient_stats as gs
from research.gradient_arms import CONSTANT_BONUSES, REFERENCE, REINFORCE, WALK
from research.gradient_products import gain_key
from research.gradient_verdicts import CHECKPOINT_RATE, RECIPE_PROMPTS, RHO_MIN
from research.report import markdown_table

COVERAGE = math.erf(gs.SIGMAS / math.sqrt(2))
CRITERIA = f"""Stated before the numbers, in the code that judges them (`research.gradient_stats`); this third version's rules
were fixed after reading the second version's results (issue 50) and before this run. Every figure is measured on the
same rollouts for every arm, so differences are paired; standard errors (SE) come from a stratified bootstrap over
prompts of the whole pipeline (the references included), each printed beside the percentile interval of the same
replicates (coverage {COVERAGE:.1%}, a normal's within {gs.SIGMAS:g} SE); a difference counts when it exceeds
{gs.SIGMAS:g} SE. Each verdict is three-valued: **holds**, **fails** (the opposite is measured), or **inconclusive**
(then the smallest difference the run detects with 80% power, {gs.SIGMAS + gs.POWER_Z:.2f} SE, is given).

The primary metric is the **signed expected gain** of one normalised SGD step at its best size on a batch of B
prompts, sign(<grad J*, E g>) <grad J*, E g>^2 / (|grad J*|^2 E|g_B|^2), J* = E[Q*] (Q*: a well-formed rollout whose
valid zoom call framed the target). Every term is an unbiased U-statistic over different prompts (`gs.moments`), and
E|g_B|^2 = |E g|^2 + tr Cov_1 / B (tr Cov_1: one prompt's gradient noise), so the same statistics give the gain at
B = 2 (the experiment recipe's batch) and at B = {RECIPE_PROMPTS} (the paper's recipe, `recipes/mapo_paper.yaml`: 8
rollouts a device x 4 accumulation steps x 8 GPUs over G = 8; this world's groups stay G = 4). At B = 2 the noise
term dominates, so the gain is nearly a signal-to-noise ratio; the larger B, the more the direction of E g counts. The
sign of the pair sum <grad J*, E g> says whether the step climbs J* at all, which the square alone loses. The primary
measurement pools independent runs at the primary checkpoint (new seed, prompts not used before) by their prompts.

- **Proposition 1** (a group baseline removes the prompt-level part of the variance), in the recipe's world and in a
  world of mixed difficulty: the variance trace of batch gradients under `grpo` with `scale_rewards: none`
  (A = r - r-bar) over that under REINFORCE (A = r) is below 1 by more than {gs.SIGMAS:g} SE; fails above 1 by as
  much; inconclusive in a world whose intra-group correlation rho is below {RHO_MIN} (the (1 - rho) factor cannot
  show at rho near 0). Beside it, in both worlds, the ratio's distance in SE from the reward-level prediction
  (1 - 1/G)(1 - rho) sigma^2 / (sigma^2 + mu^2): the prediction matches within {gs.SIGMAS:g} SE and misses beyond.
- **Proposition 2 (a)** (MAPO's gradient serves J* better, and because the crop framed the target), at each B, at the
  recipe's `semantic_beta` and `scale_rewards` and the 0.7 reader. Its primary figures split the walk arm's
  difference from its zoom control `C_zoom` (z = c on every valid zoom call, c the walk arm's mean z on valid calls) in
  two: the **information** contrast, `mapo_walk` minus the same verifier with its verdicts on valid zoom calls drawn
  at random at their own rate (q = 0: the same density of bonus, no word on which crop framed the target), and the
  **density** contrast, that q = 0 arm minus `C_zoom` (a 0/1 bonus at the walk rate against a constant c on every
  zoom). Holds when the information is above {gs.SIGMAS:g} SE, `mapo_walk` beats GRPO by more than {gs.SIGMAS:g} SE
  and its own signed gain is positive; fails when the information is below -{gs.SIGMAS:g} SE or `mapo_walk` is below
  GRPO by more than {gs.SIGMAS:g} SE. The density contrast is no part of MAPO's claim: it is reported with its SE.
- **Proposition 2 (b)** (lower variance, made scale-free): log of GRPO's noise over projected signal,
  tr Cov_1 / (sign(<grad J*, E g>) <grad J*, E g>^2 / |grad J*|^2), over `mapo_walk`'s, at the recipe's scaling; free
  of B (a batch divides both by B). A replicate where an arm's step does not climb J* has infinite noise over signal,
  so the verdict reads the percentile interval, not an SE: holds when it lies above 0, fails when below.
- Proposition 2's verdicts are inconclusive when the pooled primary's sampled Q* rate lies outside
  {CHECKPOINT_RATE[0]:.2f} - {CHECKPOINT_RATE[1]:.2f}: then most groups of 4 tie and the question has no answer."""

NAMES = {
    "grpo": "GRPO on the 0.7 reader",
    "mapo_walk": "MAPO, walk verifier (z = 1 when the crop frames the target)",
    "C_zoom": "control: z = c on valid zoom calls",
    "C_valid": "control: z = c on every valid call",
    "C_all": "control: R_sem permuted within the group",
    "C_noise": "control: z drawn at the walk rate, blind to the calls",
    "mapo_exact": "MAPO, talk-and-walk verifier (the label must name the target too)",
    "mapo_clip_cosine": "MAPO, tiny CLIP, cosine",
    "mapo_clip_contrastive": "MAPO, tiny CLIP, contrastive",
    "mapo_clip_cosine_centred": "MAPO, tiny CLIP, cosine, centred on the batch",
    "mapo_clip_contrastive_centred": "MAPO, tiny CLIP, contrastive, centred on the batch",
    "hpo": "HPO",
    "mapo+hpo": "MAPO (walk) + HPO",
    "oracle": "GRPO on Q* itself",
    REINFORCE: "REINFORCE, A = r (reader), no baseline",
}
STEPS = {
    "mapo_walk - C_zoom": "which zoom framed the target, and the bonus's density",
    "C_zoom - C_valid": "a bonus on zooms rather than on every valid call",
    "C_valid - C_all": "a bonus on valid calls rather than R_sem at random within the group",
    "C_all - grpo": "R_sem's values added at random within the group",
}
CONTRASTS = {
    "information": "`mapo_walk` - q = 0 (framing information)",
    "density": "q = 0 - `C_zoom` (the bonus's density)",
    "walk_minus_zoom": "`mapo_walk` - `C_zoom` (their sum)",
    "walk_minus_grpo": "`mapo_walk` - `grpo`",
}
BATCH_DEPENDENT = ("hpo", "mapo+hpo", "mapo_clip_cosine_centred", "mapo_clip_contrastive_centred")


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}" if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def sci(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.3g}"


def interval(pair: Sequence[float], digits: int = 5, signed: bool = True) -> str:
    """A percentile interval, [lo, hi]."""
    if not signed:
        return f"[{fmt(pair[0], digits)}, {fmt(pair[1], digits)}]"
    return f"[{fmt_signed(pair[0], digits)}, {fmt_signed(pair[1], digits)}]"


def fmt_signed(value: float, digits: int) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:+.{digits}f}" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")


def pm(d: dict, digits: int = 5) -> str:
    """A difference ± its SE; n/a where the reference had no measurable norm."""
    if math.isnan(d["value"]):
        return "n/a (|grad J*|^2 not measurable)"
    return f"{d['value']:+.{digits}f} ± {d['se']:.{digits}f}"


def pm_z(d: dict, digits: int = 5) -> str:
    """A difference ± its SE and its size in SE."""
    if math.isnan(d["value"]) or math.isnan(d["z"]):
        return pm(d, digits)
    return f"{pm(d, digits)} ({d['z']:+.1f} SE)"


def pm_full(d: dict, digits: int = 5) -> str:
    """A difference ± its SE, its size in SE and its percentile interval."""
    if math.isnan(d["value"]) or math.isnan(d["z"]):
        return pm(d, digits)
    return f"{pm(d, digits)} ({d['z']:+.1f} SE; interval {interval((d['lo'], d['hi']), digits)})"


def batches_with_words(results: dict) -> dict[int, str]:
    bp = results["batch_prompts"]
    return {b: "the experiment's batch" if b == bp else "the paper recipe's batch" for b in results["batch_sizes"]}


def estimator_table(results: dict, scaling: str) -> str:
    small, large = results["batch_sizes"][0], results["batch_sizes"][-1]
    rows = []
    for key, e in results["table"].items():
        name, scale = key.split("|")
        if scale != scaling:
            continue
        q, f = e["q"], e["framing"]
        descriptive = ["(mean products)"] * 3 if e["randomised"] else [
            fmt(q["with_gradient"], 2), fmt(q["cosine_given_gradient"], 4), fmt(q["cosine"], 4)]  # fmt: skip

        def cells(x, b):
            g = gain_key(b)
            minus = pm(x[f"minus_grpo_b{b}"]) if f"minus_grpo_b{b}" in x else "(reference)"
            return [f"{sci(x[g])} ± {sci(x[f'{g}_se'])}", minus]

        rows.append([f"`{name}`" + (" (b)" if name in BATCH_DEPENDENT else ""), NAMES.get(name, name),
                     *cells(q, small), *cells(q, large), *cells(f, large), *descriptive])  # fmt: skip
    header = [
        "arm", "what", f"gain (Q*), B = {small}", "minus grpo's", f"gain (Q*), B = {large}", "minus grpo's",
        f"gain (framing), B = {large}", "minus grpo's", "batches with a gradient", "cosine given one", "batch cosine",
    ]  # fmt: skip
    return markdown_table(header, rows)


def significance(d: dict) -> str:
    """Whether a difference clears the bar, in words."""
    if d["value"] > gs.SIGMAS * d["se"]:
        return f"above 0 by more than {gs.SIGMAS:g} SE"
    if d["value"] < -gs.SIGMAS * d["se"]:
        return f"below 0 by more than {gs.SIGMAS:g} SE"
    return f"within {gs.SIGMAS:g} SE of 0"


def crossing_words(value: float) -> str:
    return f"at B = {value:.1f} prompts" if math.isfinite(value) else "at no batch size"


def prompts_of(run: dict) -> str:
    return f"prompts {run['prompt_range'][0]} to {run['prompt_range'][1]}"


def p1_verdict(e: dict) -> str:
    """Proposition 1's verdict in one world with its percentile interval: the 2 SE rule can hold while the interval,
    which the ratio's skew stretches upwards, still contains 1."""
    lo, hi = e["trace_ratio_interval"]
    span = interval(e["trace_ratio_interval"], 3, signed=False)
    if e["verdict"] != gs.INCONCLUSIVE and lo <= 1.0 <= hi:
        return f"{e['verdict']} by the {gs.SIGMAS:g} SE rule, though its percentile interval {span} contains 1"
    return f"{e['verdict']}, percentile interval {span}"


def constant_noise(results: dict) -> dict[str, float]:
    """Noise over projected signal of the constant bonuses (`CONSTANT_BONUSES`) at the recipe's scaling."""
    s = results["scaling"]
    return {arm: results["table"][f"{arm}|{s}"]["q"]["noise_over_signal"] for arm in CONSTANT_BONUSES}


def prop2b_words(results: dict) -> str:
    """Proposition 2 (b)'s verdict with its interval and the arms' noise over signal; a lower figure than the walk's
    for a constant bonus says the walk's advantage over GRPO needs no information on which crop framed the target."""
    b = results["prop2"]["b"]
    constants = constant_noise(results)
    figures = ", ".join(f"`{arm}` {fmt(v, 1)}" for arm, v in constants.items())
    figures += f", `{WALK}` {fmt(b['walk'], 1)}, `{REFERENCE}` {fmt(b['grpo'], 1)}"
    words = f"{b['verdict']} (interval {interval(b['interval'], 3)})"
    if min(constants.values()) <= b["walk"]:
        return (
            f"{words}, but the information-free constant bonuses do as well or better on point estimates (noise "
            f"over signal: {figures})"
        )
    return f"{words} (noise over signal: {figures})"


def what_it_shows(results: dict, replications: list[dict], gate: dict | None) -> list[str]:
    """The report's findings, each worded from the figures and verdicts of results.json (`headline_check` holds every
    number of them to it): Proposition 2 (a)'s contrasts at each batch size first, then Proposition 1 in both worlds."""
    p1, p2, chain = results["prop1"], results["prop2"], results["chain"]
    scaling, sizes = results["scaling"], results["batch_sizes"]
    a, b = p2["a"][scaling], p2["b"]
    seeds = " and ".join(str(s) for s in results["seeds"])
    lines = []
    for n, words in batches_with_words(results).items():
        x = a[f"b{n}"]
        lines.append(
            f"- **Proposition 2 (a), B = {n} ({words}), `scale_rewards: {scaling}`: {x['verdict']}.** On the pooled "
            f"primary (`{results['checkpoint']}`, seeds {seeds}, {results['prompts']:,} prompts), signed expected gain "
            f"towards grad Q*: the walk verdicts' framing information (`mapo_walk` - q = 0) is "
            f"{pm_full(x['information'])}; the bonus's density (q = 0 - `C_zoom`) is {pm_full(x['density'])}; "
            f"`mapo_walk` - GRPO is {pm_full(x['walk_minus_grpo'])}; `mapo_walk`'s own gain is {fmt_signed(x['walk_gain'], 5)}"
            + (
                f"; the run detects an information contrast of {x['detectable']:.5f} (80% power)."
                if x["verdict"] == gs.INCONCLUSIVE
                else "."
            )
        )
    cross = a["crossing"]
    lines.append(
        "- Where the contrasts change sign with the batch size (point estimates): the information "
        f"{crossing_words(cross['information'])}, the density {crossing_words(cross['density'])}, `mapo_walk` - GRPO "
        f"{crossing_words(cross['walk_minus_grpo'])}."
    )
    if "none" in p2["a"] and scaling != "none":
        nn = p2["a"]["none"]
        lines.append(
            "- Under `scale_rewards: none` (A = r - r-bar), Proposition 2 (a) reads "
            + " and ".join(f"{nn[f'b{n}']['verdict']} at B = {n}" for n in sizes)
            + ": the information is "
            + " and ".join(pm_z(nn[f"b{n}"]["information"]) for n in sizes)
            + ", the density "
            + " and ".join(pm_z(nn[f"b{n}"]["density"]) for n in sizes)
            + ", `mapo_walk` - `C_zoom` "
            + " and ".join(pm(nn[f"b{n}"]["walk_minus_zoom"]) for n in sizes)
            + "."
        )
    for world, words in (("mixed", "the world of mixed difficulty"), ("recipe", "the recipe's world")):
        e = p1[world]
        rho = e["moments"]["rho"]
        rule = "" if rho >= RHO_MIN else f" (below {RHO_MIN:g}: by the rule fixed before the data, no verdict)"
        lines.append(
            f"- **Proposition 1, {words}: {p1_verdict(e)}.** rho {rho:.3f}{rule}; the group baseline's gradient "
            f"variance is {e['trace_ratio']:.3f} ± {e['trace_ratio_se']:.3f} of REINFORCE's, below 1 by "
            f"{e['below_one_z']:.1f} SE; the reward-level "
            f"prediction is {e['moments']['predicted_ratio']:.3f}, "
            f"and the measured ratio lies {e['prediction_z']:+.1f} SE from it: the prediction {e['prediction']}."
        )
    lines.append(
        f"- **Proposition 2 (b), any B, `scale_rewards: {scaling}`: {prop2b_words(results)}.** log(GRPO's noise over "
        f"projected signal / `mapo_walk`'s) is {fmt_signed(b['log_ratio'], 3)}; of "
        f"{results['bootstrap']} replicates, {b['infinite']} put one arm's step at no measurable climb of J* (an infinite "
        f"ratio) and {b['undefined']} both (undefined). On a log scale because such replicates make an SE of the "
        "ratio meaningless."
    )
    lo, hi = CHECKPOINT_RATE
    inside = "inside" if lo <= results["rate"] <= hi else "outside"
    per_run = "; ".join(f"seed {r['seed']} ({prompts_of(r)}) {r['undefined_replicates']}" for r in results["runs"])
    lines.append(
        f"- The pooled primary frames the target (Q*) in {results['rate']:.1%} of sampled rollouts ({inside} "
        f"{lo:.2f} - {hi:.2f}); {results['valid_rate']:.1%} are well formed with a valid call (V). Bootstrap "
        f"replicates without a measurable |grad J*|^2 (left out of every SE), of {results['bootstrap']}: pooled "
        f"{results['undefined_replicates']}; {per_run}."
    )
    for n in sizes:
        significant = [
            f"`{k}` ({STEPS[k]}) {pm(v['q'][f'b{n}'])}" for k, v in chain.items()
            if abs(v["q"][f"b{n}"]["value"]) > gs.SIGMAS * v["q"][f"b{n}"]["se"]
        ]  # fmt: skip
        lines.append(
            f"- The walk arm's difference from GRPO, step by step, at B = {n}: "
            + (
                "; ".join(significant) + f" exceed {gs.SIGMAS:g} SE"
                if significant
                else f"no step exceeds {gs.SIGMAS:g} SE"
            )
            + (", the others do not." if significant else ".")
        )
    for name, c in results["clip"].items():
        parts = [
            f"{pm(c[f'b{n}']['minus_grpo'])} at B = {n} ({significance(c[f'b{n}']['minus_grpo'])})" for n in sizes
        ]
        line = (
            f"- `{name}`: E[z | valid] - no_tool_semantic = {c['z_minus_no_tool']:+.3f}; its signed gain minus GRPO's is "
            + " and ".join(parts)
        )
        if "minus_plain" in c[f"b{sizes[0]}"]:
            line += "; minus the uncentred arm's " + " and ".join(
                f"{pm(c[f'b{n}']['minus_plain'])} at B = {n}" for n in sizes
            )
        lines.append(line + ".")
    if replications:
        n = sizes[-1]
        measurable = [x for x in replications if x["measurable"]]
        unmeasured = [x for x in replications if not x["measurable"]]
        parts = []
        if measurable:
            parts.append(
                f"Proposition 2 (a) at B = {n} reads "
                + "; ".join(
                    f"{x['checkpoint']} (Q* {x['rate']:.1%}) {x['prop2a'][scaling][f'b{n}']['verdict']}, information "
                    f"{pm(x['prop2a'][scaling][f'b{n}']['information'])}, {x['undefined_replicates']} of "
                    f"{results['bootstrap']} replicates undefined"
                    for x in measurable
                )
            )
        if unmeasured:
            parts.append(
                "not measurable (|grad J*|^2 <= 0 on the sample itself, so no figure of it is defined): "
                + ", ".join(f"{x['checkpoint']} (Q* {x['rate']:.1%})" for x in unmeasured)
            )
        lines.append(f"- Other checkpoints, each alone at seed {replications[0]['seed']}: " + "; ".join(parts) + ".")
    if gate:
        lines.append(
            "- The tiny CLIP's walk AUC (a label on a crop that frames its target against a crop of the same image that "
            "does not): " + ", ".join(f"{k} {v['walk_auc']:.2f}" for k, v in gate.items()) + "."
        )
    return lines


def summary(results: dict) -> str:
    """The verdicts in one paragraph with their qualifiers (world, batch size, scaling, SE), from results.json: what
    the README and docs/demo.md quote (a test holds them to it)."""
    s = results["scaling"]
    a, p1, b = results["prop2"]["a"][s], results["prop1"], results["prop2"]["b"]

    def world(e: dict) -> str:
        return (
            f"rho {e['moments']['rho']:.3f}: the group baseline's variance is {e['trace_ratio']:.3f} ± "
            f"{e['trace_ratio_se']:.3f} of REINFORCE's, {e['below_one_z']:.1f} SE below 1 and {e['prediction_z']:+.1f} "
            f"SE from its prediction {e['moments']['predicted_ratio']:.3f}"
        )

    def at(n: int) -> str:
        x = a[f"b{n}"]
        return (
            f"{x['verdict']} at B = {n} (the walk verdicts' framing information {pm_z(x['information'])}, the bonus's "
            f"density {pm_z(x['density'])}, the walk arm minus GRPO {pm_z(x['walk_minus_grpo'])})"
        )

    mixed, recipe = p1["mixed"], p1["recipe"]
    return (
        f"Proposition 1, in a world of mixed difficulty: {p1_verdict(mixed)} ({world(mixed)}); in the recipe's own "
        f"world: {p1_verdict(recipe)} ({world(recipe)}). Proposition 2 (a), the signed expected gain towards Q* under "
        f"`scale_rewards: {s}` on {results['prompts']:,} prompts, is "
        + " and ".join(at(n) for n in results["batch_sizes"])
        + f". Proposition 2 (b), the log of GRPO's noise over signal over the walk arm's "
        f"({fmt_signed(b['log_ratio'], 3)}): {prop2b_words(results)}."
    )


def short_summary(results: dict) -> str:
    """The verdicts in one sentence, each with its qualifier (world, batch size, scaling, SE), for the README; the
    figures behind them are `summary`'s (docs/demo.md, the report)."""
    s = results["scaling"]
    a, p1 = results["prop2"]["a"][s], results["prop1"]
    mixed, recipe = p1["mixed"], p1["recipe"]
    sizes = results["batch_sizes"]
    verdicts = {a[f"b{n}"]["verdict"] for n in sizes}
    if len(verdicts) == 1:  # one verdict at every batch size: said once, for the README's word limit
        gains = (
            f"{verdicts.pop()} at "
            + " and ".join(f"B = {n}" for n in sizes)
            + " (framing information "
            + " and ".join(f"{a[f'b{n}']['information']['z']:+.1f} SE" for n in sizes)
            + ")"
        )
    else:
        gains = " and ".join(
            f"{a[f'b{n}']['verdict']} at B = {n} (framing information {a[f'b{n}']['information']['z']:+.1f} SE)"
            for n in sizes
        )
    return (
        f"Proposition 1, in a world of mixed difficulty: {p1_verdict(mixed)}; in the recipe's own world: "
        f"{recipe['verdict']}. Proposition 2 (a), under `scale_rewards: {s}` on {results['prompts']:,} prompts, is "
        f"{gains}. Proposition 2 (b) {prop2b_words(results)}."
    )
