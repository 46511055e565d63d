"""The gates of `make reproduce`'s plan (scripts/reproduce.py): checks of what a stage wrote, run before the stage that
reads it starts (None: it may start; else why it must not). SFT waits on the conversion's skips, RL on the probe."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def conversion_verdict(convert_dir: Path, max_skip_rate: float) -> str | None:
    """Why SFT must not start on the converted set (its `stats.json`): more than `max_skip_rate` of the release's rows
    were skipped; the message names the top reasons with an example of each."""
    stats_path = convert_dir / "stats.json"
    if not stats_path.is_file():
        return f"{stats_path} is missing: the convert stage did not finish"
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    read, skipped = stats["rows_read"], Counter(stats.get("rows_skipped", {}))
    rate = skipped.total() / read if read else 1.0
    if rate <= max_skip_rate:
        return None
    examples = stats.get("skipped_examples", {})
    top = "; ".join(
        f"{reason} {n} (e.g. {(examples.get(reason) or ['-'])[0]})" for reason, n in skipped.most_common(3)
    )
    return (
        f"the conversion skipped {skipped.total()} of {read} rows ({rate:.0%} > --max_skip_rate {max_skip_rate:g}); "
        f"top reasons: {top}. Look at {stats_path} and {convert_dir / 'preview' / 'index.html'} (docs/data.md, skip "
        "reasons), or accept it with --max_skip_rate."
    )


def probe_verdict(probe_dir: Path, min_fired: int) -> str | None:
    """Why RL must not start: its outcome rewards paid fewer than `min_fired` of the probe's rollouts of the RL data
    (`metrics.json`'s `rewards`), so the run would learn from R_sem alone."""
    metrics_path = probe_dir / "metrics.json"
    if not metrics_path.is_file():
        return f"{metrics_path} is missing: the rl_probe stage did not finish"
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    rewards = metrics.get("rewards", {})
    paid = max((summary["paid"] for summary in rewards.values()), default=0)
    if paid >= min_fired:
        return None
    counts = ", ".join(f"{name} paid {s['paid']} of {s['scored']}" for name, s in rewards.items()) or "no reward ran"
    return (
        f"the RL recipe's outcome rewards paid none of the starting checkpoint's {metrics['n']} rollouts of the RL "
        f"data ({counts}; answers correct by the benchmark rule: {metrics.get('accuracy')}; failures: "
        f"{metrics.get('n_failed')}): RL would learn from R_sem alone. Read {probe_dir / 'report.html'}: a format the "
        "reward does not read (no <answer>, a cut rollout), answers in another form than the data's ground truth "
        "(ThinkLite's math), or an SFT that did not take. Fix the cause, then FORCE=rl_probe."
    )
