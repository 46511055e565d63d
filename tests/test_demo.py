"""`make demo`: the summary's pieces on hand-made inputs (chance levels, the per-step RL log, the zero-signal
warnings), and the whole pipeline shrunk: every stage runs through the real entry points and the summary is written."""

import json
import sys
from pathlib import Path

import pytest

from data.synthetic import DEFAULT_OBJECT_FRACTION, QUESTION_TYPES, chance_accuracy
from scripts import demo
from tests.tolerance import FLOAT64, approx
from tiny import stages
from utils.recipes import load_recipe


def test_the_demo_draws_the_world_the_tiny_recipes_train_on(tmp_path):
    sft, rl = load_recipe(stages.SFT_RECIPE).values, load_recipe(stages.RL_RECIPE).values
    world_keys = sorted(key for key in sft.keys() | rl.keys() if key.startswith("synthetic_"))
    assert world_keys == ["synthetic_image_size", "synthetic_region_hint"]  # the rest at their defaults
    assert {key: sft.get(key) for key in world_keys} == {key: rl.get(key) for key in world_keys}
    assert stages.recipe_world() == {
        "min_size": 600,
        "max_size": 900,
        "object_fraction": DEFAULT_OBJECT_FRACTION,
        "question_types": QUESTION_TYPES,
        "region_hint": True,
    }
    recipe = tmp_path / "edited.yaml"  # a recipe's edits reach the data the demo makes
    recipe.write_text(f"base: {Path(stages.SFT_RECIPE).resolve()}\nsynthetic_region_hint: false\n")
    assert stages.recipe_world(str(recipe))["region_hint"] is False


def _stage(**values) -> dict:
    metrics = {key: 0.5 for key in stages.SUMMARY_KEYS} | {"accuracy_by_source": {}, "chance_by_source": {}}
    return metrics | values


def _step(step: int, **values) -> dict:
    return {"step": step, **dict.fromkeys(stages.STEP_METRICS)} | values


def test_chance_is_the_mean_over_the_evaluated_rows_per_source():
    records = [
        {"source": "synthetic/colour", "options": ["a", "b", "c", "d"]},  # 1/4
        {"source": "synthetic/colour", "options": []},  # open: one of the colours
        {"source": "synthetic/position", "options": []},  # open: 1/2
    ]
    overall, by_source = stages.chance_by_source(records)
    open_colour = chance_accuracy("synthetic/colour")
    assert by_source == {
        "synthetic/colour": approx((0.25 + open_colour) / 2, FLOAT64, terms=2),
        "synthetic/position": 0.5,
    }
    assert overall == approx((0.25 + open_colour + 0.5) / 3, FLOAT64, terms=4)
    assert stages.chance_by_source([]) == (None, {})


def test_the_rl_overview_by_hand():
    steps = [
        _step(1, r_sem=0.0, calls_per_rollout=0.0),  # no call: no valid-call rate
        _step(2, r_sem=0.3, valid_call_rate=0.5, calls_per_rollout=1.0),
        _step(3, r_sem=-0.1, valid_call_rate=1.0, calls_per_rollout=2.0),
    ]
    assert stages.rl_overview(steps) == {
        "steps": 3,
        "r_sem_mean": approx(0.2 / 3, FLOAT64, terms=4, scale=0.4),  # (0 + 0.3 - 0.1) / 3: sums cancel
        "r_sem_nonzero_steps": 2,
        "valid_call_rate_mean": 0.75,
        "calls_per_rollout_mean": 1.0,
    }
    assert stages.rl_overview([])["r_sem_mean"] is None


