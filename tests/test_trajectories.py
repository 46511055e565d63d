"""Gold trajectories: the 0/1/2-call variants, boxes in the frame the model sees, crops from the RL environment,
rows without a usable target skipped and counted, determinism, and the task's rewards scoring every gold trajectory 1."""

import datasets
import numpy as np
import pytest
from PIL import Image, ImageChops

import rewards
from data.synthetic import REGIONS, build_synthetic, region_of
from data.task import SYSTEM_PROMPTS, build_prompt
from data.trajectories import (
    GoldTrajectoryRenderer,
    TrajectoryArguments,
    build_gold_trajectories,
    grid_box,
    plan_calls,
    region_box,
    replay_calls,
)
from tools import TOOL_NAME, PixelBudget, ToolConfig, crop_box, make_environment_factory
from utils.models import pixel_budget

SMALL = {"min_size": 600, "max_size": 900}  # fast to draw, still far larger than the tiny model's ~112 px frame
ONE_CALL, TWO_CALLS = TrajectoryArguments([0.0, 1.0, 0.0]), TrajectoryArguments([0.0, 0.0, 1.0])
MIXED = [0.3, 0.4, 0.3]


@pytest.fixture(scope="module")
def rows() -> datasets.Dataset:
    return build_synthetic(10, seed=3, **SMALL)  # every question type twice


@pytest.fixture(scope="module")
def make_env(tiny_processor):
    return make_environment_factory(ToolConfig(), pixel_budget(tiny_processor))


def completion(messages: list[dict]) -> list[dict]:
    """The turns after the prompt (system + user), as the RL trainer's completions hold them."""
    return messages[2:]


def stored(dataset: datasets.Dataset) -> datasets.Dataset:
    """The planned columns, without the rendering transform."""
    return dataset.with_format(None)


def tool_turns(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] == "tool"]


def called(messages: list[dict]) -> list[dict]:
    return [m["tool_calls"][0]["function"]["arguments"] for m in messages if m.get("tool_calls")]


@pytest.mark.parametrize("num_calls", [0, 1, 2])
def test_variants_have_the_planned_turns(rows, make_env, num_calls):
    mix = [float(i == num_calls) for i in range(3)]
    gold, stats = build_gold_trajectories(rows, make_env, TrajectoryArguments(mix))
    assert stats.calls == {num_calls: len(rows)} and not stats.skipped
    for row, example in zip(rows, gold):
        messages = example["messages"]
        assert messages[:2] == row["prompt"] and example["images"][0].tobytes() == row["image"].tobytes()
        roles = [m["role"] for m in completion(messages)]
        assert roles == ["assistant", "tool"] * num_calls + ["assistant"]
        assert [call["label"] for call in called(messages)] == [row["target_label"]] * num_calls
        assert all(m["name"] == TOOL_NAME and m["content"][0]["type"] == "image" for m in tool_turns(messages))
        assert messages[-1]["content"].endswith(f"<answer>{row['answer']}</answer>")


def test_gold_box_is_the_target_in_the_seen_frame(rows, make_env):
    gold, _ = build_gold_trajectories(rows, make_env, ONE_CALL)
    env = make_env()
    for row, example in zip(rows, gold):
        env.reset(**row)
        (bbox,) = [call["bbox_2d"] for call in called(example["messages"])]
        assert all(isinstance(v, int) for v in bbox)
        assert 0 <= bbox[0] < bbox[2] <= env.seen_size[0] and 0 <= bbox[1] < bbox[3] <= env.seen_size[1]
        # Mapped back as the tool maps it, the box holds the whole target, and at most one seen pixel more per side.
        back = crop_box(row["image"].size, bbox, seen_size=env.seen_size, min_side=0, max_aspect=100)
        target = row["target_bbox"]
        slack = [row["image"].size[i % 2] / env.seen_size[i % 2] + 1 for i in range(4)]
        assert back[0] <= target[0] and back[1] <= target[1] and back[2] >= target[2] and back[3] >= target[3]
        assert all(abs(b - t) <= s for b, t, s in zip(back, target, slack))


def test_tool_turns_are_what_the_rl_environment_returns(rows, make_env):
    gold, _ = build_gold_trajectories(rows, make_env, TWO_CALLS)
    env = make_env()  # a fresh instance from the factory the RL trainer is given
    for row, example in zip(rows, gold):
        env.reset(**row)
        expected = [env.image_zoom_in_tool(**call) for call in called(example["messages"])]
        for observation, turn in zip(expected, tool_turns(example["messages"])):
            assert turn["content"][1] == observation[1]  # the text
            crop, seen = turn["content"][0]["image"], observation[0]["image"]
            assert crop.size == seen.size and ImageChops.difference(crop, seen).getbbox() is None


