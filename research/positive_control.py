"""The positive control of RL on the tiny world: does GRPO on the noise-free grounding reward (`target_in_view`: 1 when
a valid zoom-in call framed the target) raise greedy target-seen on held-out rows over its SFT checkpoint?

Nothing an RL experiment on the tiny world says means anything unless RL moves the tiny policy at all, on the reward
that pays exactly what is measured. This runs that check on its own, in the words world the demo trains in
(`synthetic_region_hint`: each question names the cell that holds its target), with the grounding RL recipe
(`recipes/tiny/rl/config_demo.yaml`, `tiny.stages.GROUNDING_RL_RECIPE`: the demo's budget, which its two arms keep):

1. **Start**: the demo's stages (`tiny.stages`: verifier, data, SFT of `--sft_steps` at `--sft_learning_rate`), or
   `--sft_model` reused. `--image_side` makes the data square images of one side, so the frame the boxes are written
   in never changes (`research/frame_ceiling.py`: in the recipe's world a policy that cannot tell its two frames apart
   frames at most 0.77 of the rows). `--sft_start_step` starts RL from the SFT's checkpoint at that step: a policy
   whose box already follows the cue's column word but not yet every cue. RL from the end of a 900-step SFT at a
   similar target-seen (0.359 against 0.391) falls instead: it writes the middle column's box for every cue
   (research/reports/tiny_world.md, "Which start RL can improve").
2. **Runs**: per seed, GRPO on `target_in_view` for `--rl_steps` (the recipe with `--rl_args FIELD=VALUE` on top),
   its model evaluated greedily on `--eval_rows` held-out rows every `--eval_every` steps and at the end: the curve.
3. **Verdict** per seed, stated before the runs (`CRITERION`): the final rise over SFT at least `RISE_FLOOR` and above
   `SIGMAS` standard errors of a difference of two evaluations on the same rows.
4. **Levers** (`--levers`): one more run on the first seed per lever, with that one setting put back to the value of
   the earlier route (`research/recipes/config_experiment.yaml`, whose control did not move): what each lever is worth.

The report (`--report`, default research/reports/positive_control.md) is written from `results.json` beside its plots.

    python -m research.positive_control --image_side 768 --sft_learning_rate 1e-3 --sft_steps 1200 \
        --sft_start_step 800 --rl_steps 200 --eval_every 50 --eval_rows 128 \
        --rl_args temperature=0.7 learning_rate=1e-4 --levers ...    # the report: research/reports/positive_control.md
    python -m research.positive_control --sft_model outputs/demo/sft \
        --report research/reports/positive_control_demo.md           # make demo's checkpoint, data and verifier
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from data.benchmarks import load_saved_split
from research.report import markdown_table, verdict_sections
from research.runs import (
    Start,
    curve,
    difference_se,
    evaluate,
    locate,
    plot_curves,
    plot_evaluations,
    prepare,
    results_hash,
    shared_fields,
    train_and_evaluate,
)
from tiny import stages

RECIPE = stages.GROUNDING_RL_RECIPE  # GRPO on `target_in_view`: what the control checks
RISE_FLOOR = 0.15  # absolute rise in greedy target-seen a seed must reach
SIGMAS = 2.0  # ... and in standard errors of the difference of two evaluations on the same rows
# Each lever: the settings of the earlier route (research/recipes/config_experiment.yaml) it puts back, one at a time.
LEVERS: dict[str, dict[str, object]] = {
    "rollouts per step (8 in groups of 4)": {"per_device_train_batch_size": 8, "num_generations": 4},
    "completion length (320 tokens, 2 calls)": {"max_completion_length": 320, "max_tool_calling_iterations": 2},
    "learning rate (3e-4)": {"learning_rate": 3.0e-4},
    "token normalisation (grpo: per rollout)": {"loss_type": "grpo"},
}
CRITERION = (
    "Stated before the runs (`seed_verdict`). The figure is greedy **target-seen** on the held-out rows: the fraction "
    "of rows where a valid zoom-in call's box held the whole target and covered at most a quarter of the image "
    "(`rewards.grounding.frames_target`), the very thing the reward pays. A seed **passes** when its final "
    f"target-seen is at least {RISE_FLOOR:g} above the SFT checkpoint's *and* the rise is above {SIGMAS:g} standard "
    "errors of a difference of two rates on the same rows (sqrt(p(1-p)/n + q(1-q)/n)). The control **passes** when "
    "every seed does."
)


def seed_verdict(before: float, after: float, n: int) -> dict:
    """One seed's final evaluation against the SFT checkpoint's, on the same `n` rows: the rise, its standard error
    (`difference_se`) and whether it passes `CRITERION`."""
    rise = after - before
    se = difference_se(before, after, n)
    return {
        "before": before,
        "after": after,
        "rise": rise,
        "se": se,
        "passed": rise >= RISE_FLOOR and rise > SIGMAS * se,
    }


def run_argv(args: argparse.Namespace, start: Start, name: str, seed: int, **overrides) -> list[str]:
    """One `rl.py` command line: the control's recipe with `--rl_args` on top, from the start, saving a checkpoint
    every `--eval_every`."""
    shared = dict(args.rl_args) | {"seed": seed}
    if args.eval_every:
        shared |= {"save_strategy": "steps", "save_steps": args.eval_every, "save_only_model": True}
    out = args.output_dir / "rl" / f"{name}-seed{seed}"
    return stages.rl_argv(start.sft, start.data, start.clip, out, args.rl_steps, recipe=RECIPE, **(shared | overrides))


def key_value(text: str) -> tuple[str, str]:
    """`FIELD=VALUE` of `--rl_args`, split at the first `=`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIELD=VALUE")
    return key, value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--seeds", nargs="+", type=int, default=[0, 1, 2])
    add("--image_side", type=int, default=0, help="square images of this side (0: the SFT recipe's world)")
    add("--sft_learning_rate", type=float, default=None, help="the SFT's peak learning rate (default: the recipe's)")
    add("--sft_start_step", type=int, default=0, help="start RL from the SFT's checkpoint at this step (0: its end)")
    add("--rl_args", nargs="*", type=key_value, default=[], metavar="FIELD=VALUE", help="over the recipe, every run")
    add("--rl_steps", type=int, default=None, help="RL steps of every run (default: the recipe's max_steps)")
    add("--eval_every", type=int, default=25, help="evaluate every K steps as well as at the end (0: at the end)")
    add("--eval_rows", type=int, default=None, help="held-out rows per evaluation (default: all)")
    add("--levers", nargs="*", default=[], choices=list(LEVERS), metavar="LEVER", help=f"of {list(LEVERS)}")
    add("--output_dir", type=Path, default=Path("outputs/positive_control"))
    add("--report", type=Path, default=Path("research/reports/positive_control.md"), help="plots in <report>/")
    add("--sft_model", type=Path, default=None, help="reuse this SFT checkpoint (default: make one as the demo does)")
    add("--data", type=Path, default=None, help="with --sft_model: its data (default: data/ beside it)")
    add("--clip", type=Path, default=None, help="with --sft_model: the verifier (default: clip/ beside it)")
    add("--from_results", type=Path, default=None, help="only write the report, from this results.json")
    stages.add_stage_arguments(parser)
    parser.set_defaults(test_rows=128)
    args = parser.parse_args(argv)
    if args.sft_start_step and (args.sft_model or not 0 < args.sft_start_step < args.sft_steps):
        parser.error(f"--sft_start_step {args.sft_start_step}: a step inside --sft_steps {args.sft_steps} of an SFT "
                     "this run makes (with --sft_model, name the checkpoint itself)")  # fmt: skip
    args.rl_steps = args.rl_steps or stages.rl_args(["--config", RECIPE])[1].max_steps
    if args.eval_every >= args.rl_steps:
        args.eval_every = 0
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.from_results:  # the report again from a run's results.json: its prose changed, not its figures
        write_report(args.report, json.loads(args.from_results.read_text(encoding="utf-8")))
        return {}
    stage = stages.Stages()
    start = locate(args)
    if not args.sft_model:
        start = prepare(args, start, stage)
    test = load_saved_split(str(start.data), "test")
    rows = len(test) if args.eval_rows is None else min(args.eval_rows, len(test))
    sizes = [image.size for image in test.select(range(rows))["image"]]
    budget = stages.rollout_budget(RECIPE)
    sft = stage("evaluate SFT", lambda: evaluate(start.sft, start, args.output_dir / "eval" / "sft", rows, budget))

    def run(name: str, seed: int, **overrides) -> dict:
        argv_ = run_argv(args, start, name, seed, **overrides)
        eval_dir = args.output_dir / "eval" / f"{name}-seed{seed}"
        result = train_and_evaluate(
            argv_, start, eval_dir, rows, stage, f"{name} seed {seed}", args.eval_every, stages.alone_threads()
        )
        return result | {"seconds": stage.seconds[f"RL {name} seed {seed}"]}

    runs = [run("control", seed) for seed in args.seeds]
    levers = {lever: run(f"lever{i}", args.seeds[0], **LEVERS[lever]) for i, lever in enumerate(args.levers)}
    per_seed = {
        r["seed"]: seed_verdict(sft["target_seen"], r["evals"][args.rl_steps]["target_seen"], rows) for r in runs
    }
    results = {
        "sft": sft,
        "runs": runs,
        "per_seed": per_seed,
        "passed": all(v["passed"] for v in per_seed.values()),
        "levers": {
            lever: {"settings": LEVERS[lever], "run": r, **seed_verdict(sft["target_seen"], r["evals"][args.rl_steps][
                "target_seen"], rows)}
            for lever, r in levers.items()
        },
        "rows": rows,
        "images": {"sides": [min(map(min, sizes)), max(map(max, sizes))], "square": all(w == h for w, h in sizes)},
        "rl_steps": args.rl_steps,
        "fields": {k: v for k, v in shared_fields(stages.rl_args(run_argv(args, start, "control", 0))).items()
                   if k in FIELDS} | {"seeds": args.seeds},
        "command": shlex.join(["python", "-m", "research.positive_control", *argv]),
        "start": {k: str(v) for k, v in vars(start).items()},
        "minutes": round(stage.total() / 60, 1),
        "date": datetime.date.today().isoformat(),
    }  # fmt: skip
    write_report(args.report, results)
    return results


