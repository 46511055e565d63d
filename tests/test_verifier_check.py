"""The verifier gate's walk axis (`evaluation.verifier_check`): `miss_box` on hand-made boxes; the tool's miss crops;
`walk_auc` through `check_verifier` with hand-made verifiers (an exact walk verifier scores 1, a constant one 0.5, one
that flips its verdict with probability 1 - q scores q); the pass rule's need of both axes; and the command on a
converted cold-start set (`tests/release_fixtures.py`, CoF) with the tiny CLIP, counting the calls whose label the
release does not give. The talk axis's figures on a hand-made matrix: tests/test_registry.py."""

import json
import math

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from data import convert
from data.trajectories import TrajectoryArguments
from evaluation import verifier_check
from evaluation.verifier_check import MIN_AUC, check_verifier, gate, gold_crops, miss_box, miss_crops, walk_auc
from rewards.verifiers import Scene
from tests.release_fixtures import TARGET, cof_record, write_cof
from tests.tolerance import approx
from tools import PixelBudget, ToolConfig, ZoomCall, box_contains, boxes_overlap, make_environment_factory

SIDE = 224  # 8 x 28: with SAME_FRAME the model sees the image at its own size
SAME_FRAME = PixelBudget(3136, SIDE * SIDE, 28)
LABELS = ("the star", "the ring", "the bar", "the dot")
SQUARE = [TARGET[0] - 10, TARGET[1] - 10, TARGET[2] + 10, TARGET[3] + 10]  # a 60 px box round the fixtures' target


# ---------------------------------------------------------------------------------------------------- miss_box
def test_miss_box_is_the_same_size_inside_the_image_away_from_the_target():
    # a 20 x 20 gold box around a target near the top-left: the bottom-right corner is farthest
    assert miss_box((100, 100), (10, 10, 20, 20), (5, 5, 25, 25)) == (80, 80, 100, 100)
    # a 30 x 30 box in a 100 x 30 strip: only left or right of the target (centre x 45); right is farther
    assert miss_box((100, 30), (35, 5, 55, 25), (30, 0, 60, 30)) == (70, 0, 100, 30)
    # ends are exclusive: a box starting where the target ends misses it; equal distances keep the first corner
    assert miss_box((100, 100), (0, 0, 50, 100), (0, 0, 50, 50)) == (50, 0, 100, 50)
    # a 60 x 60 box cannot avoid a target holding the image's centre 40 x 40
    assert miss_box((100, 100), (30, 30, 70, 70), (20, 20, 80, 80)) is None


def test_miss_box_finds_a_placement_exactly_when_one_exists():
    """Against every placement on a small image: whenever some same-size box misses the target, miss_box returns one
    (same size, inside, disjoint); when none does, it returns None."""
    rng = np.random.default_rng(0)
    width, height = 12, 9
    for _ in range(300):
        x1, y1 = int(rng.integers(0, width)), int(rng.integers(0, height))
        target = (x1, y1, int(rng.integers(x1 + 1, width + 1)), int(rng.integers(y1 + 1, height + 1)))
        w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        placements = [(x, y, x + w, y + h) for x in range(width - w + 1) for y in range(height - h + 1)]
        exists = any(not boxes_overlap(box, target) for box in placements)
        box = miss_box((width, height), target, (0, 0, w, h))
        assert (box is not None) == exists, (target, w, h)
        if box is not None:
            assert box in placements and not boxes_overlap(box, target)


# ------------------------------------------------------------------------------------------- rows and verifiers
def hand_rows(n: int, seed: int = 0, side: int = SIDE) -> list[dict]:
    """`n` rows on one flat image: a target of 10-30 px placed at random, one of `LABELS` each."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (side, side), (120, 130, 140))
    rows = []
    for i in range(n):
        w, h = (int(v) for v in rng.integers(10, 31, size=2))
        x, y = int(rng.integers(0, side - w)), int(rng.integers(0, side - h))
        rows.append({"image": image, "target_bbox": [x, y, x + w, y + h], "target_label": LABELS[i % len(LABELS)]})
    return rows


def size(box) -> tuple[int, int]:
    return box[2] - box[0], box[3] - box[1]


def frames(call, scene) -> bool:
    return box_contains(call.box, scene.target_bbox)


class WalkVerifier:
    """1 when the crop holds the target, whatever the label: exact on the walk axis, blind on the talk axis."""

    def score(self, calls, scenes):
        return torch.tensor([float(frames(c, s)) for c, s in zip(calls, scenes, strict=True)])


class ConstantVerifier:
    def score(self, calls, scenes):
        return torch.zeros(len(calls))


class FlippingVerifier:
    """`WalkVerifier`'s verdict, flipped with probability 1 - q, each score independently (seeded)."""

    def __init__(self, q: float, seed: int = 0):
        self.q, self.rng = q, np.random.default_rng(seed)

    def score(self, calls, scenes):
        right = np.array([frames(c, s) for c, s in zip(calls, scenes, strict=True)])
        flip = self.rng.random(len(right)) >= self.q
        return torch.tensor((right ^ flip).astype(np.float32))


