"""`make demo`: the summary's pieces on hand-made inputs (chance levels, the per-step RL log, the zero-signal
warnings, the arms' figures side by side, z_t by framing, the gate's warning), its two RL arms' recipes, and the whole
pipeline shrunk: every stage runs through the real entry points and the summary is written."""

import json
import sys
import warnings
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


def test_the_demos_sft_runs_the_tiny_recipes_own_steps_unless_told():
    """One source of truth: the demo's SFT length is the tiny SFT recipe's max_steps (600 on 2026-12-06), read from
    the recipe, so an edit there reaches the demo; the flag still overrides it."""
    steps = load_recipe(stages.SFT_RECIPE).values["max_steps"]
    assert steps == 600
    assert demo.parse_args([]).sft_steps == steps
    assert demo.parse_args(["--sft_steps", "7"]).sft_steps == 7


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


GATE = {"semantic_score": "cosine", "rows": 64, "labels": 39, "auc": 0.6, "mean_rank": 12.0, "right_z": -0.122,
        "best_constant": "the green circles", "best_constant_z": 0.21, "constant_wins": 0.7, "passed": False,
        "walk_auc": 0.641, "walk_rows": 62, "walk_left_out": 2}  # fmt: skip


def _arm(r_sem: float, sampled: float, rise: float, se: float) -> dict:
    return {
        "rl_steps": [],
        "rl_overview": {"steps": 2, "r_sem_mean": r_sem, "r_sem_nonzero_steps": 2, "valid_call_rate_mean": 0.94,
                        "calls_per_rollout_mean": 1.0},
        "rl_first_step": {stages.SEMANTIC_KEY: 0.1, "tools/zoom_calls_per_rollout": 0.5, "valid_call_rate": 0.5},
        "rl_last_step": {stages.SEMANTIC_KEY: 0.09, "tools/zoom_calls_per_rollout": 1.0, "valid_call_rate": 1.0},
        "rl_gain": {"figure": "target_seen", "decoding": "sampled at 1.0", "rows": 16, "sft": 0.25, "rl": sampled,
                    "rise": rise, "se": se},
        "rl_gain_greedy": {"figure": "target_seen", "decoding": "greedy", "rows": 8, "sft": None, "rl": 0.5,
                           "rise": None, "se": None},
    }  # fmt: skip


def _summary() -> dict:
    stage = {key: 0.5 for key in stages.SUMMARY_KEYS} | {
        "chance": 0.25,
        "accuracy_by_source": {"synthetic/count": 0.5},
    }
    return {
        "clip_verifier": {"top1_colour": 0.9, "steps": 300},
        "verifier_gate": GATE,
        "outcome": "`simulated_reader`, `target_in_view` logged at weight 0",
        "semantic_score": "cosine",
        "eval": {"base": stage | {"accuracy": 0.125, "chance_by_source": {"synthetic/count": 0.2}}},
        "arms": {"mapo": _arm(0.095, 0.5, 0.25, 0.165), "grpo": _arm(0.01, 0.375, 0.125, 0.16)},
        "z_by_framing": {
            "sft": {"framed": 0.3, "framed_calls": 3, "missed": 0.1, "missed_calls": 5},
            "mapo": {"framed": None, "framed_calls": 0, "missed": 0.2, "missed_calls": 4},
        },
        "arm_difference": {"arms": ["mapo", "grpo"], "decoding": "sampled at 1.0", "rows": 16, "difference": 0.125,
                           "se": 0.171},
        "warnings": ["RL mapo: R_sem was zero"],
        "seconds": {"SFT cold start": 20.0, "total": 61.0},
    }  # fmt: skip