FIELDS = ("reward_funcs", "advantage_estimator", "learning_rate", "lr_scheduler_type", "per_device_train_batch_size",
          "num_generations", "max_completion_length", "max_tool_calling_iterations", "temperature", "loss_type",
          "beta", "max_steps")  # fmt: skip


def what_it_shows(results: dict) -> list[str]:
    """The verdict's bullets, one per seed and one overall, written from the results."""
    lines = [
        f"- Seed {seed}: greedy target-seen {v['before']:.3f} (SFT) → {v['after']:.3f} ({v['rise']:+.3f}, standard error "
        f"{v['se']:.3f}): " + ("passes." if v["passed"] else "**fails**.")
        for seed, v in results["per_seed"].items()
    ]
    verdict = "**passes**: RL on this budget moves the tiny policy" if results["passed"] else "**fails**"
    return [*lines, f"- The positive control {verdict} ({len(results['per_seed'])} seeds, {results['rows']} rows)."]


def images(results: dict) -> str:
    """The evaluated images' world in words: one frame (squares of one side) or the recipe's range of sides."""
    sides = results.get("images")  # absent from results written before it was recorded
    if sides is None:
        return "images of the SFT recipe's world"
    low, high = sides["sides"]
    if sides["square"] and low == high:
        return f"{low} px squares (one frame)"
    return f"images with sides of {low}-{high} px" + (" (squares)" if sides["square"] else "")