class TalkVerifier:
    """1 when the label is the scene's target label, wherever the crop is: exact on talk, blind on walk."""

    def score(self, calls, scenes):
        return torch.tensor([float(c.label == s.target_label) for c, s in zip(calls, scenes, strict=True)])


def env_factory(budget: PixelBudget = SAME_FRAME, box_convention: str = "pixels"):
    return make_environment_factory(ToolConfig(box_convention=box_convention), budget)


# ------------------------------------------------------------------------------------------------- miss crops
@pytest.mark.parametrize("box_convention", ["pixels", "relative_1000"])
def test_miss_crops_are_the_tools_crops_of_the_gold_size_away_from_the_target(box_convention):
    """In a frame half the image's size (the tool maps the model's boxes back), each miss crop is the tool's own call,
    with the gold call's label, a box of the gold box's size inside the image that misses the target; a crop that
    no box of its size can move off the target gets none. On Qwen3-VL's 0-1000 grid too (issue 37: the gate mapped
    its boxes with the seen size, not the tool's frame)."""
    make_env = env_factory(SAME_FRAME, box_convention)  # a 448 px image is seen at 224 px
    rows = hand_rows(40, seed=1, side=2 * SIDE)
    calls, scenes = gold_crops(rows, make_env, TrajectoryArguments(gold_box="region"))
    calls.append(ZoomCall(1, None, "the star", (0, 0, 348, 348), None))  # no 348 px box of 448 avoids the middle
    scenes.append(Scene(rows[0]["image"], (150, 150, 300, 300), "the star"))
    misses = miss_crops(calls, scenes, make_env)
    assert misses[-1] is None
    for call, scene, miss in zip(calls[:-1], scenes[:-1], misses[:-1]):
        assert miss is not None and miss.ok and miss.label == call.label and miss.crop is not None
        assert not boxes_overlap(miss.box, scene.target_bbox)
        # the seen frame is half the image, the grid 1000 / 448 of it: sizes equal, within the grid's rounding outwards
        slack = 0 if box_convention == "pixels" else 1
        assert all(0 <= m - c <= slack for m, c in zip(size(miss.box), size(call.box))), (call.box, miss.box)
        assert 0 <= miss.box[0] and 0 <= miss.box[1] and miss.box[2] <= 2 * SIDE and miss.box[3] <= 2 * SIDE


@pytest.mark.parametrize("box_convention", ["pixels", "relative_1000"])
def test_a_converted_sets_calls_are_cropped_where_their_boxes_are(box_convention):
    """`converted_crops` replays each converted call's box (original pixels) through the tool in the model's frame, as
    SFT does: the crop is the box, in either convention, within the frame's rounding outwards (issue 37)."""
    rows = []
    for row in hand_rows(12, seed=2, side=2 * SIDE):
        x1, y1, x2, y2 = row["target_bbox"]  # 30-50 px: over the tool's min_side, which would widen it
        box = [max(0, x1 - 10), max(0, y1 - 10), min(2 * SIDE, x2 + 10), min(2 * SIDE, y2 + 10)]
        rows.append({"image": row["image"], "gold_calls": [{"box": box, "label": "x", "label_source": "dataset"}]})
    calls, scenes, counts = verifier_check.converted_crops(rows, env_factory(SAME_FRAME, box_convention))
    assert counts["calls_used"] == 12
    for call, row in zip(calls, rows, strict=True):
        given = row["gold_calls"][0]["box"]
        assert box_contains(call.box, given) and all(abs(a - b) <= 2 for a, b in zip(call.box, given)), call.box


