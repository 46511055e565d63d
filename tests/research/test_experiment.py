"""`make experiment-curves`: aggregation across seeds, the statistics and the verdict on hand-made results (numbers
worked out by hand), the check that runs differ only in the arm's fields and the seed, the positive control's record
checked against the run, the plots, and a shrunk experiment from the tiny kit's policy through the real RL entry
point, two runs side by side: every arm's tables and plots."""

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers.trainer_utils import SchedulerType

from evaluation.verifier_check import GateResult
from research import curve_report, experiment, runs
from research.curve_stats import ACTED, DID_NOT_ACT, INCONCLUSIVE, Plan, load_plan
from research.report import markdown_table
from research.runs import Spread
from tests.tolerance import FLOAT64, HAND_TERMS, approx
from tiny import stages


def _run(seed: int, **series) -> dict:
    """A run whose steps 1..n carry the given per-step series (other figures missing)."""
    length = max(len(values) for values in series.values())
    steps = [{"step": i + 1, **{name: values[i] for name, values in series.items()}} for i in range(length)]
    return {"seed": seed, "steps": steps, "eval": None}


# ---------------------------------------------------------------------------------------------------- aggregation
def test_across_seeds_is_mean_and_population_std_of_the_seeds_with_a_value():
    assert runs.across_seeds([1.0, 3.0, None]) == Spread(mean=2.0, std=1.0, low=1.0, high=3.0, n=2, of=3)
    spread = runs.across_seeds([0.2, 0.4, 0.9])  # mean 0.5; deviations -0.3, -0.1, 0.4: var 0.26 / 3
    assert spread.mean == approx(0.5, FLOAT64, terms=HAND_TERMS, scale=1.0) and spread.std == approx(
        math.sqrt(0.26 / 3), FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert runs.across_seeds([None, float("nan")]) is None
    assert runs.across_seeds([]) is None


def test_curves_match_steps_by_number_and_leave_missing_steps_missing():
    a = [{"step": 1, "z_mean": 0.2}, {"step": 2, "z_mean": None}, {"step": 3, "z_mean": 0.6}]
    b = [{"step": 1, "z_mean": 0.4}, {"step": 2, "z_mean": None}]  # a shorter run
    steps, spreads = runs.curve([a, b], "z_mean")
    assert steps == [1, 2, 3]
    assert (
        spreads[0].mean == approx(0.3, FLOAT64, terms=HAND_TERMS, scale=1.0)
        and spreads[0].std == approx(0.1, FLOAT64, terms=HAND_TERMS, scale=1.0)
        and spreads[0].n == 2
    )
    assert spreads[1] is None
    assert (spreads[2].mean, spreads[2].n, spreads[2].of) == (0.6, 1, 2)


def test_binned_curves_average_each_runs_steps_over_windows_and_the_band_is_the_standard_error():
    a = [{"step": s, "m": v} for s, v in zip(range(1, 6), [0.0, 1.0, None, 0.5, 0.25])]
    b = [{"step": s, "m": v} for s, v in zip(range(1, 5), [1.0, 1.0, 0.0, 0.0])]
    steps, spreads = runs.curve([a, b], "m", window=2)
    # a: steps 1-2 -> 0.5, 3-4 -> 0.5 (its None left out), 5 -> 0.25 (at step 6); b: 1.0, 0.0, nothing at 6.
    assert steps == [2, 4, 6]
    assert (spreads[0].mean, spreads[0].std) == (0.75, 0.25) and (spreads[1].mean, spreads[1].std) == (0.25, 0.25)
    assert (spreads[2].mean, spreads[2].n, spreads[2].of) == (0.25, 1, 2)
    # SE of the mean: sample std / sqrt(n) = population std / sqrt(n - 1): 0.25 / 1 with two seeds.
    assert spreads[0].se == 0.25 and math.isnan(spreads[2].se)
    assert Spread(0.5, 0.3, 0.1, 0.9, 4, 4).se == approx(0.3 / math.sqrt(3), FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert runs.binned({1: 0.2, 2: None}, 1) == {1: 0.2, 2: None}  # window 1: as logged


def test_spreads_print_as_mean_std_and_say_when_seeds_are_missing():
    assert runs.format_spread(Spread(0.5, 0.1234, 0.4, 0.6, 3, 3)) == "0.500 ± 0.123"
    assert runs.format_spread(Spread(0.5, 0.0, 0.5, 0.5, 1, 3)) == "0.500 ± 0.000 (1/3 seeds)"
    assert runs.format_spread(None) == "— (no value)"


def test_markdown_table():
    table = markdown_table(["method", "a|b"], [["grpo", 1], ["mapo", "x|y"]])
    assert table == "| method | a\\|b |\n|---|---|\n| grpo | 1 |\n| mapo | x\\|y |"
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        markdown_table(["a", "b"], [["only one"]])


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
    path = runs.plot_curves(curves, "mean z_t", tmp_path / "figs" / "z_mean.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------- statistics
def test_binomial_and_difference_standard_errors():
    assert runs.binomial_se(0.5, 100) == approx(0.05, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert runs.binomial_se(0.0, 10) == 0.0
    assert runs.difference_se(0.5, 0.5, 100) == approx(math.sqrt(0.05**2 * 2), FLOAT64, terms=HAND_TERMS, scale=1.0)


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
    assert runs.row_metrics(records) == {"n": 4, "target_seen": 0.5, "named_and_seen": 0.25, "outcomes": [1, 1, 0, 0]}


ROWS = 100
# The plan's rule at 3 seeds and 100 rows; 2,000 bootstrap replicates keep the tests fast, and every interval below is
# far from the bar it is read against (or exactly 0, when the rows do not differ).
PLAN = Plan(("grpo", "mapo_walk", "mapo_density"), "mapo_walk", "grpo", "mapo_density", (0, 1, 2), ROWS, 2000, 0,
            0.05, 0.02)  # fmt: skip


def _outcomes(rate: float) -> list[int]:
    """100 rows, the first `rate` of them seen: two arms' rows differ only between their two rates."""
    seen = round(rate * ROWS)
    return [1] * seen + [0] * (ROWS - seen)


def _results(**finals):
    """Arms whose one-evaluation runs end with the given target-seen per seed, row by row (`_outcomes`)."""
    return {
        arm: [{"seed": s, "evals": {10: {"target_seen": v, "outcomes": _outcomes(v)}}} for s, v in enumerate(values)]
        for arm, values in finals.items()
    }


def test_the_verdict_is_the_plans_rule_on_every_rows_outcome_paired_by_seed():
    grpo = [0.30, 0.35, 0.40]
    acted = curve_report.judge(_results(grpo=grpo, mapo_walk=[0.50, 0.52, 0.61], mapo_density=[0.31, 0.33, 0.42]),
                               PLAN)  # fmt: skip
    walk = acted["over_reference"]["mapo_walk"]
    # diffs 0.20, 0.17, 0.21: mean 0.19333; sample sd sqrt((0.00667^2 + 0.02333^2 + 0.01667^2) / 2) = 0.020817, SE
    # 0.012019, t = 16.09 with 2 df against 4.303; every bootstrap replicate's mean is positive (rows differ only by +1).
    assert walk["diffs"] == approx([0.20, 0.17, 0.21], FLOAT64, terms=HAND_TERMS, scale=1.0)
    mean = 0.58 / 3
    se = math.sqrt(((0.20 - mean) ** 2 + (0.17 - mean) ** 2 + (0.21 - mean) ** 2) / 2 / 3)
    assert walk["se"] == approx(se, FLOAT64, terms=HAND_TERMS, scale=1.0) and round(se, 6) == 0.012019
    assert walk["df"] == 2 and walk["call"] == "above" and walk["lo"] > 0
    assert acted["over_density"]["mapo_walk"]["call"] == "above" and acted["verdict"] == ACTED
    assert acted["over_reference"]["mapo_density"]["call"] != "above"  # +0.01, -0.02, +0.02
    # A bonus of the same density does as well: walk minus density is 0 on every row, an interval of [0, 0].
    same = curve_report.judge(_results(grpo=grpo, mapo_walk=[0.50, 0.52, 0.61], mapo_density=[0.50, 0.52, 0.61]),
                              PLAN)  # fmt: skip
    assert same["over_density"]["mapo_walk"]["hi"] == 0 and same["verdict"] == DID_NOT_ACT
    # +0.04 on every seed: the old bar (two evaluations' binomial SE, ~0.07) said "did not beat"; paired by seed
    # and row it is above, and without a density control the verdict cannot be more than inconclusive.
    small = curve_report.judge(_results(grpo=grpo, mapo_walk=[0.34, 0.39, 0.44]), PLAN)
    assert small["over_reference"]["mapo_walk"]["call"] == "above" and small["over_density"] == {}
    assert small["verdict"] == INCONCLUSIVE
    worse = curve_report.judge(_results(grpo=grpo, mapo_walk=[0.1, 0.15, 0.2], mapo_density=grpo), PLAN)
    assert worse["over_reference"]["mapo_walk"]["mean"] == approx(-0.2, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert worse["over_reference"]["mapo_walk"]["call"] == "below" and worse["verdict"] == DID_NOT_ACT
    noisy = curve_report.judge(_results(grpo=grpo, mapo_walk=[0.40, 0.27, 0.42], mapo_density=grpo), PLAN)
    assert noisy["over_reference"]["mapo_walk"]["call"] == "undecided" and noisy["verdict"] == INCONCLUSIVE


def _gate(passed_cosine: bool) -> dict:
    return {
        "clip": {
            "contrastive": GateResult("contrastive", 8, 4, 0.6, 2.0, 0.1, "the sign", 0.2, 0.5, False),
            "cosine": GateResult("cosine", 8, 4, 0.8, 1.5, 0.3, "the sign", 0.2, 0.25, passed_cosine),
        }
    }


def test_the_clip_arm_trains_under_the_first_scoring_that_passes_else_the_higher_auc():
    assert experiment.clip_scoring(_gate(True)["clip"]) == ("cosine", True)
    assert experiment.clip_scoring(_gate(False)["clip"]) == ("cosine", False)  # AUC 0.8 against 0.6
    both = {
        how: r.__class__(*(how, 8, 4, 0.7, 2.0, 0.1, "x", 0.2, 0.5, True)) for how, r in _gate(True)["clip"].items()
    }
    assert experiment.clip_scoring(both) == ("contrastive", True)  # GATE_SCORES' order


CONTROL = {
    "start": {"sft": "outputs/positive_control/sft/checkpoint-800", "data": "d", "clip": "c"},
    "command": "python -m research.positive_control --image_side 768 --sft_learning_rate 1e-3 --sft_steps 1200 "
    "--sft_start_step 800 --rl_steps 200",
    "passed": True,
    "fields": {"learning_rate": 0.0001, "temperature": 0.7, "max_steps": 200, "reward_funcs": ["target_in_view"]},
    "rows": 128,
    "sft": {"target_seen": 0.391},
    "per_seed": {"0": {"after": 0.633, "rise": 0.242, "passed": True, "before": 0.391, "se": 0.061}},
    "runs": [{"seed": 0, "evals": {"200": {"target_seen": 0.633, "n": 128}}}],
}
WORLD = {"image_side": 768, "sft_learning_rate": 0.001, "sft_steps": 1200, "sft_start_step": 800}


def test_the_control_record_stops_the_arms_unless_it_passed_in_this_world_at_these_settings(tmp_path):
    fields = {k: CONTROL["fields"].get(k) for k in experiment.CONTROL_FIELDS}
    ours = experiment.Start(tmp_path / "sft" / "checkpoint-800", tmp_path / "data", tmp_path / "clip")
    assert experiment.control_check(CONTROL, fields, WORLD, ours) == []  # made here, in the same world
    assert experiment.command_flags(CONTROL["command"], ["sft_steps", "seeds"]) == {"sft_steps": "1200", "seeds": None}
    problems = experiment.control_check(CONTROL | {"passed": False}, fields | {"temperature": 1.0},
                                        WORLD | {"sft_start_step": 900}, ours)  # fmt: skip
    assert problems[0] == "the positive control did not pass"
    assert "'sft_start_step': ('800', 900)" in problems[1] and "'temperature': (0.7, 1.0)" in problems[2]
    # The control's own checkpoint: its world is its own, whatever this run's flags say.
    theirs = experiment.Start(*(Path(CONTROL["start"][k]) for k in ("sft", "data", "clip")))
    assert experiment.control_check(CONTROL, fields, WORLD | {"image_side": 0}, theirs) == []
    assert experiment.control_check(None, fields, WORLD, ours) == ["no record of the positive control"]


def test_the_controls_start_is_reused_only_when_it_exists_and_was_made_in_this_world(tmp_path):
    paths = {k: tmp_path / k for k in ("sft", "data", "clip")}
    record = CONTROL | {"start": {k: str(v) for k, v in paths.items()}}
    assert experiment.control_start(record, WORLD) is None  # not made yet
    for path in paths.values():
        path.mkdir()
    assert experiment.control_start(record, WORLD) == experiment.Start(*paths.values())
    assert experiment.control_start(record, WORLD | {"sft_learning_rate": 3e-3}) is None
    assert experiment.control_start(None, WORLD) is None


def _outcome(results: dict, clip=("cosine", True), departures=()) -> dict:
    control = experiment.control_summary(CONTROL, Path("r/positive_control/results.json"), [])
    return {"judged": curve_report.judge(results, PLAN), "sft": {"named_and_seen": 0.0}, "control": control,
            "clip": clip, "departures": list(departures)}  # fmt: skip


def test_what_it_shows_is_written_from_the_verdict_the_control_and_the_gate():
    results = _results(grpo=[0.30, 0.35, 0.40], mapo_walk=[0.50, 0.52, 0.61], mapo_density=[0.31, 0.33, 0.42])
    text = "\n".join(curve_report.what_it_shows(_outcome(results), _gate(True), PLAN))
    assert "`r/positive_control.md`" in text and "0.391 (SFT) → 0: 0.633 by seed: passed" in text
    assert "**Verdict: MAPO's signal acted.**" in text and "not label grounding" in text
    assert "`mapo_walk` − `grpo`: +0.193 (SE 0.012, t = 16.09 with 2 df; bootstrap [+" in text
    assert "`mapo_walk` − `mapo_density`: +0.190" in text and "`mapo_density` − `grpo`: +0.003" in text
    assert "`mapo_clip` did not run" in text and "departs from the plan" not in text
    results = _results(grpo=[0.3, 0.35, 0.4], mapo_walk=[0.40, 0.27, 0.42], mapo_clip=[0.2, 0.25, 0.3])
    shown = _outcome(results, ("cosine", False), ["seeds 0, 1, 2 (planned: 0 to 7)"])
    text = "\n".join(curve_report.what_it_shows(shown, _gate(False), PLAN))
    assert "**Verdict: inconclusive**" in text and "the smallest difference this run could detect" in text
    assert "`mapo_walk` − `mapo_density`: not run" in text and "**This run departs from the plan** (seeds" in text
    assert "failed the gate (trained under `cosine`, its best AUC)" in text
    assert "`mapo_clip` − `grpo`: -0.100 (SE 0.000" in text and ": below" in text
    results = _results(grpo=[0.3, 0.35, 0.4], mapo_walk=[0.5, 0.52, 0.61], mapo_density=[0.5, 0.52, 0.61])
    text = "\n".join(curve_report.what_it_shows(_outcome(results), _gate(False), PLAN))
    assert "**Verdict: MAPO's signal did not act here**" in text and "a bonus of the same density" in text


def test_the_results_hash_changes_with_any_result():
    a = {"results": _results(grpo=[0.3])}
    b = {"results": _results(grpo=[0.31])}
    assert runs.results_hash(a) == runs.results_hash(json.loads(json.dumps(a)))
    assert runs.results_hash(a) != runs.results_hash(b)


# ---------------------------------------------------------------------------------------------------- end to end
def _shrunk(tiny_kit, tmp_path, arms, passed=True):
    """A shrunk experiment's argv and report, from the tiny kit's policy, with a control record that names that start
    and holds the shrunk run's settings."""
    data = stages.make_data(tmp_path / "data", train_rows=4, test_rows=2)
    report = tmp_path / "docs" / "experiment.md"
    recipe = vars(stages.rl_args(["--config", experiment.RECIPE])[1]) | {"max_steps": 2}
    fields = {k: getattr(recipe[k], "value", recipe[k]) for k in experiment.CONTROL_FIELDS}
    start = {"sft": str(tiny_kit["policy"]), "data": str(data), "clip": str(tiny_kit["clip"])}
    control = tmp_path / "control" / "results.json"
    control.parent.mkdir()
    control.write_text(json.dumps(CONTROL | {"start": start, "fields": fields, "passed": passed}))
    argv = ["--arms", *arms, "--seeds", "0", "--rl_steps", "2", "--eval_every", "1", "--gate_rows", "2"]
    argv += ["--sft_model", start["sft"], "--data", start["data"], "--clip", start["clip"], "--control", str(control)]
    argv += ["--output_dir", str(tmp_path / "out"), "--report", str(report), "--jobs", "2"]
    return argv, report


def test_a_control_that_did_not_pass_stops_the_experiment_before_anything_is_made(tiny_kit, tmp_path):
    argv, report = _shrunk(tiny_kit, tmp_path, ["grpo", "mapo_walk"], passed=False)
    with pytest.raises(SystemExit, match=r"positive control \(.*results\.json\): the positive control did not pass"):
        experiment.main(argv)
    assert not report.exists() and not (tmp_path / "out").exists()
    with pytest.raises(SystemExit, match=r"no record of the positive control"):
        experiment.main([*argv, "--control", str(tmp_path / "none.json")])


@pytest.mark.slow
def test_a_shrunk_experiment_writes_every_arm_the_paired_table_and_the_plots(tiny_kit, tmp_path, monkeypatch):
    """The reference arm and the gate's clip arm, 1 seed, 2 steps, side by side in two worker processes, evaluated
    at steps 1 and 2. Every arm is one more `rl.py` launch (~30 s of the suite on 2 cores), so the other arms are
    covered where they are cheaper: the walk verifier, its density and shuffled controls in MAPOTrainer on scripted
    rollouts (tests/test_mapo_trainer.py), HPO's arms in tests/test_hpo_trainer.py, and the verdict that reads them on
    hand-made results above."""
    arms = ["grpo", "mapo_clip"]
    argv, report = _shrunk(tiny_kit, tmp_path, arms)
    outcome = experiment.main(argv)

    results = outcome["results"]
    assert list(results) == arms
    for arm, arm_runs in results.items():
        (run,) = arm_runs
        assert [step["step"] for step in run["steps"]] == [1, 2]
        assert sorted(run["evals"]) == [1, 2] and run["evals"][2]["n"] == 2 and run["seconds"] > 0
        assert len(run["evals"][2]["outcomes"]) == 2 and set(run["evals"][2]["outcomes"]) <= {0, 1}
        # CPU time counts rl.py's (a child process) as well as the evaluations': more than the run's own process.
        assert run["cpu_seconds"] > 0
        cache = json.loads((tmp_path / "out" / "runs" / f"{arm}-seed0.json").read_text())
        assert cache["argv"] == [str(a) for a in cache["argv"]] and cache["result"]["seed"] == 0
    assert outcome["cpu_seconds"] == approx(sum(r[0]["cpu_seconds"] for r in results.values()), FLOAT64, terms=2,
                                            scale=outcome["cpu_seconds"])  # fmt: skip
    how, passed = outcome["clip"]  # the random CLIP: whatever its gate said, the arm ran under the scoring it chose
    ran = (tmp_path / "out" / "rl" / "mapo_clip-seed0" / "recipe.yaml").read_text().splitlines()[1]
    assert "--semantic_verifier clip" in ran and f"--semantic_score {how}" in ran
    saved = json.loads((tmp_path / "docs" / "experiment" / "results.json").read_text())
    assert json.dumps(saved) == json.dumps(json.loads(json.dumps(outcome)))  # NaN-safe: one seed has no paired SE
    for name in ["target_seen", *curve_report.CURVES]:
        assert (tmp_path / "docs" / "experiment" / f"{name}.png").stat().st_size > 1000, name
    text = report.read_text()
    assert runs.results_hash(saved) in text
    paired = text.split("## Paired differences")[1].split("##")[0]
    rows = [line for line in paired.splitlines() if line.startswith("| ")][1:]  # less the header
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == ["mapo_clip − grpo"]
    assert "| SFT (step 0) |" in text.split("## Final evaluation")[1].split("##")[0]
    assert "| 0 | 0.391 | 0.633 | +0.242 | yes |" in text.split("## Positive control")[1]
    assert "**Verdict: " in text and "2 run(s) at a time, one torch thread each" in text
    assert "**This run departs from the plan** (arms grpo, mapo_clip (planned: " in text
    assert "2 held-out rows (planned: 512)" in text and "experiment_curves.json, first committed in " in text
    # target_in_view is logged at weight 0: the runs' training curves have it, and it paid nothing.
    assert all("target_in_view" in step for step in results["grpo"][0]["steps"])
    assert "| `reward_weights` | `[1.0, 0.0]` |" in text

    # Resumed: every run is cached under the same command, rows and start, so nothing trains again and the results
    # are the same; a run whose command changed (no checkpoints saved) is not reused.
    started = []
    monkeypatch.setattr(experiment, "train_and_evaluate_all", lambda jobs, workers: started.extend(jobs) or [])
    again = experiment.main(argv)
    assert started == [] and json.dumps(again["results"]) == json.dumps(outcome["results"])
    monkeypatch.setattr(experiment, "train_and_evaluate_all", lambda jobs, workers: started.extend(jobs) or [
        outcome["results"][job.name.split()[0]][0] for job in jobs])  # fmt: skip
    experiment.main([*argv, "--eval_every", "0"])
    assert sorted(job.name for job in started) == ["grpo seed 0", "mapo_clip seed 0"]


def test_the_demo_reads_the_verdict_from_a_report(tmp_path):
    report = tmp_path / "experiment.md"
    assert stages.experiment_verdict(report) == []
    report.write_text("# x\n\n## What would count\n\n- no\n\n## What it shows\n\n- one\n- two\n\n## Command\n\n- no\n")
    assert stages.experiment_verdict(report) == ["- one", "- two"]


def test_readme_and_the_demo_page_quote_the_curves_verdict_with_its_figures():
    """The learning-curve verdict as the committed results.json gives it, its qualifier and the smallest difference the
    run could detect with it, in both pages that quote it (issue 60: each verdict with its qualifier); a rerun that
    moves a figure fails here until the pages follow."""
    record = json.loads((stages.REPO / "research/reports/experiment_curves/results.json").read_text(encoding="utf-8"))
    judged, plan = record["judged"], load_plan(stages.REPO / record["plan"])
    walk = judged["over_reference"][plan.primary]
    detectable = max(c["detectable"] for c in (walk, judged["over_density"][plan.primary]))
    quote = (
        f"MAPO with the walk verifier ends {walk['mean']:+.3f} against GRPO (SE {walk['se']:.3f}, t = {walk['t']:.2f} "
        f"with {walk['df']} df; bootstrap [{walk['lo']:+.3f}, {walk['hi']:+.3f}]) over {len(walk['seeds'])} seeds and "
        f"{plan.eval_rows} held-out rows: {judged['verdict']} by the plan's rule (the run could detect "
        f"{detectable:.3f} with 80% power)"
    )
    for page in ("README.md", "docs/demo.md"):
        assert quote in " ".join((stages.REPO / page).read_text(encoding="utf-8").split()), page


# ---------------------------------------------------------------------------------------------------- the plan
def test_the_plan_sets_the_arms_seeds_and_rows_and_a_departure_is_named():
    args = experiment.parse_args([])
    plan = args.plan_read
    assert args.arms == list(plan.arms) and args.seeds == list(plan.seeds) and args.eval_rows == plan.eval_rows
    assert args.test_rows == plan.eval_rows  # the made data holds every evaluated row
    assert experiment.departures(args, plan.eval_rows) == []
    shrunk = experiment.parse_args(["--arms", "grpo", "mapo_walk", "--seeds", "0", "1"])
    assert experiment.departures(shrunk, 128) == [
        "arms grpo, mapo_walk (planned: grpo, mapo_walk, mapo_density, mapo_clip)",
        "seeds 0, 1 (planned: 0, 1, 2, 3, 4, 5, 6, 7)",
        "128 held-out rows (planned: 512)",
    ]
    with pytest.raises(SystemExit):
        experiment.parse_args(["--arms", "mapo_walk"])  # no reference to pair against


def test_runs_start_seed_by_seed_with_the_arm_outside_the_verdict_last():
    order = experiment.run_order(["grpo", "mapo_clip", "mapo_walk"], [0, 1])
    assert order == [("grpo", 0), ("mapo_walk", 0), ("grpo", 1), ("mapo_walk", 1), ("mapo_clip", 0), ("mapo_clip", 1)]


@pytest.mark.process
def test_the_report_quotes_the_commit_that_added_the_plan():
    origin = experiment.plan_origin(Path("research/plans/experiment_curves.json"))
    assert origin.startswith("research/plans/experiment_curves.json, first committed in ") and " on 2026-" in origin
    assert experiment.plan_origin(Path("no/such/plan.json")) == "no/such/plan.json"


def test_the_output_dir_is_absolute_so_a_relative_and_an_absolute_name_share_the_cache(tmp_path, monkeypatch):
    """A run's cache key is its command line, which holds paths under --output_dir: `make experiment-curves`
    (relative) and a resume naming the directory absolutely must find the same runs. The report names them from the
    working directory, not the machine's layout."""
    where = tmp_path / "outputs/experiment"
    relative = experiment.parse_args(["--output_dir", os.path.relpath(where)]).output_dir
    absolute = experiment.parse_args(["--output_dir", str(where)]).output_dir
    assert relative == absolute == where
    monkeypatch.chdir(tmp_path)
    assert experiment.shown(where / "sft") == Path("outputs/experiment/sft")
    assert experiment.shown(Path("/elsewhere/sft")) == Path("/elsewhere/sft")
    assert experiment.shown(Path("outputs/x")) == Path("outputs/x")


def test_a_cached_run_is_reused_only_under_the_same_command_rows_and_start(tmp_path):
    start = runs.Start(tmp_path / "sft", tmp_path / "data", tmp_path / "clip")
    for path in vars(start).values():
        path.mkdir()
        (path / "weights").write_bytes(b"a")
    digest = runs.start_digest(start)
    key = runs.cache_key(["--seed", "0"], 512, digest)
    job = runs.Job(["--seed", "0"], start, tmp_path / "eval", 512, "grpo seed 0", 0, tmp_path / "runs" / "g.json", key)
    assert runs.cached(job) is None  # nothing saved yet
    job.cache.parent.mkdir()
    job.cache.write_text(json.dumps({"key": key, "result": {"seed": 0, "evals": {"200": {"outcomes": [1, 0]}}}}))
    assert runs.cached(job) == {"seed": 0, "evals": {200: {"outcomes": [1, 0]}}}  # steps back to integers
    assert key != runs.cache_key(["--seed", "1"], 512, digest) != runs.cache_key(["--seed", "0"], 128, digest)
    (start.sft / "weights").write_bytes(b"b")  # the SFT checkpoint remade with other weights
    assert runs.start_digest(start) != digest
    assert runs.cached(dataclasses.replace(job, key=runs.cache_key(job.argv, 512, runs.start_digest(start)))) is None
