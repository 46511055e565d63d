"""The verdicts of `make experiment` from the measured arms, by the rules stated before the numbers: Proposition 1's
variance ratio in the recipe's world and in a world of mixed difficulty (`proposition_1`), Proposition 2 (a)'s
contrasts at each batch size (`prop2a`), 2 (b)'s noise over signal (`prop2b`), on the runs pooled by their prompts
(`analyse`) and on each other checkpoint alone (`analyse_replication`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from research import gradient_stats as gs
from research.gradient_arms import (
    CHAIN,
    CLIP_ARMS,
    Q0,
    QUALITIES,
    REFERENCE,
    REINFORCE,
    WALK,
    folds_of,
    primary_run,
    quality_arm,
    walk_rate,
    world_arms,
)
from research.gradient_products import DIRECTIONS, Directions, Measured, Run, gain_key, measure_arms
from research.gradient_rollouts import Rollouts
from research.rewards import READER_HIT_P, READER_MISS_P, reader_outcome

# Prompts per optimizer step of the paper's recipe (recipes/mapo_paper.yaml on the 8-GPU accelerate configs): 8 rollouts
# a device x 4 accumulation steps x 8 processes, over G = 8 rollouts a prompt. The gain is reported there too.
RECIPE_PROMPTS = 32
# Proposition 1's world of mixed difficulty: the same rollouts, read by a reader that answers the even-numbered
# prompts right with EASY_P whatever the policy looked at (the answer is legible without zooming) and the others
# as the recipe's reader does.
EASY_P = 0.9
RHO_MIN = 0.3  # Proposition 1's verdict needs this intra-group correlation: at rho near 0, (1 - rho) predicts 1
CHECKPOINT_RATE = (
    0.10,
    0.90,
)  # the primary checkpoint's sampled Q* rate must lie here for the question to have an answer
# The first version of this measurement (2026-12-02, results 0ea6b987bf75, 256 prompts): the walk arm's gain over its
# shuffled control in batch cosine and that difference's bootstrap SE, the power calculation's input.
FIRST_VERSION = {"prompts": 256, "walk_minus_control": 0.0035, "se": 0.0101}


def proposition_1(runs: Sequence[tuple[Rollouts, np.ndarray]], group: int, bp: int, bootstrap: int, seed: int):
    """Proposition 1 in the recipe's world and in the world of mixed difficulty (`EASY_P`), on the runs pooled by
    their prompts: the variance trace of the group baseline (A = r - r-bar) over REINFORCE's (A = r), each split into
    per-rollout and cross-rollout parts; its SE and percentile interval; its distance from 1 and from the reward-level
    prediction in SE. `runs`: each run's rollouts and prompts' folds."""
    shares = [len(r.rollout_prompt) // group for r, _ in runs]
    out = {}
    for world in ("recipe", "mixed"):
        outcomes, parts = [], []
        for r, _ in runs:
            reader = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P))
            easy = r.rollout_prompt % 2 == 0
            outcome = reader if world == "recipe" else np.where(easy, r.well_formed * (r.draws < EASY_P), reader)
            gram = r.rollout_gram()
            outcomes.append(outcome)
            parts.append({
                arm: gs.rollout_split(coef, gram, group)
                for arm, coef in (("grpo", gs.group_advantages(outcome, group)), (REINFORCE, outcome))
            })  # fmt: skip

        def split(draws, parts=parts):
            """Each arm's (trace, per-rollout, cross) pooled over the runs."""
            per_run = [
                {
                    arm: np.asarray(gs.trace_split(own, self_part, draw, bp, group))
                    for arm, (own, self_part) in p.items()
                }
                for p, draw in zip(parts, draws)
            ]
            return gs.pool(per_run, shares)

        point = split([gs.Draw.of(fold_of) for _, fold_of in runs])
        rngs = [np.random.default_rng([seed, 3, k]) for k in range(len(runs))]
        reps = [split([gs.Draw.of(fold_of, rng) for (_, fold_of), rng in zip(runs, rngs)]) for _ in range(bootstrap)]

        def ratio(figs, i):
            return float(figs["grpo"][i] / figs[REINFORCE][i]) if figs[REINFORCE][i] else math.nan

        moments = gs.reward_moments(np.concatenate(outcomes), group)
        entry = {"moments": vars(moments) | {"predicted_ratio": moments.predicted_ratio}}
        for i, part in enumerate(("trace", "per_rollout", "cross")):
            entry[part] = {arm: float(point[arm][i]) for arm in point}
            entry[f"{part}_ratio"] = ratio(point, i)
            values = np.asarray([ratio(x, i) for x in reps])
            entry[f"{part}_ratio_se"] = float(np.nanstd(values, ddof=1))
            entry[f"{part}_ratio_interval"] = list(gs.percentile_interval(values))
        se = entry["trace_ratio_se"]
        entry["below_one_z"] = (1.0 - entry["trace_ratio"]) / se if se > 0 else math.nan
        entry["prediction_z"] = (entry["trace_ratio"] - moments.predicted_ratio) / se if se > 0 else math.nan
        entry["prediction"] = "matches" if abs(entry["prediction_z"]) <= gs.SIGMAS else "misses"
        entry["verdict"] = gs.better_verdict(gs.Difference(1.0 - entry["trace_ratio"], se))
        if not moments.rho >= RHO_MIN:  # the (1 - rho) factor cannot show
            entry["verdict"] = gs.INCONCLUSIVE
        out[world] = entry
    return out


