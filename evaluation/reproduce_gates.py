"""The gates of `make reproduce`'s plan (scripts/reproduce.py): checks of what a stage wrote, run before the stage that
reads it starts (None: it may start; else why it must not). SFT waits on the conversion's skips, RL on the probe."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

# Rewards that pay without a right answer (a well-formed turn, a zoom that framed the target): what they pay does not
# show that RL has an outcome to learn from.
NO_ANSWER_REWARDS = ("format", "target_in_view")


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


def paid_rates(rewards: dict) -> dict[str, tuple[int, int, float, float]]:
    """Per reward the probe scored (`metrics.json`'s `rewards`): rollouts paid, rollouts scored, the paid rate and its
    standard error (binomial, sqrt(p (1 - p) / n)). A reward that scored none is left out."""
    rates = {}
    for name, summary in rewards.items():
        paid, scored = summary["paid"], summary["scored"]
        if scored:
            rate = paid / scored
            rates[name] = (paid, scored, rate, math.sqrt(rate * (1 - rate) / scored))
    return rates


def probe_summary(rewards: dict) -> str:
    """Each reward's paid rate with its standard error, the ones that pay without a right answer marked."""
    parts = [
        f"{name} paid {paid} of {scored} rollouts ({rate:.1%} ± {se:.1%} SE)"
        + (" (not counted: it pays without a right answer)" if name in NO_ANSWER_REWARDS else "")
        for name, (paid, scored, rate, se) in paid_rates(rewards).items()
    ]
    return "; ".join(parts) or "no reward scored a rollout"


def probe_verdict(probe_dir: Path, floor: float, accepted: bool = False) -> str | None:
    """Why RL must not start: no reward of the RL recipe that reads the answer paid at least `floor` of the probe's
    rollouts of the RL data (`metrics.json`'s `rewards`; `format` and `target_in_view` pay without a right answer and
    do not count), so the run would learn from R_sem, and noise, alone. `accepted`: the user said to start anyway."""
    metrics_path = probe_dir / "metrics.json"
    if not metrics_path.is_file():
        return f"{metrics_path} is missing: the rl_probe stage did not finish"
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    rewards = metrics.get("rewards", {})
    counted = {name: r for name, r in paid_rates(rewards).items() if name not in NO_ANSWER_REWARDS}
    best = max(counted.items(), key=lambda item: item[1][2], default=None)
    if floor <= 0 or accepted or (best is not None and best[1][2] >= floor):
        return None
    said = f"the best, {best[0]}, paid {best[1][2]:.1%}" if best else "none of them reads the answer"
    return (
        f"the RL recipe's answer rewards paid under the floor of {floor:.0%} (recipes/reproduce.yaml, rl_probe "
        f"min_paid_rate) on the starting checkpoint's {metrics['n']} rollouts of the RL data: {said} "
        f"({probe_summary(rewards)}; answers correct by the benchmark rule: {metrics.get('accuracy')}; failures: "
        f"{metrics.get('n_failed')}): RL would learn from R_sem alone. Read {probe_dir / 'report.html'}: a format the "
        "reward does not read (no <answer>, a cut rollout), answers in another form than the data's ground truth "
        "(ThinkLite's math), or an SFT that did not take. Fix the cause, then FORCE=rl_probe; or start RL anyway with "
        'ARGS="--accept_probe".'
    )
