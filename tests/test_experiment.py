"""`make experiment`: aggregation across seeds, the markdown tables and plots on hand-made runs, the check that runs
differ only in estimator and seed, and a shrunk experiment from the tiny kit's policy through the real RL entry point."""

import json
import math
from dataclasses import dataclass

import pytest

from scripts import experiment
from scripts.experiment import Spread
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
    assert spread.mean == pytest.approx(0.5) and spread.std == pytest.approx(math.sqrt(0.26 / 3))
    assert experiment.across_seeds([None, float("nan")]) is None
    assert experiment.across_seeds([]) is None


def test_curves_match_steps_by_number_and_leave_missing_steps_missing():
    a = [{"step": 1, "z_mean": 0.2}, {"step": 2, "z_mean": None}, {"step": 3, "z_mean": 0.6}]
    b = [{"step": 1, "z_mean": 0.4}, {"step": 2, "z_mean": None}]  # a shorter run
    steps, spreads = experiment.curve([a, b], "z_mean")
    assert steps == [1, 2, 3]
    assert spreads[0].mean == pytest.approx(0.3) and spreads[0].std == pytest.approx(0.1) and spreads[0].n == 2
    assert spreads[1] is None
    assert (spreads[2].mean, spreads[2].n, spreads[2].of) == (0.6, 1, 2)


def test_last_steps_mean_skips_missing_values():
    steps = [{"x": 0.1}, {"x": None}, {"x": 0.3}, {"x": 0.5}]
    assert experiment.last_steps_mean(steps, "x", 3) == pytest.approx(0.4)  # (0.3 + 0.5) / 2
    assert experiment.last_steps_mean(steps, "x", 10) == pytest.approx(0.3)
    assert experiment.last_steps_mean([{"x": 0.1}, {"x": None}], "x", 1) is None
    assert experiment.last_steps_mean([{}], "x", 1) is None


def test_spreads_print_as_mean_std_and_say_when_seeds_are_missing():
    assert experiment.format_spread(Spread(0.5, 0.1234, 0.4, 0.6, 3, 3)) == "0.500 ± 0.123"
    assert experiment.format_spread(Spread(0.5, 0.0, 0.5, 0.5, 1, 3)) == "0.500 ± 0.000 (1/3 seeds)"
    assert experiment.format_spread(None) == "— (no value)"


def test_markdown_table():
    table = experiment.markdown_table(["method", "a|b"], [["grpo", 1], ["mapo", "x|y"]])
    assert table == "| method | a\\|b |\n|---|---|\n| grpo | 1 |\n| mapo | x\\|y |"
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        experiment.markdown_table(["a", "b"], [["only one"]])


def test_final_tables_have_one_row_per_method_with_hand_worked_cells():
    results = {
        "grpo": [_run(0, accuracy=[0.0, 0.5, 1.0]), _run(1, accuracy=[0.0, 0.0, 0.5])],  # last 2: 0.75, 0.25
        "mapo": [_run(0, accuracy=[0.0, 0.0, 0.0]), _run(1, accuracy=[None, None, None])],
    }
    results["mapo"][0]["eval"] = {"accuracy": 0.25, "valid_call_rate": None, "mean_z": 0.3}
    training, evaluation = experiment.final_tables(results, last_k=2)
    header, _, grpo, mapo = training.splitlines()
    column = header.split(" | ").index("accuracy")
    assert grpo.split(" | ")[column] == "0.500 ± 0.250"
    assert mapo.split(" | ")[column] == "0.000 ± 0.000 (1/2 seeds)"
    assert grpo.split(" | ")[header.split(" | ").index("mean z_t")] == "— (no value)"  # no seed logged z_t
    rows = evaluation.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| grpo", "| mapo"]
    # accuracy, valid-call rate, box holds target, mean z_t
    assert rows[1] == "| mapo | 0.250 ± 0.000 (1/2 seeds) | — (no value) | — (no value) | 0.300 ± 0.000 (1/2 seeds) |"


def test_runs_may_differ_only_in_estimator_seed_and_output_dir():
    @dataclass
    class Config:
        advantage_estimator: str
        seed: int
        output_dir: str
        learning_rate: float = 1e-4

    same = {
        ("grpo", 0): (Config("grpo", 0, "a"),),
        ("mapo", 1): (Config("mapo", 1, "b"),),
    }
    assert experiment.check_shared(same) == {"learning_rate": 1e-4}
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


def test_a_hand_written_what_it_shows_section_survives_regeneration(tmp_path):
    report = tmp_path / "experiment.md"
    assert experiment.kept_section(report) is None
    report.write_text(f"# x\n\n{experiment.WHAT_IT_SHOWS}\n\n{experiment.PLACEHOLDER}\n")
    assert experiment.kept_section(report) is None
    report.write_text(f"# x\n\n{experiment.WHAT_IT_SHOWS}\n\nMAPO raises z_t.\n\nSecond paragraph.\n")
    assert experiment.kept_section(report) == "MAPO raises z_t.\n\nSecond paragraph."


# ---------------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_a_shrunk_experiment_writes_its_tables_and_plots(tiny_kit, tmp_path):
    """The tiny kit's random policy stands in for the SFT checkpoint: it makes no tool call, so the run also shows
    that missing figures (no z_t, no valid-call rate) are reported, not crashed on."""
    data = stages.make_data(tmp_path / "data", train_rows=4, test_rows=2)
    report = tmp_path / "docs" / "experiment.md"
    methods = ["grpo", "mapo", "hpo"]
    argv = ["--methods", *methods, "--seeds", "0", "--rl_steps", "2", "--eval_rows", "1", "--last_k", "2"]
    argv += ["--sft_model", str(tiny_kit["policy"]), "--data", str(data), "--clip", str(tiny_kit["clip"])]
    argv += ["--output_dir", str(tmp_path / "out"), "--report", str(report)]
    results = experiment.main(argv)

    assert list(results) == methods
    for runs in results.values():
        (run,) = runs
        assert [step["step"] for step in run["steps"]] == [1, 2]
        assert all(step["grad_norm_var"] is not None for step in run["steps"])  # the probe ran at every step
        assert run["eval"]["accuracy"] is not None and run["eval"]["chance_by_source"]
    assert all(step["hpo_fallback_frac"] is not None for step in results["hpo"][0]["steps"])
    assert all(step["hpo_fallback_frac"] is None for step in results["grpo"][0]["steps"])
    assert json.loads((tmp_path / "docs" / "experiment" / "results.json").read_text()) == json.loads(
        json.dumps(results)
    )

    for metric in experiment.CURVES:
        png = tmp_path / "docs" / "experiment" / f"{metric}.png"
        assert png.stat().st_size > 1000, png
    text = report.read_text()
    tables = [block for block in text.split("\n\n") if block.startswith("| method |")]
    assert len(tables) == 2
    for table in tables:
        assert [row.split(" | ")[0].removeprefix("| ") for row in table.splitlines()[2:]] == methods
    assert "experiment/z_mean.png" in text and experiment.PLACEHOLDER in text
    assert "no zoom-in call" in text.split("## Warnings")[1]  # the random policy never calls the tool