# ------------------------------------------------------------------------------------------------- walk_auc
def test_walk_auc_of_an_exact_a_constant_and_a_noisy_verifier():
    """Through `check_verifier` on 400 rows: an exact walk verifier 1.0 under both scorings (the whole-image
    subtraction is the same for both crops), a constant one 0.5 (every pair a tie, counted half), and one right with
    probability q = 0.8 per score about q: per row the pair scores 1 with probability q^2, 1/2 with 2q(1 - q) and 0
    with (1 - q)^2, mean q, variance q^2 + q(1 - q)/2 - q^2 = 0.08, so over 400 rows a standard error of 0.014; the
    tolerance, 0.06, is over 4 of them."""
    rows = hand_rows(400)
    exact = check_verifier(WalkVerifier(), rows, env_factory())
    for how in ("cosine", "contrastive"):
        assert exact[how].walk_auc == 1.0
        assert exact[how].walk_rows + exact[how].walk_left_out == exact[how].rows == 400
        assert exact[how].walk_left_out == 0  # targets of at most 30 px leave a corner free of every gold box
    constant = check_verifier(ConstantVerifier(), rows, env_factory())
    assert constant["cosine"].walk_auc == 0.5 and constant["contrastive"].walk_auc == 0.5
    noisy = check_verifier(FlippingVerifier(0.8), rows, env_factory(), semantic_scores=("cosine",))
    assert noisy["cosine"].walk_auc == pytest.approx(0.8, abs=0.06)
    assert walk_auc(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.0, 0.0, 1.0])) == approx(1.5 / 3, terms=2)
    assert math.isnan(walk_auc(torch.zeros(0), torch.zeros(0)))


def test_the_gate_fails_a_verifier_that_talks_but_does_not_walk():
    eye = torch.eye(3, dtype=torch.float64)
    both = gate(eye, [0, 1, 2], ["a", "b", "c"], "cosine", walk=(torch.ones(3), torch.zeros(3)))
    assert both.auc == 1.0 and both.walk_auc == 1.0 and both.passed
    blind = gate(eye, [0, 1, 2], ["a", "b", "c"], "cosine", walk=(torch.ones(3), torch.ones(3)))
    assert blind.auc == 1.0 and blind.right_z > blind.best_constant_z and blind.walk_auc == 0.5 < MIN_AUC
    assert not blind.passed
    unmeasured = gate(eye, [0, 1, 2], ["a", "b", "c"], "cosine")
    assert math.isnan(unmeasured.walk_auc) and not unmeasured.passed
    # end to end: the label alone decides the score, so talk is perfect and walk is chance
    result = check_verifier(TalkVerifier(), hand_rows(40), env_factory(), semantic_scores=("cosine",))["cosine"]
    assert result.auc == 1.0 and result.right_z > result.best_constant_z
    assert result.walk_auc == 0.5 and not result.passed


# --------------------------------------------------------------------------------------- a converted cold-start set
def test_the_command_on_a_converted_set_scores_the_releases_own_labels(tmp_path, tiny_kit, capsys):
    """A CoF release converted by `data.convert`: a call without a label (the converter derives one from the
    question) is skipped and counted; a call whose box is too large for any same-size box to miss it is scored on
    talk and left out of walk; every figure is finite; the same set as one Parquet file gives the same figures."""
    records = [
        cof_record([(SQUARE, "the red square")], image_name="0.png"),
        cof_record([([20, 20, 120, 100], "the left blob"), (SQUARE, "the red square")], image_name="1.png"),
        cof_record([(SQUARE, None)], image_name="2.png"),
        cof_record([([0, 0, 300, 300], "the left part")], image_name="3.png"),
    ]
    out = tmp_path / "converted"
    convert.main(["--format", "cof_sft", "--input", str(write_cof(tmp_path / "in", records)), "--output", str(out)])
    sources = [c["label_source"] for row in datasets.load_from_disk(str(out))["train"] for c in row["gold_calls"]]
    assert sources == ["dataset", "dataset", "dataset", "question", "dataset"]
    capsys.readouterr()
    argv = ["--clip_model", str(tiny_kit["clip"]), "--device", "cpu", "--batch_size", "4"]
    report = verifier_check.main(["--data", str(out), *argv, "--output", str(tmp_path / "gate.json")])
    printed = capsys.readouterr().out
    assert json.loads((tmp_path / "gate.json").read_text()) == json.loads(json.dumps(report))
    counts = report["counts"]
    assert counts == {"rows_read": 4, "calls_read": 5, "calls_used": 4, "calls_rejected": 0,
                      "calls_skipped": {"question": 1}}  # fmt: skip
    assert set(report["results"]) == {"cosine", "contrastive"}
    for how, result in report["results"].items():
        assert result["rows"] == 4 and result["labels"] == 3
        assert result["walk_rows"] == 3 and result["walk_left_out"] == 1
        figures = ("auc", "mean_rank", "right_z", "best_constant_z", "constant_wins", "walk_auc")
        assert all(math.isfinite(result[name]) for name in figures), result
        assert how in printed and f"{result['walk_auc']:.3f}" in printed
    datasets.load_from_disk(str(out))["train"].to_parquet(str(tmp_path / "converted.parquet"))
    again = verifier_check.main(["--data", str(tmp_path / "converted.parquet"), *argv, "--limit", "3"])
    assert again["counts"]["rows_read"] == 3 and again["counts"]["calls_used"] == 3
    assert again["results"]["cosine"]["rows"] == 3