def test_the_page_quotes_the_run_with_the_arms_side_by_side_and_keeps_its_prose(tmp_path):
    page = tmp_path / "demo.md"
    page.write_text(f"# Demo\nprose before\n{demo.PAGE_START}\nold figures 0.35\n{demo.PAGE_END}\nprose after\n")
    demo.write_page(page, _summary(), "python -m scripts.demo --rl_steps 2")
    text = page.read_text()
    assert text.startswith("# Demo\nprose before\n") and text.endswith(f"{demo.PAGE_END}\nprose after\n")
    assert "old figures" not in text and "`python -m scripts.demo --rl_steps 2`" in text
    assert "61.0 s in all; seconds by stage: SFT cold start 20.0:" in text
    assert "| base | 0.125 | 0.500 |" in text  # accuracy, then tool_call_rate
    assert "| base | 0.125 / 0.250 | 0.500 / 0.200 |" in text  # all, then count: accuracy / chance
    assert "two arms on the same outcome (`simulated_reader`, `target_in_view` logged at weight 0)" in text
    assert "| figure | SFT | MAPO | GRPO |" in text  # the arms side by side, MAPO first
    sampled = "| target-seen, sampled at 1.0, 16 rows | 0.250 | 0.500 (+0.250 ± 0.165) | 0.375 (+0.125 ± 0.160) |"
    assert sampled in text
    assert "| target-seen, greedy, 8 rows | - | 0.500 (-) | 0.500 (-) |" in text  # SFT made no valid call
    assert (
        "| R_sem in training: mean (first -> last step) | - | 0.095 (0.100 -> 0.090) | 0.010 (0.100 -> 0.090) |"
        in text
    )
    assert "framed / missed the target (calls) | 0.300 / 0.100 (3 / 5) | - / 0.200 (0 / 4) | - |" in text
    assert "| tool calls per rollout in training: mean (first -> last step) | - | 1.000 (0.500 -> 1.000) |" in text
    assert "MAPO - GRPO, target-seen sampled at 1.0 on the same 16 rows: +0.125 ± 0.171 (one seed each" in text
    assert "talk AUC 0.600 (needs >= 0.75), the right label's mean z -0.122 against the best constant label's " in text
    assert "(`the green circles`) +0.210 (needs above), walk AUC 0.641 (needs >= 0.75): it **fails**." in text
    assert "- WARNING: RL mapo: R_sem was zero" in text and "label retrieval: colour 0.900." in text
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="needs one"):
        demo.write_page(page, _summary(), "x")


def test_z_t_by_framing_by_hand():
    """Scored calls of rows with a target box, apart by whether the crop framed it: a whole-image box holds the target
    but frames nothing, an invalid call has no z_t, a row without a target box is not counted. Cosine: framed 0.75
    (1 call), missed (0.25 + 0.5) / 2 = 0.375; contrastive (minus the whole image's): 0.75 - 0.25 = 0.5 and
    ((0.25 - 0.5) + (0.5 - 0.5)) / 2 = -0.125 (every figure exact in binary)."""
    size, target = [900, 600], [100, 100, 150, 150]
    records = [
        {"image_size": size, "target_bbox": target, "calls": [
            {"box": [90, 90, 200, 200], "z": 0.75, "z_full": 0.25},  # frames it
            {"box": [300, 300, 400, 400], "z": 0.25, "z_full": 0.5},  # misses it
        ]},
        {"image_size": size, "target_bbox": target, "calls": [
            {"box": [0, 0, 900, 600], "z": 0.5, "z_full": 0.5},  # the whole image: no zoom
            {"box": None, "z": None, "z_full": None},  # invalid: not scored
        ]},
        {"image_size": size, "target_bbox": None, "calls": [{"box": [90, 90, 200, 200], "z": 0.0, "z_full": 0.0}]},
    ]  # fmt: skip
    assert stages.framing_z(records, "cosine") == {
        "framed": 0.75,
        "framed_calls": 1,
        "missed": 0.375,
        "missed_calls": 2,
    }
    assert stages.framing_z(records, "contrastive") == {
        "framed": 0.5, "framed_calls": 1, "missed": -0.125, "missed_calls": 2,
    }  # fmt: skip
    assert stages.framing_z(records[2:], "cosine") == {"framed": None, "framed_calls": 0, "missed": None,
                                                       "missed_calls": 0}  # fmt: skip


def test_the_arms_difference_is_a_difference_of_two_rates_with_its_standard_error_by_hand():
    difference = demo.arm_difference({"target_seen": 0.5}, {"target_seen": 0.25}, 16, ("mapo", "grpo"), "greedy")
    # sqrt(0.5 * 0.5 / 16 + 0.25 * 0.75 / 16) = sqrt(0.4375 / 16) = sqrt(0.02734375)
    assert difference["difference"] == 0.25 and difference["se"] == approx(0.02734375**0.5, FLOAT64, terms=4)
    assert difference["arms"] == ["mapo", "grpo"] and difference["rows"] == 16
    none = demo.arm_difference({"target_seen": None}, {"target_seen": 0.25}, 16, ("mapo", "grpo"), "greedy")
    assert none["difference"] is None and none["se"] is None