def difference(d: gs.Difference) -> dict:
    """A `gs.Difference` for results.json, with its size in SE (`z`)."""
    return vars(d) | {"z": d.value / d.se if d.se > 0 else math.nan}


def prop2a(measured: Measured, scaling: str, batches: Sequence[int], rate: float) -> dict:
    """Proposition 2 (a)'s primary figures at each batch size (`gs.prop2a_verdict`): the framing information
    (`mapo_walk` minus the walk verifier at quality 0, `Q0`), the bonus's density (`Q0` minus `C_zoom`), their sum
    (walk minus `C_zoom`) and walk minus GRPO, signed expected gains towards grad Q*; and the batch size where each
    contrast's point estimates cross 0 (`gs.crossing`)."""
    walk, q0, zoom, grpo = (WALK, scaling), (Q0, scaling), ("C_zoom", scaling), (REFERENCE, scaling)
    out = {}
    for b in batches:
        g = gain_key(b)
        information, walk_grpo = measured.diff(walk, q0, "q", g), measured.diff(walk, grpo, "q", g)
        walk_gain = measured.value(walk, "q", g)
        verdict = gs.prop2a_verdict(information, walk_grpo, walk_gain)
        if not CHECKPOINT_RATE[0] <= rate <= CHECKPOINT_RATE[1]:
            verdict = gs.INCONCLUSIVE
        out[f"b{b}"] = {
            "information": difference(information),
            "density": difference(measured.diff(q0, zoom, "q", g)),
            "walk_minus_zoom": difference(measured.diff(walk, zoom, "q", g)),
            "walk_minus_grpo": difference(walk_grpo),
            "walk_gain": walk_gain,
            "verdict": verdict,
            "detectable": gs.detectable(information.se),
        }
    point = {key: measured.point[key]["q"] for key in (walk, q0, zoom, grpo)}
    out["point"] = {
        key[0]: {k: point[key][k] for k in ("inner", "along", "ref2", "mean2", "single2")} for key in point
    }
    out["crossing"] = {
        "information": gs.crossing(point[walk], point[q0]),
        "density": gs.crossing(point[q0], point[zoom]),
        "walk_minus_grpo": gs.crossing(point[walk], point[grpo]),
    }
    return out


def prop2b(measured: Measured, scaling: str) -> dict:
    """Proposition 2 (b) as log(GRPO's noise over signal / `mapo_walk`'s) (`gs.noise_over_signal`: free of the batch
    size), judged by its percentile interval (`gs.interval_verdict`): a replicate where an arm's step does not climb
    J* has infinite noise over signal, where an SE means nothing."""
    grpo, walk = (REFERENCE, scaling), (WALK, scaling)
    value = gs.log_ratio(
        measured.value(grpo, "q", "noise_over_signal"), measured.value(walk, "q", "noise_over_signal")
    )
    reps = gs.log_ratio(measured.reps(grpo, "q", "noise_over_signal"), measured.reps(walk, "q", "noise_over_signal"))
    lo, hi = gs.percentile_interval(reps)
    return {
        "log_ratio": value,
        "interval": [lo, hi],
        "undefined": int(np.isnan(reps).sum()),
        "infinite": int(np.isinf(reps).sum()),
        "grpo": measured.value(grpo, "q", "noise_over_signal"),
        "walk": measured.value(walk, "q", "noise_over_signal"),
        "verdict": gs.interval_verdict(lo, hi),
    }