def test_miss_is_a_same_size_box_whose_crop_avoids_the_target(rows, make_env):
    gold, stats = build_gold_trajectories(rows, make_env, TWO_CALLS)
    assert stats.calls == {2: len(rows)}  # small targets always leave room for a miss
    env = make_env()
    for row, example in zip(rows, gold):
        env.reset(**row)
        first, second = called(example["messages"])
        miss, hit = first["bbox_2d"], second["bbox_2d"]
        assert (miss[2] - miss[0], miss[3] - miss[1]) == (hit[2] - hit[0], hit[3] - hit[1])
        assert 0 <= miss[0] and miss[2] <= env.seen_size[0] and 0 <= miss[1] and miss[3] <= env.seen_size[1]
        env.image_zoom_in_tool(**first)
        x1, y1, x2, y2 = env.calls[0].box  # the region the tool really cut out, in original pixels
        t1, t2, t3, t4 = row["target_bbox"]
        assert x2 <= t1 or t3 <= x1 or y2 <= t2 or t4 <= y1
        assert "does not show" in example["messages"][4]["content"]


def test_rows_without_a_usable_target_are_skipped_and_counted(rows, make_env):
    features = rows.features.copy()
    features["target_bbox"] = datasets.List(datasets.Value("int32"))  # room for malformed boxes
    records = rows.to_list()
    broken = {0: None, 1: [], 2: [50, 50, 50, 90], 3: [5000, 5000, 5100, 5100]}  # none, empty, degenerate, outside
    for index, bbox in broken.items():
        records[index]["target_bbox"] = bbox
    records[4]["target_label"] = None
    gold, stats = build_gold_trajectories(datasets.Dataset.from_list(records, features=features), make_env)
    assert stats.skipped == {"target_bbox": 4, "target_label": 1}
    assert sum(stats.calls.values()) == len(gold) == len(rows) - 5
    assert stored(gold)["id"] == rows["id"][5:]  # the survivors, with their own boxes: nothing invented
    with pytest.raises(ValueError, match="no row"):
        build_gold_trajectories(datasets.Dataset.from_list(records[:1], features=features), make_env)


def test_trajectories_are_deterministic_per_row(rows, make_env):
    first, stats = build_gold_trajectories(rows, make_env, TrajectoryArguments(MIXED, trajectory_seed=5))
    again, _ = build_gold_trajectories(rows, make_env, TrajectoryArguments(MIXED, trajectory_seed=5))
    subset, _ = build_gold_trajectories(rows.select([7, 2]), make_env, TrajectoryArguments(MIXED, trajectory_seed=5))
    plans = stored(first)["calls"]
    assert stored(again)["calls"] == plans
    assert stored(subset)["calls"] == [plans[7], plans[2]]  # a row's plan ignores the other rows
    assert len(stats.calls) > 1  # the mix really mixes
    other, _ = build_gold_trajectories(rows, make_env, TrajectoryArguments(MIXED, trajectory_seed=6))
    assert stored(other)["calls"] != plans


def test_gold_trajectories_score_full_rewards(rows, make_env):
    gold, _ = build_gold_trajectories(rows, make_env, TrajectoryArguments(MIXED))
    completions = [completion(example["messages"]) for example in gold]
    assert rewards.format_reward(completions) == [1.0] * len(rows)
    assert rewards.outcome_reward(completions, answer=rows["answer"], options=rows["options"]) == [1.0] * len(rows)


@pytest.mark.parametrize("mix", [[0.5, 0.5], [0.5, 0.6, -0.1], [0.2, 0.2, 0.2]])
def test_call_mix_must_be_three_fractions(mix):
    with pytest.raises(ValueError, match="call_mix"):
        TrajectoryArguments(call_mix=mix)


def test_rows_are_rendered_on_access_from_arrow_friendly_columns(rows, make_env):
    gold, _ = build_gold_trajectories(rows, make_env)
    assert set(gold.column_names) == set(rows.column_names) | {"calls"}
    assert set(gold[0]) == {"messages", "images"}


@pytest.mark.parametrize(
    "target, expected",
    [
        ([30, 5, 36, 12], [21, 0, 63, 42]),  # cells (1, 0): centred on x = 42, pushed inside the frame at the top
        ([50, 50, 100, 60], [49, 21, 100, 63]),  # centre in cell (2, 1); grown right to hold the whole target
        ([100, 100, 110, 110], [70, 70, 112, 112]),  # the last cell: shifted back inside the 112 px frame
    ],
)
def test_grid_box_by_hand(target, expected):
    # 28 px cells, 42 px boxes in a 112 x 112 frame: a box starts at its cell's centre minus 21, clamped to [0, 70].
    assert grid_box(target, (112, 112), grid=28, size=42) == expected


def test_grid_gold_boxes_hold_the_target(rows, make_env):
    args = TrajectoryArguments([0.0, 1.0, 0.0], gold_box="grid", gold_box_grid=28, gold_box_size=42)
    dataset, _ = build_gold_trajectories(rows, make_env, args)
    for row in stored(dataset):
        env = make_env()
        env.reset(**row)
        box = crop_box(
            env.image.size, row["calls"][0]["bbox_2d"], seen_size=env.seen_size, min_side=0, max_aspect=100.0
        )
        x1, y1, x2, y2 = row["target_bbox"]
        assert box[0] <= x1 and box[1] <= y1 and box[2] >= x2 and box[3] >= y2


