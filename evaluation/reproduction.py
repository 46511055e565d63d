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


def score_table(run_dir: Path, spec: dict) -> list[str]:
    """The table: per benchmark, ours (the score the publications report, %), tool use and gap rate, then each
    published column; and the sources under it."""
    published = spec.get("published", [])
    head = ["benchmark", "ours", "n", "calls / sample", "gap rate", *(p["name"] for p in published)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for bench, entry in spec["benchmarks"].items():
        metrics = _read_json(run_dir / f"eval_{bench}" / "metrics.json") or {}
        calls = metrics.get("calls_per_sample")
        ours = [_percent(metrics.get(entry["score"])), str(metrics.get("n", "—")),
                "—" if calls is None else f"{calls:.2f}", _percent(metrics.get("gap_rate"))]  # fmt: skip
        cells = [f"{p['scores'][bench]:.1f} [{i}]" if bench in p.get("scores", {}) else f"— [{i}]"
                 for i, p in enumerate(published, 1)]  # fmt: skip
        lines.append("| " + " | ".join([entry["title"], *ours, *cells]) + " |")
    lines.append("")
    lines += [f"[{i}] {p['name']}: {p['source']}" for i, p in enumerate(published, 1)]
    return lines


def command_overrides(run_dir: Path, stage: str) -> dict:
    """The `--key value` flags a stage's command gave after its `--config` (its `.done` record), typed as YAML."""
    record = _read_json(run_dir / stage / ".done") or {"command": []}
    argv = record["command"]
    start = next((i + 1 for i, a in enumerate(argv) if a.endswith(".py")), len(argv))
    flags = argv[start:]
    pairs = zip(flags[::2], flags[1::2])
    return {k.removeprefix("--"): _typed(v) for k, v in pairs if k.startswith("--") and k != "--config"}


def _typed(value: str):
    """A command-line value as the recipe parser reads it: JSON first (`2e-6` is a float there, a string in YAML)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return yaml.safe_load(value)


def settings_that_differ(run_dir: Path, spec: dict) -> list[str]:
    """The RL run's settings (its saved recipe, with the command line over it) against `recipes/mapo_paper.yaml`,
    the paper's; then the notes of `recipes/reproduce.yaml` (what the paper's recipe itself could not take from it)."""
    saved = run_dir / "rl" / "recipe.yaml"
    lines = []
    if saved.is_file():
        ran = (yaml.safe_load(saved.read_text(encoding="utf-8")) or {}) | command_overrides(run_dir, "rl")
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
        lines.append(f"- not known: {saved} is missing (the RL stage has not run)")
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
        "Ours: accuracy (HR-Bench: the mean of its single and cross accuracies, as published), greedy, one sample per "
        "question, scored without an LLM judge (docs/evaluation.md); `gap rate`: valid calls whose crop matches their "
        "label no better than the whole image. Published numbers come from other protocols (see each source).",
        "",
        *score_table(run_dir, spec),
        "",
        "## Settings that differ from the paper's",
        "",
        *settings_that_differ(run_dir, spec),
        "",
        "## Training curves (RL)",
        "",
        *plot_curves(run_dir),
        "",
    ]
    page = run_dir / "reproduce.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    return page
