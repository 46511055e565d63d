"""`make experiment`: aggregation across seeds, the statistics and the verdict on hand-made results (numbers worked out
by hand), the check that runs differ only in the arm's fields and the seed, the plots, and a shrunk experiment from
the tiny kit's policy through the real RL entry point: its control stopping the run, and every arm's tables and
plots when it passes."""

import json
import math
from dataclasses import dataclass

import pytest
from transformers.trainer_utils import SchedulerType

from evaluation.verifier_check import GateResult
from research import experiment
from research.experiment import Spread
from tests.tolerance import FLOAT64, HAND_TERMS, approx
from tiny import stages


def _run(seed: int, **series) -> dict:
    """A run whose steps 1..n carry the given per-step series (other figures missing)."""
    length = max(len(values) for values in series.values())
    steps = [{"step": i + 1, **{name: values[i] for name, values in series.items()}} for i in range(length)]
    return {"seed": seed, "steps": steps, "eval": None}


# ---------------------------------------------------------------------------------------------------- aggregation
def test_across_seeds_is_mean_and_population_std_of_the_seeds_with_a_value():
    assert experiment.across_seeds([1.0, 3.0, None]) == Spread(mean=2.0, std=1.0, low=1.0, high=3.0, n=2, of=3)
    spread = experiment.across_seeds([0.2, 0.4, 0.9])  # mean 0.5; deviations -0.3, -0.1, 0.4: var 0.26 / 3
    assert spread.mean == approx(0.5, FLOAT64, terms=HAND_TERMS, scale=1.0) and spread.std == approx(
        math.sqrt(0.26 / 3), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert experiment.across_seeds([None, float("nan")]) is None
    assert experiment.across_seeds([]) is None


def test_curves_match_steps_by_number_and_leave_missing_steps_missing():
    a = [{"step": 1, "z_mean": 0.2}, {"step": 2, "z_mean": None}, {"step": 3, "z_mean": 0.6}]
    b = [{"step": 1, "z_mean": 0.4}, {"step": 2, "z_mean": None}]  # a shorter run
    steps, spreads = experiment.curve([a, b], "z_mean")
    assert steps == [1, 2, 3]
    assert (
        spreads[0].mean == approx(0.3, FLOAT64, terms=HAND_TERMS, scale=1.0)
        and spreads[0].std == approx(0.1, FLOAT64, terms=HAND_TERMS, scale=1.0)
        and spreads[0].n == 2
    )
    assert spreads[1] is None
    assert (spreads[2].mean, spreads[2].n, spreads[2].of) == (0.6, 1, 2)


def test_spreads_print_as_mean_std_and_say_when_seeds_are_missing():
    assert experiment.format_spread(Spread(0.5, 0.1234, 0.4, 0.6, 3, 3)) == "0.500 ± 0.123"
    assert experiment.format_spread(Spread(0.5, 0.0, 0.5, 0.5, 1, 3)) == "0.500 ± 0.000 (1/3 seeds)"
    assert experiment.format_spread(None) == "— (no value)"


def test_markdown_table():
    table = experiment.markdown_table(["method", "a|b"], [["grpo", 1], ["mapo", "x|y"]])
    assert table == "| method | a\\|b |\n|---|---|\n| grpo | 1 |\n| mapo | x\\|y |"
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        experiment.markdown_table(["a", "b"], [["only one"]])


def test_runs_may_differ_only_in_the_arm_fields_seed_and_output_dir():
    @dataclass
    class Config:
        advantage_estimator: str
        seed: int
        output_dir: str
        learning_rate: float = 1e-4
        lr_scheduler_type: SchedulerType = SchedulerType.CONSTANT

    same = {
        ("grpo", 0): (Config("grpo", 0, "a"),),
        ("mapo", 1): (Config("mapo", 1, "b"),),
    }
    assert experiment.check_shared(same) == {"learning_rate": 1e-4, "lr_scheduler_type": "constant"}
    tuned = same | {("hpo", 0): (Config("hpo", 0, "c", learning_rate=1e-3),)}
    with pytest.raises(ValueError, match="learning_rate"):
        experiment.check_shared(tuned)


def test_plots_are_pngs_even_for_a_method_with_no_value(tmp_path):
    curves = {
        "grpo": ([1, 2], [Spread(0.1, 0.0, 0.1, 0.1, 1, 1), None]),
        "mapo": ([1, 2], [None, None]),
    }
    path = experiment.plot_curves(curves, "mean z_t", tmp_path / "figs" / "z_mean.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------- statistics
def test_binomial_and_difference_standard_errors():
    assert experiment.binomial_se(0.5, 100) == approx(0.05, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert experiment.binomial_se(0.0, 10) == 0.0
    assert experiment.difference_se(0.5, 0.5, 100) == approx(
        math.sqrt(0.05**2 * 2), FLOAT64, terms=HAND_TERMS, scale=1.0
    )


def test_paired_differences_and_their_standard_error():
    pair = experiment.paired({0: 0.5, 1: 0.6, 2: 0.9, 3: 0.2}, {0: 0.3, 1: 0.3, 2: 0.4})  # seed 3 has no partner
    # diffs 0.2, 0.3, 0.5: mean 1/3; sample var ((-2/15)^2 + (-1/30)^2 + (1/6)^2) / 2 = 0.02333; se sqrt(var / 3)
    assert pair.diffs == approx((0.2, 0.3, 0.5), FLOAT64, terms=HAND_TERMS, scale=1.0) and pair.mean == approx(
        1 / 3, FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert pair.se == approx(math.sqrt(0.07 / 3 / 3), FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert experiment.exceeds(pair, 2.0)  # 0.333 > 2 * 0.088
    assert not experiment.exceeds(pair, 2.0, floor=0.4)  # the evaluation's own noise is larger
    assert not experiment.exceeds(experiment.paired({0: 0.9}, {0: 0.1}), 2.0)  # one seed: no standard error
    assert experiment.paired({0: 0.9}, {1: 0.1}) is None


def test_row_metrics_count_rows_whose_call_framed_the_target_and_named_it():
    def record(boxes, labels):
        calls = [{"box": b, "label": lab} for b, lab in zip(boxes, labels)]
        return {"calls": calls, "target_bbox": [10, 10, 20, 20], "image_size": [100, 200], "target_label": "the star"}

    records = [
        record([[0, 0, 50, 50]], ["The star"]),  # framed and named
        record([[60, 60, 90, 90], [0, 0, 50, 50]], ["the star", "the sign"]),  # the second call framed, another label
        record([[0, 0, 100, 200]], ["the star"]),  # the whole image: not a zoom
        record([None], ["the star"]),  # a failed call
    ]
    assert experiment.row_metrics(records) == {"n": 4, "target_seen": 0.5, "named_and_seen": 0.25}


def _results(**finals):
    """Arms whose one-evaluation runs end with the given target-seen per seed."""
    return {
        arm: [{"seed": s, "evals": {10: {"target_seen": v}}} for s, v in enumerate(values)]
        for arm, values in finals.items()
    }


def test_the_verdict_needs_the_walk_arm_to_beat_grpo_and_its_shuffled_control_not_to():
    grpo = [0.30, 0.35, 0.40]
    acted = experiment.verdict(
        _results(grpo=grpo, mapo_walk=[0.50, 0.52, 0.61], mapo_shuffled=[0.31, 0.33, 0.42]), eval_se=0.05
    )
    assert acted["walk_beats_grpo"] and not acted["shuffled_beats_grpo"] and acted["acted"]
    assert acted["pairs"]["mapo_walk"]["diffs"] == approx([0.20, 0.17, 0.21], FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert acted["clip_beats_grpo"] is None and acted["exact_beats_grpo"] is None  # neither arm ran
    both = experiment.verdict(
        _results(grpo=grpo, mapo_walk=[0.50, 0.52, 0.61], mapo_shuffled=[0.50, 0.55, 0.58]), eval_se=0.05
    )
    assert both["walk_beats_grpo"] and both["shuffled_beats_grpo"] and not both["acted"]
    small = experiment.verdict(_results(grpo=grpo, mapo_walk=[0.34, 0.39, 0.44]), eval_se=0.05)
    assert not small["walk_beats_grpo"] and not small["acted"]  # +0.04 every seed: below the evaluation's noise
    # The talk-and-walk arm is judged by rule 1 on its own and does not decide the verdict.
    talk = experiment.verdict(_results(grpo=grpo, mapo_exact=[0.50, 0.52, 0.61], mapo_walk=grpo), eval_se=0.05)
    assert talk["exact_beats_grpo"] and not talk["walk_beats_grpo"] and not talk["acted"]


def test_what_it_shows_is_written_from_the_verdict_and_the_gate():
    control = {"before": 0.2, "after": 0.5, "rise": 0.3, "se": 0.06, "passed": True, "per_seed": {0: 0.5, 1: 0.5}}
    gate = {
        "clip": {
            "contrastive": GateResult("contrastive", 8, 4, 0.6, 2.0, 0.1, "the sign", 0.2, 0.5, False),
            "cosine": GateResult("cosine", 8, 4, 0.8, 1.5, 0.3, "the sign", 0.2, 0.25, True),
        }
    }
    results = _results(grpo=[0.30, 0.35, 0.40], mapo_walk=[0.50, 0.52, 0.61], mapo_shuffled=[0.31, 0.33, 0.42])
    outcome = {"verdict": experiment.verdict(results, 0.05), "eval_se": 0.05, "sft": {"named_and_seen": 0.0}}
    text = "\n".join(experiment.what_it_shows(outcome, control, gate, "cosine"))
    assert "**MAPO's signal acted**" in text and "+0.193" in text and "not label grounding" in text
    assert "passed the gate under `cosine`" in text and "`mapo_clip` − `grpo`: not run" in text
    assert "Talk and walk" not in text  # no mapo_exact arm ran
    results = _results(grpo=[0.3, 0.35, 0.4], mapo_walk=[0.3, 0.36, 0.4], mapo_exact=[0.3, 0.35, 0.41])
    outcome["verdict"] = experiment.verdict(results, 0.05)
    text = "\n".join(experiment.what_it_shows(outcome, control, gate, None))
    assert "did not act measurably" in text and "failed the verifier gate" in text and "did not run" in text
    assert "Talk and walk: `mapo_exact` − `grpo`: +0.003" in text and "so it did not beat" in text


def test_the_control_passes_on_its_mean_rise_over_seeds_and_one_lucky_seed_does_not_pass_it():
    sft = {"target_seen": 0.05, "n": 100}
    # Seeds rising 0.10, 0.12, 0.14: mean 0.12. One evaluation's SE of the difference 0.05 -> 0.17:
    # sqrt(0.05 * 0.95 / 100 + 0.17 * 0.83 / 100) = 0.04311; the seeds' SE 0.02 / sqrt(3) = 0.01155. Bar 2 x 0.04311.
    steady = experiment.control_verdict(
        sft, {0: {"target_seen": 0.15}, 1: {"target_seen": 0.17}, 2: {"target_seen": 0.19}}
    )
    assert steady["rise"] == approx(0.12, FLOAT64, terms=HAND_TERMS, scale=1.0) and steady["after"] == approx(
        0.17, FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert (
        steady["se"] == approx(math.sqrt(0.05 * 0.95 / 100 + 0.17 * 0.83 / 100), FLOAT64, terms=HAND_TERMS, scale=1.0)
        and steady["passed"]
    )
    assert steady["per_seed"] == {0: 0.15, 1: 0.17, 2: 0.19}
    # On 400 rows, one seed rising 0.33 and two falling 0.05 and 0.04: a mean rise of 0.08 is 4 of one evaluation's
    # standard errors (sqrt(0.05 * 0.95 / 400 + 0.13 * 0.87 / 400) = 0.02004), but the seeds' is 0.12503 (sample std
    # 0.2166 over sqrt(3)).
    lucky = experiment.control_verdict(
        {"target_seen": 0.05, "n": 400}, {0: {"target_seen": 0.38}, 1: {"target_seen": 0.0}, 2: {"target_seen": 0.01}}
    )
    assert (
        lucky["rise"] == approx(0.08, FLOAT64, terms=HAND_TERMS, scale=1.0)
        and experiment.difference_se(0.05, 0.13, 400) < 0.08 / 2
    )
    assert lucky["se"] == lucky["seeds_se"] == pytest.approx(0.12503, abs=1e-5) and not lucky["passed"]
    # With one seed only one evaluation's noise can be judged, as before.
    one = experiment.control_verdict(sft, {0: {"target_seen": 0.38}})
    assert math.isnan(one["seeds_se"]) and one["se"] == approx(
        experiment.difference_se(0.05, 0.38, 100), FLOAT64, terms=HAND_TERMS, scale=1.0
    )


def test_a_failed_control_is_reported_as_not_tested():
    control = {"before": 0.05, "after": 0.06, "rise": 0.01, "se": 0.03, "passed": False, "per_seed": {0: 0.06}}
    gate = {"clip": {"cosine": GateResult("cosine", 8, 4, 0.6, 2.0, 0.1, "the sign", 0.2, 0.5, False)}}
    outcome = {"verdict": experiment.verdict({}, 0.05), "eval_se": 0.05, "sft": {"named_and_seen": 0.0}}
    text = "\n".join(experiment.what_it_shows(outcome, control, gate, None))
    assert "**not** a measurable move" in text and "**Not tested**" in text
    assert "did not act" not in text and "`mapo_walk` − `grpo`" not in text


def test_the_results_hash_changes_with_any_result():
    a = {"results": _results(grpo=[0.3])}
    b = {"results": _results(grpo=[0.31])}
    assert experiment.results_hash(a) == experiment.results_hash(json.loads(json.dumps(a)))
    assert experiment.results_hash(a) != experiment.results_hash(b)


# ---------------------------------------------------------------------------------------------------- end to end
def _shrunk(tiny_kit, tmp_path, arms, variance_batches=0):
    data = stages.make_data(tmp_path / "data", train_rows=4, test_rows=2)
    report = tmp_path / "docs" / "experiment.md"
    argv = ["--arms", *arms, "--seeds", "0", "--rl_steps", "2", "--eval_every", "1", "--gate_rows", "2"]
    argv += ["--variance_batches", str(variance_batches)]
    argv += ["--sft_model", str(tiny_kit["policy"]), "--data", str(data), "--clip", str(tiny_kit["clip"])]
    argv += ["--output_dir", str(tmp_path / "out"), "--report", str(report)]
    return argv, report


@pytest.mark.slow
def test_a_failed_positive_control_stops_the_experiment_with_its_report(tiny_kit, tmp_path):
    """The tiny kit's random policy makes no tool call: GRPO cannot move target-seen off 0, and nothing else runs."""
    argv, report = _shrunk(tiny_kit, tmp_path, ["grpo", "mapo_walk"])
    stale = report.with_suffix("") / "z_mean.png"  # an earlier run's plot, which this report does not draw
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"png")
    with pytest.raises(SystemExit, match=r"positive control failed: .* moved greedy target-seen by \+0\.000"):
        experiment.main(argv)
    text = report.read_text()
    assert not stale.exists()
    assert "| `learning_rate` | `0.0003` |" in text  # the shared settings, planned before the control ran
    shows = text.split("## What it shows")[1].split("\n## ")[0]
    assert "**Not tested**" in shows and "did not act" not in shows
    assert "**failed**" in text.split("## Positive control")[1] and "## Final evaluation" not in text
    assert not (tmp_path / "out" / "rl" / "grpo-seed0").exists()  # no arm trained
    assert "| exact | cosine |" in text  # the verifier gate ran before the control


@pytest.mark.slow
def test_a_shrunk_experiment_writes_every_arm_the_paired_table_and_the_plots(tiny_kit, tmp_path, monkeypatch):
    """The reference arm and the gate's clip arm, 1 seed, 2 steps, evaluated at steps 1 and 2, with the gradient
    variance; the random policy cannot pass the control, so the control's bar is lowered here (the test above checks
    the bar). Every arm is one more `rl.py` launch and its gradient-variance launch (~1 min of the suite on 2 cores),
    so the other arms are covered where they are cheaper: the walk verifier and its shuffled control run in
    MAPOTrainer on recorded rollouts (tests/research/test_gradient_claims.py), HPO's arms in
    tests/test_hpo_trainer.py, and the verdict that reads them on hand-made results above."""
    real = experiment.control_verdict
    monkeypatch.setattr(experiment, "control_verdict", lambda sft, control: real(sft, control) | {"passed": True})
    monkeypatch.setattr(experiment, "clip_scoring", lambda gate: "contrastive")  # the random CLIP fails the gate
    arms = ["grpo", "mapo_clip"]
    argv, report = _shrunk(tiny_kit, tmp_path, arms, variance_batches=2)
    outcome = experiment.main(argv)

    results = outcome["results"]
    assert list(results) == arms
    for runs in results.values():
        (run,) = runs
        assert [step["step"] for step in run["steps"]] == [1, 2]
        assert sorted(run["evals"]) == [1, 2] and run["evals"][2]["n"] == 2
    assert set(outcome["variance"]) == set(arms)
    assert all(v["trace"] >= 0 for v in outcome["variance"].values())
    ran = (tmp_path / "out" / "rl" / "mapo_clip-seed0" / "recipe.yaml").read_text().splitlines()[1]
    assert "--semantic_verifier clip" in ran and "--semantic_score contrastive" in ran  # the gate's choice
    saved = json.loads((tmp_path / "docs" / "experiment" / "results.json").read_text())
    assert json.dumps(saved) == json.dumps(json.loads(json.dumps(outcome)))  # NaN-safe: one seed has no paired SE
    for name in ["target_seen", *experiment.CURVES]:
        assert (tmp_path / "docs" / "experiment" / f"{name}.png").stat().st_size > 1000, name
    text = report.read_text()
    assert experiment.results_hash(saved) in text
    paired = text.split("## Paired against grpo")[1].split("##")[0]
    rows = [line for line in paired.splitlines() if line.startswith("| ")][1:]  # less the header
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == arms[1:]
    final = text.split("## Final evaluation")[1].split("##")[0]
    assert "| SFT (step 0) |" in final
    assert "## Gradient variance at the SFT checkpoint" in text and "did not act measurably" in text


def test_the_demo_reads_the_verdict_from_a_report(tmp_path):
    report = tmp_path / "experiment.md"
    assert stages.experiment_verdict(report) == []
    report.write_text("# x\n\n## What would count\n\n- no\n\n## What it shows\n\n- one\n- two\n\n## Command\n\n- no\n")
    assert stages.experiment_verdict(report) == ["- one", "- two"]