@pytest.mark.parametrize(
    "target, frame, expected",
    [
        ([40, 40, 44, 44], (112, 112), [31, 31, 80, 80]),  # the middle cell (37..74) grown by 6 px each way
        ([0, 0, 3, 3], (112, 84), [0, 0, 43, 34]),  # top left of a 112 x 84 frame: cut at the frame's edge
        ([100, 80, 112, 84], (112, 84), [68, 50, 112, 84]),  # bottom right
        ([30, 30, 50, 50], (112, 112), [30, 30, 80, 80]),  # centre in the middle cell; grown to hold the target
    ],
)
def test_region_box_by_hand(target, frame, expected):
    assert region_box(target, frame, margin=6) == expected


def test_region_gold_boxes_hold_the_target_in_the_cell_the_question_names(make_env):
    rows = build_synthetic(10, seed=3, region_hint=True, **SMALL)
    args = TrajectoryArguments([0.0, 1.0, 0.0], gold_box="region", gold_box_margin=6)
    dataset, _ = build_gold_trajectories(rows, make_env, args)
    for row in stored(dataset):
        env = make_env()
        env.reset(**row)
        seen = row["calls"][0]["bbox_2d"]
        box = crop_box(env.image.size, seen, seen_size=env.seen_size, min_side=0, max_aspect=100.0)
        x1, y1, x2, y2 = row["target_bbox"]
        assert box[0] <= x1 and box[1] <= y1 and box[2] >= x2 and box[3] >= y2
        named = next(name for name in REGIONS if f" Look in the {name} of" in row["prompt"][-1]["content"])
        assert REGIONS[region_of(seen, *env.seen_size)] == named


def test_grid_box_arguments_are_checked():
    with pytest.raises(ValueError, match="gold_box must be one of"):
        TrajectoryArguments(gold_box="loose")
    with pytest.raises(ValueError, match="gold_box_grid <= gold_box_size"):
        TrajectoryArguments(gold_box="grid", gold_box_grid=28, gold_box_size=14)
    with pytest.raises(ValueError, match="gold_box_margin must be >= 0"):
        TrajectoryArguments(gold_box="region", gold_box_margin=-1)


# The hand-worked example of tests/test_zoom_in.py: a 2240 x 1120 original, seen as 1400 x 700 by Qwen2.5-VL (factor
# 28) and 1408 x 704 by Qwen3-VL (factor 32) under max_pixels 1003520; its target [1120, 560, 1568, 784] is
# [700, 350, 980, 490] in Qwen2.5-VL's pixels and [500, 500, 700, 700] on Qwen3-VL's 1000-grid.
HAND_ROW = {
    "id": "hand",
    "image": Image.new("RGB", (2240, 1120), "white"),
    "prompt": build_prompt("What is in the box?"),  # stored with the pixels prompt, as every dataset
    "answer": "A",
    "target_bbox": [1120, 560, 1568, 784],
    "target_label": "the target",
    "gold_calls": [{"box": [1120, 560, 1568, 784], "label": "the target", "thought": "Look there."}],
}


@pytest.mark.parametrize(
    ("convention", "budget", "gold"),
    [
        ("pixels", PixelBudget(3136, 1003520, 28), [700, 350, 980, 490]),
        ("relative_1000", PixelBudget(3136, 1003520, 28), [500, 500, 700, 700]),
        ("relative_1000", PixelBudget(65536, 1003520, 32), [500, 500, 700, 700]),
    ],
)
def test_gold_and_converted_calls_are_written_in_the_models_frame(convention, budget, gold):
    """SFT's planned gold call and a converted trajectory's call (boxes stored in original pixels, `data.convert`)
    are both written in the frame of the recipe's convention, and the tool maps them back onto the target; the
    rendered conversation's system turn says that frame."""
    make_env = make_environment_factory(ToolConfig(box_convention=convention), budget)
    env = make_env()
    planned = plan_calls(HAND_ROW, "the target", env, 1, np.random.default_rng(0))
    assert planned == [{"bbox_2d": gold, "label": "the target"}]
    assert replay_calls(HAND_ROW, env) == [{"bbox_2d": gold, "label": "the target", "thought": "Look there."}]
    assert env.calls[-1].box == tuple(HAND_ROW["target_bbox"])
    renderer = GoldTrajectoryRenderer(make_env)
    messages = renderer.messages({**HAND_ROW, "calls": [{**planned[0], "thought": "Look there."}]})
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPTS[convention]}
    assert messages[2]["tool_calls"][0]["function"]["arguments"]["bbox_2d"] == gold
    assert renderer.env.calls[-1].box == tuple(HAND_ROW["target_bbox"])