def test_the_step_log_derives_the_valid_call_rate_and_keeps_missing_figures_missing():
    history = [
        {"step": 1, stages.SEMANTIC_KEY: 0.0, "tools/zoom_calls_per_rollout": 0.0, "reward_std": 0.0},  # no call
        {"step": 2, stages.SEMANTIC_KEY: 0.3, "semantic/z_mean": 0.6, "tools/zoom_error_rate": 0.25},
        {"step": 2, "train_runtime": 9.0},  # the closing entry is no step
    ]
    first, second = stages.rl_step_log(history)
    assert first["valid_call_rate"] is None and first["z_mean"] is None and first["reward_std"] == 0.0
    assert second["valid_call_rate"] == approx(0.75, FLOAT64, terms=2) and second["z_mean"] == 0.6
    assert stages.rl_endpoint(second) == {
        stages.SEMANTIC_KEY: 0.3,
        "tools/zoom_calls_per_rollout": None,
        "valid_call_rate": approx(0.75, FLOAT64, terms=2),
    }


def test_signal_warnings_name_every_zero_signal_stage():
    summary = {
        "eval": {
            "base": _stage(valid_call_rate=None, calls_per_sample=0.0),  # no call at all
            "sft": _stage(valid_call_rate=0.0, calls_per_sample=1.0),  # calls, none valid
            "rl": _stage(),
        },
        "rl_steps": [
            _step(1, r_sem=0.0, z_mean=None, calls_per_rollout=0.0),
            _step(2, r_sem=0.2, z_mean=None, calls_per_rollout=0.0),  # R_sem with no scored call: still no z_t
        ],
    }
    warnings = stages.signal_warnings(summary)
    assert len(warnings) == 4
    assert warnings[0].startswith("eval 'base': no zoom-in call")
    assert warnings[1].startswith("eval 'sft': zoom-in calls, none of them valid")
    assert "R_sem was zero" in warnings[2] and "2 steps" in warnings[2]
    assert "no zoom-in call in any" in warnings[3]
    assert stages.signal_warnings({"rl_steps": []}) == ["RL: no training step was logged"]
    flat = {"figure": "target_seen", "sft": 0.3, "rl": 0.35, "rise": 0.05, "se": 0.0625}  # 0.05 <= 1 SE
    (warning,) = stages.signal_warnings({"rl_gain": flat})
    assert warning.startswith("RL: target_seen rose +0.050 (0.300 -> 0.350), not more than its standard error")
    assert stages.signal_warnings({"rl_gain": flat | {"rise": -0.05}})  # a fall is no rise


def test_signal_warnings_stay_quiet_when_every_stage_has_signal():
    summary = {
        "eval": {"base": _stage(), "rl": _stage(valid_call_rate=0.1)},
        "rl_steps": [
            _step(1, r_sem=0.0, z_mean=None, calls_per_rollout=0.0),
            _step(2, r_sem=0.1, z_mean=0.3, calls_per_rollout=1.0),  # one step with signal is enough
        ],
    }
    assert stages.signal_warnings(summary) == []
    assert stages.signal_warnings({}) == []
    risen = {"figure": "target_seen", "sft": 0.3, "rl": 0.4, "rise": 0.1, "se": 0.0625}  # 1.6 SE
    unscored = {"figure": "target_seen", "sft": None, "rl": 0.4, "rise": None, "se": None}  # its own warning
    assert stages.signal_warnings({"rl_gain": risen}) == stages.signal_warnings({"rl_gain": unscored}) == []


def _summary() -> dict:
    stage = {key: 0.5 for key in stages.SUMMARY_KEYS} | {
        "chance": 0.25,
        "accuracy_by_source": {"synthetic/count": 0.5},
    }
    return {
        "clip_verifier": {"top1_colour": 0.9, "steps": 300},
        "eval": {"base": stage | {"accuracy": 0.125, "chance_by_source": {"synthetic/count": 0.2}}},
        "rl_overview": {"steps": 2, "r_sem_mean": 0.095, "r_sem_nonzero_steps": 2, "valid_call_rate_mean": 0.94,
                        "calls_per_rollout_mean": 1.0},
        "rl_first_step": {"valid_call_rate": 0.5},
        "rl_last_step": {"valid_call_rate": 1.0},
        "rl_gain": {"figure": "target_seen", "decoding": "sampled at 1.0", "rows": 16, "sft": 0.25, "rl": 0.5,
                    "rise": 0.25, "se": 0.165},
        "rl_gain_greedy": {"figure": "target_seen", "decoding": "greedy", "rows": 8, "sft": None, "rl": 0.5,
                           "rise": None, "se": None},
        "warnings": ["RL: R_sem was zero"],
        "seconds": {"total": 61.0},
    }  # fmt: skip