def test_a_failed_gate_warns_with_its_figures_and_each_arm_warns_under_its_name():
    (gate,) = demo.gate_warnings(GATE)
    assert gate.startswith("verifier gate: the CLIP fails it (talk AUC 0.600, walk AUC 0.641, right label's z -0.122")
    assert "`the green circles` +0.210" in gate and "says nothing about MAPO's signal" in gate
    assert demo.gate_warnings(GATE | {"passed": True}) == []
    summary = _summary()
    mapo, grpo = summary["arms"]["mapo"], summary["arms"]["grpo"]
    mapo["rl_steps"] = [_step(1, r_sem=0.1, z_mean=0.3, calls_per_rollout=1.0)]
    mapo["rl_gain"] |= {"rise": 0.1, "se": 0.2}  # not above its standard error
    grpo["rl_steps"] = [_step(1, r_sem=0.0, z_mean=None, calls_per_rollout=1.0)]  # R_sem never scored
    grpo["rl_gain"] |= {"rise": 0.2, "se": 0.05}
    warned = demo.demo_warnings(summary)
    assert [w.split(":")[0] for w in warned] == ["RL mapo", "RL grpo", "verifier gate"]
    assert warned[0].startswith("RL mapo: target_seen rose +0.100") and "R_sem was zero" in warned[1]
    summary["eval"]["base"] |= {"valid_call_rate": None, "calls_per_sample": 0.0}  # the stages' own come first
    assert demo.demo_warnings(summary)[0].startswith("eval 'base': no zoom-in call")