def write_report(report: Path, results: dict) -> Path:
    """The report and its folder (`results.json`, the curves' PNGs), every figure from `results`."""
    folder = report.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    sft, n = results["sft"], results["rows"]
    runs = [r | {"evals": {int(k): e for k, e in r["evals"].items()}} for r in results["runs"]]  # JSON keys: strings
    evals = plot_evaluations({"GRPO on target_in_view": runs}, sft, folder / "target_seen.png")
    train = plot_curves({"GRPO on target_in_view": curve([r["steps"] for r in runs], "target_in_view")},
                        "batch mean of target_in_view (training rollouts)", folder / "reward.png")  # fmt: skip
    steps = sorted({int(k) for r in runs for k in r["evals"]})
    table = markdown_table(
        ["seed", "SFT", *(f"step {s}" for s in steps)],
        [
            [r["seed"], f"{sft['target_seen']:.3f}", *(f"{r['evals'][s]['target_seen']:.3f}" for s in steps)]
            for r in runs
        ],
    )
    lever_rows = [
        [lever, f"{v['after']:.3f}", f"{v['rise']:+.3f} ± {v['se']:.3f}"] for lever, v in results["levers"].items()
    ]
    first = {int(k): v for k, v in results["per_seed"].items()}[runs[0]["seed"]]
    seconds = ", ".join(format(r["seconds"], ".0f") for r in runs)
    lines = [
        "# The positive control: does RL move the tiny policy?",
        "",
        f"_Generated by `research/positive_control.py` on {results['date']} from results "
        f"`{results_hash(results)}` (`{folder.name}/results.json`): rerun it to regenerate._",
        "",
        *verdict_sections(CRITERION, what_it_shows(results), results["command"]),
        "",
        f"- Start: SFT checkpoint `{results['start']['sft']}`, data `{results['start']['data']}`; evaluations greedy on "
        f"the first {n} held-out rows, {images(results)}.",
        f"- RL: `{RECIPE}`, {results['rl_steps']} steps; wall time {results['minutes']} min in all "
        f"(RL per seed {seconds} s).",
        "",
        markdown_table(["field", "value"], [[f"`{k}`", f"`{v}`"] for k, v in results["fields"].items()]),
        "",
        "## Curves",
        "",
        "Greedy target-seen on the held-out rows (step 0: the SFT checkpoint), the mean over seeds and the min-max band:",
        "",
        f"![target-seen]({folder.name}/{evals.name})",
        "",
        table,
        "",
        f"![training reward]({folder.name}/{train.name})",
        "",
        "## Levers",
        "",
        "One run on the first seed per lever, with that setting put back to the earlier route's "
        f"(`research/recipes/config_experiment.yaml`); the first seed with every lever: {first['after']:.3f} "
        f"({first['rise']:+.3f}).",
        "",
        markdown_table(["put back", "target-seen", "rise over SFT"], lever_rows) if lever_rows else "(none run here)",
        "",
        "Settings measured one run each by hand (the learning rates that stop the rollouts calling, the temperature, "
        "a dense reward, MAPO with the tiny CLIP, the frame, the SFT's learning rate and which SFT checkpoint RL can "
        'improve): `research/reports/tiny_world.md`, "Does RL move it?", "Why greedy boxes do not move" and "Which '
        'start RL can improve".',
        "",
    ]
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