def test_the_rl_gain_is_the_rise_in_box_hit_with_the_standard_error_of_a_difference_by_hand():
    gain = demo.rl_gain({"target_seen": 0.25}, {"target_seen": 0.5}, 16)
    # sqrt(0.25 * 0.75 / 16 + 0.5 * 0.5 / 16) = sqrt(0.4375 / 16) = sqrt(0.02734375)
    assert gain["rise"] == 0.25 and gain["se"] == approx(0.02734375**0.5, FLOAT64, terms=4)
    assert gain["sft"] == 0.25 and gain["rl"] == 0.5 and gain["figure"] == "target_seen"
    assert gain["decoding"] == "greedy" and gain["rows"] == 16
    no_call = demo.rl_gain({"target_seen": None}, {"target_seen": 0.5}, 16)
    assert no_call["rise"] is None and no_call["se"] is None  # a stage with no valid call has no box-hit


def test_the_page_quotes_the_run_and_keeps_its_prose(tmp_path):
    page = tmp_path / "demo.md"
    page.write_text(f"# Demo\nprose before\n{demo.PAGE_START}\nold figures 0.35\n{demo.PAGE_END}\nprose after\n")
    demo.write_page(page, _summary(), "python -m scripts.demo --rl_steps 2")
    text = page.read_text()
    assert text.startswith("# Demo\nprose before\n") and text.endswith(f"{demo.PAGE_END}\nprose after\n")
    assert "old figures" not in text and "`python -m scripts.demo --rl_steps 2`" in text and "61.0 s" in text
    assert "| base | 0.125 | 0.500 |" in text  # accuracy, then tool_call_rate
    assert "| base | 0.125 / 0.250 | 0.500 / 0.200 |" in text  # all, then count: accuracy / chance
    assert "R_sem mean 0.095, non-zero in 2" in text and "`valid_call_rate` 0.500 -> 1.000" in text
    assert "`target_seen` on held-out rows, sampled at 1.0, 16 rows: SFT 0.250 -> RL 0.500 (+0.250 ± 0.165)" in text
    assert "; greedy, 8 rows: SFT - -> RL 0.500 (-) (± the binomial standard error of the difference)." in text
    assert "- WARNING: RL: R_sem was zero" in text and "label retrieval: colour 0.900." in text
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="needs one"):
        demo.write_page(page, _summary(), "x")


