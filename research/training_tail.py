"""What the arms' own rollouts did at the end of training, from a learning-curve run's results.json
(`make experiment-curves`, research/reports/experiment_curves/results.json): per arm and seed, the mean over the last
`--last` steps of each step's batch figure (`target_in_view`: the fraction of the step's sampled rollouts whose valid
call framed the target; `reader_success`: the simulated reader's outcome), and each arm minus the reference and
minus the density control, paired by seed.

A descriptive reading, not the experiment's verdict (greedy target-seen on held-out rows, stated before the runs):
each run's tail averages 50 steps x 32 sampled rollouts at the training temperature, drawn on the same prompts in
every arm of a seed (the seed fixes the data order), so the paired differences are much less noisy than one
evaluation on 128 rows. Findings: research/reports/tiny_world.md, "MAPO against GRPO on learning curves".

    python -m research.training_tail research/reports/experiment_curves/results.json --last 50
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from research.runs import paired

METRICS = ("target_in_view", "reader_success")


def tail_mean(steps: Sequence[dict], metric: str, last: int) -> float | None:
    """The mean of `metric` over the last `last` steps that logged it (None: none did)."""
    values = [step[metric] for step in steps if step.get(metric) is not None][-last:]
    return statistics.fmean(values) if values else None


def tails(results: dict[str, list[dict]], metric: str, last: int) -> dict[str, dict[int, float]]:
    """`{arm: {seed: tail_mean}}` over the runs that logged `metric`."""
    out: dict[str, dict[int, float]] = {}
    for arm, runs in results.items():
        values = {run["seed"]: tail_mean(run["steps"], metric, last) for run in runs}
        out[arm] = {seed: v for seed, v in values.items() if v is not None}
    return out


def table(results: dict[str, list[dict]], metric: str, last: int, against: Sequence[str]) -> list[str]:
    """One line per arm: its tail per seed, their mean, and the paired difference (mean ± SE) against each arm of
    `against` that ran (the reference, the density control)."""
    by_arm = tails(results, metric, last)
    lines = [f"{metric}, mean of the last {last} steps (per seed; mean; minus {'; minus '.join(against)})"]
    for arm, values in by_arm.items():
        if not values:
            lines.append(f"{arm:14}  (not logged)")
            continue
        cells = [
            f"{arm:14}",
            " ".join(f"{values[s]:.3f}" for s in sorted(values)),
            f"{statistics.fmean(values.values()):.3f}",
        ]
        for other in against:
            pair = paired(values, by_arm[other]) if other in by_arm and arm != other else None
            cells.append("—" if pair is None else f"{pair.mean:+.3f} ± {pair.se:.3f}")
        lines.append("  ".join(cells))
    return lines


def main(argv: Sequence[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "results", type=Path, nargs="?", default=Path("research/reports/experiment_curves/results.json")
    )
    parser.add_argument("--last", type=int, default=50, help="steps at the end of each run to average")
    parser.add_argument("--against", nargs="+", default=["grpo", "mapo_density"], help="arms to pair every arm with")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text(encoding="utf-8"))["results"]
    lines = [line for metric in METRICS for line in table(results, metric, args.last, args.against)]
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
