"""The positive control's verdict, pure, on figures worked out by hand (the runs: `python -m research.positive_control`,
research/reports/positive_control.md)."""

import argparse
from pathlib import Path

import pytest

from research.positive_control import (
    RISE_FLOOR,
    SIGMAS,
    images,
    key_value,
    parse_args,
    seed_verdict,
)
from research.runs import sft_overrides, sft_start, world
from tests.tolerance import FLOAT64, approx


def test_a_seed_passes_only_above_the_floor_and_above_two_standard_errors():
    # 0.25 -> 0.5 on 16 rows: SE sqrt(0.25 * 0.75 / 16 + 0.5 * 0.5 / 16) = sqrt(0.02734375) = 0.165: 0.25 < 2 SE.
    small = seed_verdict(0.25, 0.5, 16)
    assert small["rise"] == 0.25 and small["se"] == approx(0.02734375**0.5, FLOAT64, terms=4)
    assert not small["passed"]
    # The same rates on 128 rows: SE 0.0585, 2 SE 0.117 < 0.25 and 0.25 >= RISE_FLOOR: passes.
    assert seed_verdict(0.25, 0.5, 128)["passed"]
    # Above 2 SE but under the floor: 0.25 -> 0.35 on 10,000 rows (SE 0.0064) is a real move, not the control's.
    near = seed_verdict(0.25, 0.35, 10_000)
    assert near["rise"] > SIGMAS * near["se"] and near["rise"] < RISE_FLOOR and not near["passed"]
    assert not seed_verdict(0.5, 0.25, 128)["passed"]  # a fall never passes


def test_the_world_is_the_recipes_or_squares_of_one_side_and_the_report_names_it():
    assert world(argparse.Namespace(image_side=0)) == {}
    assert world(argparse.Namespace(image_side=768)) == {"min_size": 768, "max_size": 768}
    assert images({"images": {"sides": [768, 768], "square": True}}) == "768 px squares (one frame)"
    assert images({"images": {"sides": [600, 900], "square": False}}) == "images with sides of 600-900 px"
    assert images({}) == "images of the SFT recipe's world"  # results written before the world was recorded


def test_rl_args_split_at_the_first_equals_sign_and_refuse_anything_else():
    assert key_value("temperature=0.7") == ("temperature", "0.7")
    assert key_value("run_name=a=b") == ("run_name", "a=b")
    for bad in ("temperature", "=0.7"):
        with pytest.raises(argparse.ArgumentTypeError, match="FIELD=VALUE"):
            key_value(bad)


def test_the_start_step_saves_that_checkpoint_and_rl_starts_from_it():
    at = argparse.Namespace(sft_learning_rate=1e-3, sft_start_step=800)
    assert sft_overrides(at) == {
        "learning_rate": 1e-3, "save_strategy": "steps", "save_steps": 800, "save_only_model": True
    }  # fmt: skip
    assert sft_overrides(argparse.Namespace(sft_learning_rate=None, sft_start_step=0)) == {}  # the recipe as it is
    assert sft_start(Path("out/sft"), 800) == Path("out/sft/checkpoint-800")
    assert sft_start(Path("out/sft"), 0) == Path("out/sft")


@pytest.mark.parametrize("argv", [["--sft_start_step", "900"], ["--sft_start_step", "-1"],
                                  ["--sft_start_step", "800", "--sft_model", "out/sft"]])  # fmt: skip
def test_a_start_step_outside_the_sft_it_makes_is_refused_by_name(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--sft_steps", "900", *argv])
    assert "--sft_start_step" in capsys.readouterr().err