@pytest.mark.slow
def test_demo_runs_every_stage_and_writes_the_summary(tiny_kit, tmp_path, monkeypatch, capsys):
    argv = ["demo.py", "--output_dir", str(tmp_path), "--train_rows", "4", "--test_rows", "2"]
    argv += ["--clip_steps", "3", "--sft_steps", "2", "--rl_steps", "1", "--sampled_rows", "3"]
    argv += ["--page", str(tmp_path / "demo.md")]
    (tmp_path / "demo.md").write_text(f"{demo.PAGE_START}\n{demo.PAGE_END}\n")
    monkeypatch.setattr(sys, "argv", argv)
    demo.main()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {
        "clip_verifier", "eval", "rl_steps", "rl_first_step", "rl_last_step", "rl_overview", "eval_sampled",
        "rl_gain", "rl_gain_greedy", "warnings", "seconds",
    }  # fmt: skip
    assert set(summary["eval"]) == {"base", "sft", "rl"} and set(summary["eval_sampled"]) == {"sft", "rl"}
    sampled_args = json.loads((tmp_path / "eval" / "rl_sampled" / "eval_args.json").read_text())
    assert sampled_args["temperature"] == 1.0 and sampled_args["limit"] == 3  # as RL samples (config_demo.yaml)
    assert json.loads((tmp_path / "eval" / "rl_sampled" / "metrics.json").read_text())["n"] == 3
    assert summary["clip_verifier"]["steps"] == 3
    for stage, metrics in summary["eval"].items():
        assert (tmp_path / "eval" / stage / "report.html").exists()
        assert json.loads((tmp_path / "eval" / stage / "metrics.json").read_text())["n"] == 2
        assert set(metrics) == {
            *stages.SUMMARY_KEYS,
            "target_seen",
            "chance",
            "accuracy_by_source",
            "chance_by_source",
        }
        assert set(metrics["chance_by_source"]) == set(metrics["accuracy_by_source"])
        assert all(0 < chance <= 1 for chance in metrics["chance_by_source"].values())
    assert [step["step"] for step in summary["rl_steps"]] == [1]
    assert set(summary["rl_steps"][0]) == {"step", *stages.STEP_METRICS}
    assert set(summary["rl_first_step"]) == {stages.SEMANTIC_KEY, "tools/zoom_calls_per_rollout", "valid_call_rate"}
    assert summary["rl_last_step"] == summary["rl_first_step"]
    # Two SFT steps teach a random policy nothing: its stages have no valid call, and the summary says so.
    assert summary["warnings"] == stages.signal_warnings(summary) and summary["warnings"]
    printed = capsys.readouterr().out
    assert "accuracy / chance" in printed
    assert all(f"WARNING: {warning}" in printed for warning in summary["warnings"])
    assert (tmp_path / "rl" / "model.safetensors").exists()
    assert set(summary["seconds"]) >= {"SFT cold start", "RL", "total"}
    gain = summary["rl_gain"]  # what RL trains, from the two sampled evaluations it compares
    sampled = summary["eval_sampled"]
    assert gain == demo.rl_gain(sampled["sft"], sampled["rl"], 3, decoding="sampled at 1.0")
    assert summary["rl_gain_greedy"] == demo.rl_gain(summary["eval"]["sft"], summary["eval"]["rl"], 2)
    page = (tmp_path / "demo.md").read_text()  # the page quotes this run
    assert "| rl |" in page and f"{summary['seconds']['total']} s in all" in page and "--rl_steps 1" in page


def test_target_seen_is_per_row_as_the_grounding_reward_pays_it_by_hand(tmp_path):
    """A row counts when one of its valid calls framed its target (`frames_target`); a row without a call is a miss, a
    whole-image "zoom" frames nothing, and a row without a target box is not counted: 1 of 4 rows."""
    size, target = [900, 600], [100, 100, 150, 150]
    row = {"source": "synthetic/colour", "options": ["red", "blue", "green", "orange"], "image_size": size}
    calls = [
        [{"box": [90, 90, 200, 200]}],  # frames it
        [{"box": [0, 0, 900, 600]}],  # holds it, but is the whole image
        [],  # no call
        [{"box": None}, {"box": [300, 300, 400, 400]}],  # an invalid call, then a miss
    ]
    records = [row | {"target_bbox": target, "calls": c} for c in calls] + [row | {"target_bbox": None, "calls": []}]
    records = [record | {"id": str(i)} for i, record in enumerate(records)]  # every sample record has one
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert stages.eval_summary({}, tmp_path)["target_seen"] == 0.25


def test_a_stage_alone_takes_the_threads_it_is_given_else_two(monkeypatch):
    """`OMP_NUM_THREADS` when set (a pytest worker's share), else 2 threads, or 1 on a 1-core machine: more were not
    measured."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert stages.alone_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(stages.os, "cpu_count", lambda: 16)
    assert stages.alone_threads() == 2
    monkeypatch.setattr(stages.os, "cpu_count", lambda: 1)
    assert stages.alone_threads() == 1
