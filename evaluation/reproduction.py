"""The closing page of `make reproduce` (scripts/reproduce.py): `RUN_DIR/reproduce.md`, our score per benchmark beside
the published ones (each cited, from `recipes/reproduce.yaml`'s `published`), the RL settings that differ from the
paper's (`recipes/mapo_paper.yaml`), and the RL run's training curves as PNGs, read from its `trainer_state.json`.

Read from the run folder only (each stage's `metrics.json`, `recipe.yaml`, `.done`), so the page can be rewritten at
any time from what the run left."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from matplotlib.figure import Figure  # no pyplot: files only, no display or backend on a training node

from evaluation.reproduce_gates import NO_ANSWER_REWARDS, paid_rates
from evaluation.reproduce_time import ESTIMATE_FILE
from utils.recipes import flag_values

PAPER_RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "mapo_paper.yaml"
# Keys a run sets for its own paths, or that only say where to log: not settings of the method.
PATH_KEYS = {"model_name_or_path", "output_dir", "dataset_path", "resume_from_checkpoint", "report_to", "run_name"}
# (file stem, title, the log_history keys drawn, what the curve shows)
CURVES = (
    ("reward", "reward", ("reward", "rewards/gated_outcome_reward/mean"),
     "`reward` (the weighted sum TRL logs) and R_out (`rewards/gated_outcome_reward/mean`)"),
    ("r_sem", "R_sem", ("rewards/semantic/mean",), "R_sem, eq. 2 (`rewards/semantic/mean`)"),
    ("zoom_calls", "zoom calls per rollout", ("tools/zoom_calls_per_rollout",), "`tools/zoom_calls_per_rollout`"),
    ("gap", "mean z_t per call", ("semantic/z_mean",),
     "the reasoning-action gap: training logs no gap rate, so the closest logged measure, mean z_t = CLIP(label, "
     "crop) over the step's valid calls (`semantic/z_mean`; higher is a smaller gap, section 3.2's score); the "
     "evaluation's `gap_rate` is in the table"),
)  # fmt: skip


def _percent(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


# whose evaluations, `eval_<model>_<benchmark>`; the no-tool row only where it ran (`make reproduce ARGS=--no_tools_row`)
OURS = {"base": "base model", "sft": "SFT", "rl": "MAPO (RL)", "rl_no_tools": "MAPO (RL), tools withheld"}


def our_protocol(run_dir: Path, model: str, spec: dict) -> str:
    """How our evaluations of `model` ran, from their `eval_args.json` and `metrics.json`: decoding, samples per
    question, pixel budgets, tool rounds and token budget, the scoring rules (`metrics.json`'s `scoring`, per
    benchmark the published pipeline's: docs/evaluation.md) and whether a judge was asked."""
    runs = [run_dir / f"eval_{model}_{bench}" for bench in spec["benchmarks"]]
    runs = [run for run in runs if (run / "eval_args.json").is_file()]
    if not runs:
        return "not run yet"
    args = _read_json(runs[0] / "eval_args.json")
    rules = sorted({rule for run in runs for rule in (_read_json(run / "metrics.json") or {}).get("scoring", {})})
    tool = args.get("tool", {})
    decoding = "greedy" if not args.get("temperature") else f"temperature {args['temperature']}"
    k = args.get("samples", 1)
    pixels = f"images <= {tool.get('max_pixels') or 'the processor default'} px"
    crops = f"crops <= {tool.get('crop_max_pixels') or tool.get('max_pixels') or 'the same'} px"
    judge = "an LLM judge where no rule reads the answer" if args.get("judge") else "no judge"
    if args.get("no_tools"):
        return (
            f"{decoding}, {k} sample{'s' if k > 1 else ''}; tools withheld; rules {', '.join(rules) or 'unrecorded'}"
        )
    return (
        f"{decoding}, {k} sample{'s' if k > 1 else ''} (Avg@{k}); {pixels}, {crops}; <= {args.get('max_tool_calling_iterations')} zoom "
        f"rounds in {args.get('max_completion_length')} tokens; rules {', '.join(rules) or 'unrecorded'}, {judge} "
        "(docs/evaluation.md)"
    )


def score_table(run_dir: Path, spec: dict) -> list[str]:
    """The table: a row per system, ours (base, SFT, RL; the score each benchmark's publications report, %) then each
    published one, a column per benchmark and the protocol behind the row; the sources under it."""
    benches = spec["benchmarks"]
    head = ["system", *(entry["title"] for entry in benches.values()), "protocol"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, title in OURS.items():
        if model == "rl_no_tools" and our_protocol(run_dir, model, spec) == "not run yet":
            continue
        cells = []
        for bench, entry in benches.items():
            metrics = _read_json(run_dir / f"eval_{model}_{bench}" / "metrics.json") or {}
            cells.append(_percent(metrics.get(entry["score"])) + score_notes(metrics))
        lines.append(f"| ours: {title} | " + " | ".join(cells) + f" | {our_protocol(run_dir, model, spec)} |")
    notes = []
    for i, published in enumerate(spec.get("published", []), 1):
        cells = []
        for bench in benches:
            value, mark = published.get("scores", {}).get(bench), published.get("marks", {}).get(bench)
            cell = "—" if value is None else f"{value:.1f}"
            if mark is not None and value is not None:
                notes.append(mark)
                cell += f" ({'*' * len(notes)})"
            cells.append(cell)
        lines.append(f"| {published['name']} [{i}] | " + " | ".join(cells) + f" | {published['protocol']} |")
    lines.append("")
    lines += [f"[{i}] {p['name']}: {p['source']}" for i, p in enumerate(spec.get("published", []), 1)]
    lines += [f"({'*' * k}) {note}" for k, note in enumerate(notes, 1)]
    return lines


def score_notes(metrics: dict) -> str:
    """What follows a score in the table: its bootstrap interval over questions (`avg_at_k`) and, where options were
    shuffled, the score in the released order (`answer_order`; docs/evaluation.md)."""
    notes = ""
    interval = (metrics.get("avg_at_k") or {}).get("interval")
    if interval:
        notes += f" [{_percent(interval[0])}, {_percent(interval[1])}]"
    order = metrics.get("answer_order")
    if order:
        notes += f"; released order {_percent(order.get('released'))}, flips {_percent(order.get('flip_rate'))}"
    effect = metrics.get("tool_effect")
    if effect:  # on the no-tool row: questions the tools turned right and wrong (docs/evaluation.md)
        notes += f"; the tools turned {effect['turned_right']} right, {effect['turned_wrong']} wrong"
    return notes


def tool_table(run_dir: Path, spec: dict) -> list[str]:
    """Our evaluations' rows, tool use and reasoning-action gap rate per benchmark and model."""
    lines = ["| model | benchmark | n | calls / sample | valid calls | gap rate |", "|---|---|---|---|---|---|"]
    for model, title in OURS.items():
        for bench, entry in spec["benchmarks"].items():
            metrics = _read_json(run_dir / f"eval_{model}_{bench}" / "metrics.json")
            if metrics is None:
                continue
            calls = metrics.get("calls_per_sample")
            lines.append(
                f"| {title} | {entry['title']} | {metrics.get('n', '—')} | "
                f"{'—' if calls is None else f'{calls:.2f}'} | {_percent(metrics.get('valid_call_rate'))} | "
                f"{_percent(metrics.get('gap_rate'))} |"
            )
    return lines


def probe_lines(run_dir: Path, floor: float | None = None) -> list[str]:
    """What the RL recipe's rewards paid on the probe of the RL data (scripts/reproduce.py, stage rl_probe): each
    reward's paid rate with its standard error, and the floor RL's start was held to."""
    metrics = _read_json(run_dir / "rl_probe" / "metrics.json")
    if metrics is None:
        return ["- not run"]
    lines = [
        f"- {name}: paid {paid} of {scored} rollouts ({rate:.1%} ± {se:.1%} SE, mean "
        f"{metrics['rewards'][name]['mean']:.3f})"
        + (": pays without a right answer, not counted" if name in NO_ANSWER_REWARDS else "")
        for name, (paid, scored, rate, se) in paid_rates(metrics.get("rewards", {})).items()
    ] or ["- no reward scored a rollout"]
    if floor:
        lines.append(f"- RL starts when a reward that reads the answer pays at least {floor:.0%} of the rollouts")
    return lines


def command_overrides(run_dir: Path, stage: str) -> dict:
    """The `--key value` flags a stage's command gave after its `--config` (its `.done` record), typed as YAML."""
    record = _read_json(run_dir / stage / ".done") or {"command": []}
    argv = record["command"]
    start = next((i + 1 for i, a in enumerate(argv) if a.endswith(".py")), len(argv))
    values = flag_values(argv[start:])
    values.pop("config", None)
    return values


def ran_recipe(run_dir: Path) -> dict | None:
    """What the RL run ran: the resolved recipe its record holds (`.done`, or `.started` while it runs; kept from its
    first start, since the plan refuses to resume it under another), else its saved recipe with the command line over
    it (a run from before records kept recipes). `recipe.yaml` alone is not it: every start rewrites it."""
    record = _read_json(run_dir / "rl" / ".done") or _read_json(run_dir / "rl" / ".started") or {}
    if "recipe" in record:
        return record["recipe"]
    saved = run_dir / "rl" / "recipe.yaml"
    if not saved.is_file():
        return None
    return (yaml.safe_load(saved.read_text(encoding="utf-8")) or {}) | command_overrides(run_dir, "rl")


def settings_that_differ(run_dir: Path, spec: dict) -> list[str]:
    """The RL run's settings (`ran_recipe`) against `recipes/mapo_paper.yaml`, the paper's; then the notes of
    `recipes/reproduce.yaml` (what the paper's recipe itself could not take from it)."""
    ran = ran_recipe(run_dir)
    lines = []
    if ran is not None:
        paper = yaml.safe_load(PAPER_RECIPE.read_text(encoding="utf-8"))
        differ = [k for k in sorted(set(ran) & set(paper)) if k not in PATH_KEYS and ran[k] != paper[k]]
        lines += [f"- `{k}`: {json.dumps(ran[k])} (the paper's recipe: {json.dumps(paper[k])})" for k in differ]
        added = sorted(set(ran) - set(paper) - PATH_KEYS)
        if added:
            lines.append(
                "- set by the run, not by the paper's recipe: "
                + ", ".join(f"`{k}: {json.dumps(ran[k])}`" for k in added)
            )
        left = sorted(set(paper) - set(ran) - PATH_KEYS)
        if left:
            lines.append(
                "- set by the paper's recipe, left to the checkpoint's record or the defaults by the run: "
                + ", ".join(f"`{k}: {json.dumps(paper[k])}`" for k in left)
            )
        if not (differ or added or left):
            lines.append("- none: the RL run used the paper's recipe")
    else:
        lines.append(f"- not known: {run_dir / 'rl'} holds no record of a run (the RL stage has not run)")
    return lines + [f"- {note}" for note in spec.get("notes", [])]


def plot_curves(run_dir: Path) -> list[str]:
    """One PNG per curve in `RUN_DIR/curves/`, from the RL stage's `trainer_state.json`; a line per curve saying
    what it draws, or why it is missing."""
    state = _read_json(run_dir / "rl" / "trainer_state.json")
    if state is None:
        return [f"- none: {run_dir / 'rl' / 'trainer_state.json'} is missing"]
    history = [row for row in state.get("log_history", []) if "step" in row]
    out, lines = run_dir / "curves", []
    out.mkdir(exist_ok=True)
    for stem, title, keys, what in CURVES:
        drawn = [k for k in keys if any(k in row for row in history)]
        if not drawn:
            lines.append(f"- {title}: not logged in this run ({what})")
            continue
        fig = Figure(figsize=(5, 3.2))
        ax = fig.add_subplot()
        for key in drawn:
            points = [(row["step"], row[key]) for row in history if key in row]
            ax.plot(*zip(*points), marker="o", markersize=3, label=key)
        ax.set(xlabel="RL step", title=title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=110)
        lines.append(f"- {title}: {what}\n\n  ![{title}](curves/{stem}.png)")
    return lines


def time_lines(run_dir: Path, stages: list[str]) -> list[str]:
    """Per stage, the plan's estimate, what the run measured (seconds a step or an evaluated row) and the hours left,
    from `RUN_DIR/estimate.json` (evaluation.reproduce_time), and the seconds each finished stage took (its `.done`)."""
    estimate = _read_json(run_dir / ESTIMATE_FILE)
    if estimate is None:
        return [f"- no estimate: {run_dir / ESTIMATE_FILE} is missing (the run has not started)"]
    hours = lambda value: "—" if value is None else f"{value:.1f}"  # noqa: E731
    lines = [
        f"Written {estimate['written']}, generation on {estimate['backend']}: ~{estimate['hours_left']:.1f} h left"
        + (f" (no estimate for {', '.join(estimate['unknown'])})" if estimate["unknown"] else "")
        + f", against a week of {estimate['week_hours']} h.",
        "",
        "| stage | planned (h) | measured (s a unit) | units done | took (s) | left (h) |",
        "|---|---|---|---|---|---|",
    ]
    for name in stages:
        entry = estimate["stages"].get(name, {})
        measured = entry.get("measured")
        record = _read_json(run_dir / name / ".done") or {}
        rate, done = (
            ("—", "—") if measured is None else (f"{measured['seconds']:.2f}", "{done} of {units}".format(**measured))
        )
        left = entry.get("hours_left", 0.0 if record else None)
        lines.append(
            f"| {name} | {hours(entry.get('planned_hours'))} | {rate} | {done} | {record.get('seconds', '—')} | "
            f"{hours(left)} |"
        )
    return lines


def write_report(run_dir: Path, set_name: str, chosen: dict, spec: dict, stages: list[str]) -> Path:
    """Write `run_dir/reproduce.md` (and its curves) and return its path."""
    timings = []
    for name in stages:
        record = _read_json(run_dir / name / ".done")
        timings.append(f"{name} {record['seconds']} s" if record and "seconds" in record else f"{name} (no record)")
    lines = [
        f"# Reproduction: recipe set `{set_name}`",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M')} by `make reproduce` from {run_dir}. SFT `{chosen['sft']}`, RL "
        f"`{chosen['rl']}`, `{chosen['accelerate']}` x {chosen['num_processes']}. Stages: {', '.join(timings)}.",
        "",
        "## Scores (%), ours beside the published",
        "",
        "Ours: the base model, the SFT checkpoint and the RL checkpoint, each evaluated by the same harness under the "
        "same settings; accuracy (HR-Bench: the mean of its single and cross accuracies, as published). Each row's "
        "protocol says how its numbers were obtained: rows of different protocols are not the same measurement. "
        "Beside ours: the 95% bootstrap interval over questions ([low, high]) and, where the options were also "
        "shuffled (`answer_order`: docs/evaluation.md), the score in the order as released and the share of verdicts "
        "that flip between the orders.",
        "",
        *score_table(run_dir, spec),
        "",
        "## Tool use",
        "",
        "`gap rate`: valid calls whose crop matches their label no better than the whole image (docs/evaluation.md).",
        "",
        *tool_table(run_dir, spec),
        "",
        "## The RL data, before RL",
        "",
        "The SFT checkpoint's rollouts of a sample of the RL data, scored by the RL recipe's rewards (stage `rl_probe`):",
        "",
        *probe_lines(run_dir, (spec.get("rl_probe", {}) | chosen.get("rl_probe", {})).get("min_paid_rate")),
        "",
        "## Settings that differ from the paper's",
        "",
        *settings_that_differ(run_dir, spec),
        "",
        "## Time: the plan's estimate and the run's own figures",
        "",
        *time_lines(run_dir, stages),
        "",
        "## Training curves (RL)",
        "",
        *plot_curves(run_dir),
        "",
    ]
    page = run_dir / "reproduce.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    return page
