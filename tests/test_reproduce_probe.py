"""`make reproduce`'s probe of the RL data (evaluation/reproduce_gates.py): each reward's paid rate with its standard
error, RL stopped when the best reward that reads the answer pays under the floor (5% of 64 rollouts) unless
--accept_probe, and which reward paid said. Numbers worked by hand; the tiny set's plan stopped before RL."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from tolerance import FLOAT64, approx

from evaluation.reproduce_gates import paid_rates, probe_summary, probe_verdict
from scripts import reproduce
from tiny.releases import write_releases

SPEC = yaml.safe_load(reproduce.SETS_FILE.read_text(encoding="utf-8"))


def probe(tmp_path, **paid: int):
    rewards = {name: {"mean": n / 64, "scored": 64, "paid": n} for name, n in paid.items()}
    (tmp_path / "metrics.json").write_text(json.dumps({"n": 64, "accuracy": 0.05, "n_failed": 2, "rewards": rewards}))
    return rewards


def test_the_paid_rate_has_its_standard_error():
    """3 of 64: 4.6875%, SE sqrt((3/64)(61/64)/64) = sqrt(183) / 512 = 2.642%."""
    rates = paid_rates({"gated_outcome": {"paid": 3, "scored": 64}, "judge": {"paid": 0, "scored": 0}})
    assert rates == {"gated_outcome": (3, 64, 0.046875, approx(math.sqrt(183) / 512, FLOAT64, terms=4))}


def test_rl_stops_under_the_floor_and_says_which_reward_paid(tmp_path):
    """The old gate passed with 1 paid rollout of 64; 3 of 64 (4.7% +- 2.6%) is under 5%; 4 of 64 (6.25%) is over.
    format paid 60 of 64 and does not count: it pays without a right answer."""
    for paid in (0, 1, 3):
        probe(tmp_path, gated_outcome=paid, format=60)
        verdict = probe_verdict(tmp_path, 0.05)
        assert verdict.startswith("the RL recipe's answer rewards paid under the floor of 5% (recipes/reproduce.yaml")
        assert f"the best, gated_outcome, paid {paid / 64:.1%} (gated_outcome paid {paid} of 64 rollouts" in verdict
        assert (
            "format paid 60 of 64 rollouts (93.8% ± 3.0% SE) (not counted: it pays without a right answer)" in verdict
        )
        assert 'ARGS="--accept_probe"' in verdict
        assert probe_verdict(tmp_path, 0.05, accepted=True) is None and probe_verdict(tmp_path, 0) is None
    assert "(4.7% ± 2.6% SE)" in probe_verdict(tmp_path, 0.05)
    probe(tmp_path, gated_outcome=4, format=60)
    assert probe_verdict(tmp_path, 0.05) is None
    probe(tmp_path, format=64)  # nothing that reads the answer
    assert "none of them reads the answer" in probe_verdict(tmp_path, 0.05)
    assert "is missing" in probe_verdict(tmp_path / "nope", 0.05)


def test_the_summary_names_each_reward():
    rewards = {"gated_outcome": {"paid": 8, "scored": 64}, "target_in_view": {"paid": 16, "scored": 64}}
    assert probe_summary(rewards) == (
        "gated_outcome paid 8 of 64 rollouts (12.5% ± 4.1% SE); target_in_view paid 16 of 64 rollouts (25.0% ± 5.4% SE)"
        " (not counted: it pays without a right answer)"
    )


def test_the_tiny_plan_stops_before_rl_when_the_probe_paid_one_rollout_in_64(tmp_path, capsys):
    """Every stage before RL done (records as the run writes them), the probe paying 1 of 64 and the tiny set held to
    the real sets' floor: RL is not started, the message gives the rate with its SE and the reward."""
    spec = yaml.safe_load(reproduce.SETS_FILE.read_text(encoding="utf-8"))
    spec["sets"]["tiny"]["rl_probe"] = {"rows": 4, "min_paid_rate": 0.05}
    sets = tmp_path / "sets.yaml"
    sets.write_text(yaml.safe_dump(spec))
    data, run = tmp_path / "data", tmp_path / "run"
    write_releases(data, SPEC)
    argv = ["--recipe_set", "tiny", "--data_root", str(data), "--run_dir", str(run), "--sets_file", str(sets),
            "--benchmarks", "vstar"]  # fmt: skip
    stages = reproduce.main([*argv, "--dry_run", "--no_memory"])
    for s in stages[: [s.name for s in stages].index("rl")]:
        s.output.mkdir(parents=True)
        record = {**s.record(), "id": f"{s.name}-1", "inputs": {name: f"{name}-1" for name in s.reads}}
        (s.output / ".done").write_text(json.dumps(record))
    probe(run / "rl_probe", gated_outcome=1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        reproduce.main(argv)
    message = str(refused.value)
    assert message.startswith("stage rl not started: the RL recipe's answer rewards paid under the floor of 5%")
    assert "gated_outcome paid 1 of 64 rollouts (1.6% ± 1.6% SE)" in message
    assert not (run / "rl").exists()