def _differ(a: dict, b: dict) -> list[str]:
    """The keys two recipes give different values (or only one gives)."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def test_the_two_arms_differ_only_in_the_estimator_and_r_sem_and_keep_the_grounding_recipes_budget(tiny_kit):
    """Same data, outcome, budget, steps and seed; MAPO sets R_sem's fields (config_mapo.yaml's) and the GRPO arm none,
    so it parses without the warning a semantic_* field under grpo raises (configs.MAPOConfig). The grounding recipe
    they were measured from differs in its outcome and estimator."""
    mapo, grpo = (load_recipe(stages.DEMO_ARMS[arm]).values for arm in ("mapo", "grpo"))
    grounding = load_recipe(stages.GROUNDING_RL_RECIPE).values
    assert _differ(mapo, grpo) == ["advantage_estimator", "no_tool_semantic", "output_dir", "semantic_beta",
                                  "semantic_lambda", "semantic_score", "semantic_verifier"]  # fmt: skip
    assert not [key for key in grpo if key.startswith("semantic")] and grpo["advantage_estimator"] == "grpo"
    assert _differ(mapo, grounding) == ["advantage_estimator", "output_dir", "reward_funcs", "reward_weights",
                                       "semantic_beta", "semantic_verifier"]  # fmt: skip
    assert mapo["reward_funcs"] == ["simulated_reader", "target_in_view"] and mapo["reward_weights"] == [1.0, 0.0]
    for arm, estimator in (("mapo", "mapo"), ("grpo", "grpo")):
        argv = ["--config", stages.DEMO_ARMS[arm], "--model_name_or_path", str(tiny_kit["policy"])]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            script, training, _, tool = stages.rl_args(argv)
        assert not [str(w.message) for w in caught if "R_sem" in str(w.message)]
        assert training.advantage_estimator == estimator and training.semantic_verifier == "clip"
        assert training.semantic_beta == 0.4 and training.seed == 42 and tool.clip_model == "outputs/tiny/clip"


def test_the_rl_gain_is_the_rise_in_box_hit_with_the_standard_error_of_a_difference_by_hand():
    gain = demo.rl_gain({"target_seen": 0.25}, {"target_seen": 0.5}, 16)
    # sqrt(0.25 * 0.75 / 16 + 0.5 * 0.5 / 16) = sqrt(0.4375 / 16) = sqrt(0.02734375)
    assert gain["rise"] == 0.25 and gain["se"] == approx(0.02734375**0.5, FLOAT64, terms=4)
    assert gain["sft"] == 0.25 and gain["rl"] == 0.5 and gain["figure"] == "target_seen"
    assert gain["decoding"] == "greedy" and gain["rows"] == 16
    no_call = demo.rl_gain({"target_seen": None}, {"target_seen": 0.5}, 16)
    assert no_call["rise"] is None and no_call["se"] is None  # a stage with no valid call has no box-hit


@pytest.mark.slow
def test_demo_runs_every_stage_and_both_arms_and_writes_the_summary(tiny_kit, tmp_path, monkeypatch, capsys):
    argv = ["demo.py", "--output_dir", str(tmp_path), "--train_rows", "4", "--test_rows", "2"]
    argv += ["--clip_steps", "3", "--sft_steps", "2", "--rl_steps", "1", "--sampled_rows", "3", "--gate_rows", "2"]
    argv += ["--base_rows", "2"]
    argv += ["--page", str(tmp_path / "demo.md")]
    (tmp_path / "demo.md").write_text(f"{demo.PAGE_START}\n{demo.PAGE_END}\n")
    monkeypatch.setattr(sys, "argv", argv)
    demo.main()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {
        "clip_verifier", "verifier_gate", "outcome", "semantic_score", "eval", "eval_sampled", "arms", "z_by_framing",
        "arm_difference", "warnings", "seconds",
    }  # fmt: skip
    assert list(summary["eval"]) == ["base", "sft", "mapo", "grpo"]
    assert list(summary["eval_sampled"]) == ["sft", "mapo", "grpo"] and list(summary["arms"]) == ["mapo", "grpo"]
    for arm in ("mapo", "grpo"):  # each arm's run: its recipe, from the same SFT checkpoint, paid by the reader
        command = (tmp_path / "rl" / arm / "recipe.yaml").read_text().splitlines()[1]
        assert f"--config {stages.DEMO_ARMS[arm]} --model_name_or_path {tmp_path / 'sft'} " in command
        state = json.loads((tmp_path / "rl" / arm / stages.TRAINER_STATE).read_text())
        assert "rewards/simulated_reader_reward/mean" in state["log_history"][0]  # the key the research runs read
        sampled_args = json.loads((tmp_path / "eval" / f"{arm}_sampled" / "eval_args.json").read_text())
        assert sampled_args["temperature"] == 1.0 and sampled_args["limit"] == 3  # as RL samples
        assert json.loads((tmp_path / "eval" / f"{arm}_sampled" / "metrics.json").read_text())["n"] == 3
        assert (tmp_path / "rl" / arm / "model.safetensors").exists() and (tmp_path / "logs" / f"{arm}.log").exists()
        figures = summary["arms"][arm]
        assert figures["recipe"] == stages.DEMO_ARMS[arm]
        assert [step["step"] for step in figures["rl_steps"]] == [1]
        assert set(figures["rl_steps"][0]) == {"step", *stages.STEP_METRICS}
        assert figures["rl_last_step"] == figures["rl_first_step"]
        sampled = summary["eval_sampled"]
        assert figures["rl_gain"] == demo.rl_gain(sampled["sft"], sampled[arm], 3, decoding="sampled at 1.0")
        assert figures["rl_gain_greedy"] == demo.rl_gain(summary["eval"]["sft"], summary["eval"][arm], 2)
        assert set(summary["seconds"]) >= {f"RL {arm}", f"evaluate {arm}", f"evaluate {arm}_sampled"}
    assert set(summary["z_by_framing"]) == {"sft", "mapo", "grpo"}
    assert summary["clip_verifier"]["steps"] == 3
    gate = summary["verifier_gate"]  # the CLIP MAPO scores with, under the recipe's semantic_score
    assert gate["semantic_score"] == summary["semantic_score"] == "cosine" and gate["rows"] == 2
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
    # Two SFT steps teach a random policy nothing: its stages have no valid call, and the summary says so.
    assert summary["warnings"] == demo.demo_warnings(summary) and summary["warnings"]
    printed = capsys.readouterr().out
    assert "accuracy / chance" in printed and "| figure | SFT | MAPO | GRPO |" in printed
    assert all(f"WARNING: {warning}" in printed for warning in summary["warnings"])
    assert set(summary["seconds"]) >= {"SFT cold start", "verifier gate", "total"}
    page = (tmp_path / "demo.md").read_text()  # the page quotes this run
    assert "| grpo |" in page and f"{summary['seconds']['total']} s in all" in page and "--rl_steps 1" in page


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
