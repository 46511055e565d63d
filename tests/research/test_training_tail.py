"""The post-hoc reading of a learning-curve run's own rollouts (`research/training_tail.py`), on hand-made step logs."""

import json

from research import training_tail
from tests.tolerance import FLOAT64, HAND_TERMS, approx


def _run(seed: int, values: list[float | None]) -> dict:
    return {"seed": seed, "steps": [{"step": i + 1, "target_in_view": v} for i, v in enumerate(values)]}


def test_the_tail_is_the_mean_of_the_last_steps_that_logged_it():
    run = _run(0, [0.9, 0.1, None, 0.3, 0.5])
    assert training_tail.tail_mean(run["steps"], "target_in_view", 2) == approx(
        0.4, FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    # the last 3 logged: 0.1, 0.3, 0.5 (the unlogged step is skipped, not counted as a step of the window)
    assert training_tail.tail_mean(run["steps"], "target_in_view", 3) == approx(
        0.3, FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert training_tail.tail_mean(run["steps"], "reader_success", 3) is None


def test_every_arm_is_paired_by_seed_with_the_reference_and_the_density_control(tmp_path, capsys):
    results = {
        "grpo": [_run(0, [0.0, 0.4]), _run(1, [0.0, 0.5])],
        "mapo_walk": [_run(0, [0.0, 0.6]), _run(1, [0.0, 0.8])],  # +0.2, +0.3 on the last step: mean +0.25, SE 0.05
        "mapo_density": [_run(0, [0.0, 0.4]), _run(1, [0.0, 0.4])],
    }
    lines = training_tail.table(results, "target_in_view", 1, ["grpo", "mapo_density"])
    assert lines[1].split() == ["grpo", "0.400", "0.500", "0.450", "—", "+0.050", "±", "0.050"]
    assert lines[2].split() == ["mapo_walk", "0.600", "0.800", "0.700", "+0.250", "±", "0.050", "+0.300", "±", "0.100"]
    assert lines[3].split()[-4:] == ["-0.050", "±", "0.050", "—"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"results": results}))
    printed = training_tail.main([str(path), "--last", "1"])
    assert printed[:4] == lines and "reader_success" in printed[4] and printed[5] == "grpo            (not logged)"
    assert capsys.readouterr().out.startswith(lines[0])