def run_summary(m: dict, measured: Measured, batches: Sequence[int]) -> dict:
    """One run's identity, Q* rate, undefined replicates and Proposition 2 (a)'s figures on it alone."""
    r = m["rollouts"]
    rate = float(r.q_star.mean())
    out = {
        "checkpoint": m["checkpoint"],
        "seed": m["seed"],
        "first_prompt": m.get("first_prompt", 0),
        "prompts": len(r.rollout_prompt) // m["group"],
        "prompt_range": [m.get("first_prompt", 0), m.get("first_prompt", 0) + len(r.rollout_prompt) // m["group"] - 1],
        "rollouts": len(r.rollout_prompt),
        "rate": rate,
        "valid_rate": float(r.valid_call.mean()),
        "undefined_replicates": measured.undefined(),
        "measurable": measured.measurable(),
    }
    if out["measurable"]:
        scaling = m["recipe_scaling"]
        out["gain"] = {
            name: {f"b{b}": measured.value((name, scaling), "q", gain_key(b)) for b in batches}
            for name in (REFERENCE, WALK, Q0, "C_zoom")
        }
        out["prop2a"] = {scaling: prop2a(measured, scaling, batches, rate)}
    return out


def analyse(ms: Sequence[dict], folds: int, bootstrap: int, log=print) -> dict:
    """Every table and verdict of the report from the measurements at the primary checkpoint (`measure` with
    replays), pooled by their prompts: the primary run first, then the independent ones."""
    m = ms[0]
    group, bp, scaling = m["group"], m["batch_prompts"], m["recipe_scaling"]
    scalings = tuple(dict.fromkeys((scaling, "none")))
    batches = tuple(dict.fromkeys((bp, RECIPE_PROMPTS)))
    t = time.time()
    runs = [primary_run(x, folds) for x in ms]
    log(f"  products of {len(runs[0].arms)} arms on {len(runs)} runs: {time.time() - t:.0f} s")
    t = time.time()
    measured, per_run = measure_arms(runs, bp, group, bootstrap, m["seed"])
    log(f"  bootstrap: {time.time() - t:.0f} s")
    rollouts = [x["rollouts"] for x in ms]
    q_star = np.concatenate([r.q_star for r in rollouts])
    rate = float(q_star.mean())

    def entry(key) -> dict:
        out = {"randomised": runs[0].arms[key].randomised}
        for x in DIRECTIONS:
            e = dict(measured.point[key][x])
            for b in batches:
                g = gain_key(b)
                e[g], e[f"{g}_se"], e[f"{g}_interval"] = (
                    measured.value(key, x, g),
                    measured.se(key, x, g),
                    measured.interval(key, x, g),
                )
                if key[0] != REFERENCE and (REFERENCE, key[1]) in runs[0].arms:
                    e[f"minus_grpo_b{b}"] = difference(measured.diff(key, (REFERENCE, key[1]), x, g))
            e["noise_over_signal"] = measured.value(key, x, "noise_over_signal")
            out[x] = e
        return out

    table = {f"{name}|{s}": entry((name, s)) for name, s in runs[0].arms if not name.startswith("walk_q")}
    chain = {
        f"{a} - {b}": {
            x: {f"b{n}": difference(measured.diff((a, scaling), (b, scaling), x, gain_key(n))) for n in batches}
            for x in DIRECTIONS
        }
        for a, b in zip(CHAIN, CHAIN[1:])
    }
    quality = {}
    for s in scalings:
        rows = {}
        for q in QUALITIES:
            key = (quality_arm(q), s)
            rows[f"{q:.2f}"] = {
                f"b{b}": {
                    "gain": measured.value(key, "q", gain_key(b)),
                    "gain_se": measured.se(key, "q", gain_key(b)),
                    "minus_grpo": difference(measured.diff(key, (REFERENCE, s), "q", gain_key(b))),
                }
                for b in batches
            }
        ends = ((quality_arm(QUALITIES[-1]), s), (Q0, s))
        quality[s] = {
            "rows": rows,
            "one_minus_zero": {f"b{b}": difference(measured.diff(*ends, "q", gain_key(b))) for b in batches},
            "break_even": {
                f"b{b}": gs.break_even(
                    QUALITIES, [rows[f"{q:.2f}"][f"b{b}"]["minus_grpo"]["value"] for q in QUALITIES]
                )
                for b in batches
            },
        }
    empty = m["recipe"]["no_tool_semantic"]
    clip = {}
    for name in CLIP_ARMS:
        z = np.concatenate([x["replays"][(name, scaling)].z for x in ms])
        z = z[~np.isnan(z)]
        key = (name, scaling)
        clip[name] = {
            "z_valid": float(z.mean()) if z.size else math.nan,
            "z_minus_no_tool": float(z.mean()) - empty if z.size else math.nan,
        }
        for b in batches:
            g = gain_key(b)
            clip[name][f"b{b}"] = {
                "gain": measured.value(key, "q", g),
                "gain_se": measured.se(key, "q", g),
                "minus_grpo": difference(measured.diff(key, (REFERENCE, scaling), "q", g)),
            }
            if name.endswith("_centred"):
                plain = (name.removesuffix("_centred"), scaling)
                clip[name][f"b{b}"]["minus_plain"] = difference(measured.diff(key, plain, "q", g))
    walk = [v for r in rollouts for calls in r.walk for v in calls]
    zoom_calls = [z for r in rollouts for calls, zs in zip(r.walk, r.zoom) for v, z in zip(calls, zs) if v is not None]
    return {
        "checkpoint": m["checkpoint"],
        "seed": m["seed"],
        "seeds": [x["seed"] for x in ms],
        "runs": [run_summary(x, mx, batches) for x, mx in zip(ms, per_run)],
        "rate": rate,
        "valid_rate": float(np.concatenate([r.valid_call for r in rollouts]).mean()),
        "walk_rate": walk_rate([walk]),
        "zoom_share": float(np.mean(zoom_calls)) if zoom_calls else math.nan,
        "projection": measured.point["projection"],
        "undefined_replicates": measured.undefined(),
        "undefined_replicates_framing": measured.undefined("framing"),
        "rollouts": len(q_star),
        "steps": sum(len(r.step_rollout) for r in rollouts),
        "prompts": sum(run.d.prompts for run in runs),
        "folds": folds,
        "bootstrap": bootstrap,
        "group": group,
        "batch_prompts": bp,
        "batch_sizes": list(batches),
        "scaling": scaling,
        "criteria": {
            "sigmas": gs.SIGMAS,
            "coverage": math.erf(gs.SIGMAS / math.sqrt(2)),
            "rate_bounds": list(CHECKPOINT_RATE),
            "rho_min": RHO_MIN,
            "ratio_bar": 1.0,
            "qualities": list(QUALITIES),
            "power": 0.8,
            "power_z": gs.POWER_Z,
        },
        "table": table,
        "chain": chain,
        "prop1": proposition_1([(r, run.fold_of) for r, run in zip(rollouts, runs)], group, bp, bootstrap, m["seed"]),
        "prop2": {
            "a": {s: prop2a(measured, s, batches, rate) for s in scalings},
            "b": prop2b(measured, scaling),
        },
        "quality": quality,
        "clip": clip,
        "power": {
            "first_version": FIRST_VERSION,
            "prompts_needed": gs.prompts_needed(
                FIRST_VERSION["se"], FIRST_VERSION["prompts"], FIRST_VERSION["walk_minus_control"]
            ),
            "detectable_first": gs.detectable(FIRST_VERSION["se"]),
        },
    }


def analyse_replication(m: dict, folds: int, bootstrap: int, batches: Sequence[int]) -> dict:
    """Proposition 2 (a)'s figures on a measurement without replays (another checkpoint), alone (`run_summary`)."""
    r, group, scaling = m["rollouts"], m["group"], m["recipe_scaling"]
    d = Directions(r, group)
    arms = world_arms(r, d, m["recipe"], group, (scaling,), m["seed"], qualities=(QUALITIES[0],))
    measured, _ = measure_arms(
        [Run(arms, d, folds_of(d.prompts, folds))], m["batch_prompts"], group, bootstrap, m["seed"]
    )
    return run_summary(m, measured, batches)
