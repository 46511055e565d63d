"""`research.clip_gate` (issue 60, item 1): the label kinds the walk is reported by, the pixel reader that gives the
walk's ceiling, the same-size crops the walk term trains on (by hand), and the trainers' pool against the gate's own
crops. No CLIP is trained or scored."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from data.synthetic import COLOURS, SHAPES, SIGN_LABEL, build_synthetic, referent_label
from data.trajectories import TrajectoryArguments
from evaluation.verifier_check import gold_crops, miss_crops
from research.clip_gate import (
    WORLDS,
    cut_gold,
    framing_box,
    implies,
    label_kind,
    pixel_score,
    same_size_crops,
    world_pool,
)
from rewards.verifiers import Scene
from tiny import stages
from tools import PixelBudget, ToolConfig, ZoomCall, box_contains, boxes_overlap, make_environment_factory
from utils.models import load_processor, pixel_budget

SIDE = 224
SAME_FRAME = PixelBudget(3136, SIDE * SIDE, 28)  # the model sees a 224 px image at its own size: boxes map 1:1
BACKGROUND = (200, 205, 210)  # as the worlds': every channel >= 160, near no `COLOURS` entry


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        (SIGN_LABEL, "sign"),
        ("the red star and the blue circle", "pair"),  # a position question's two objects
        (referent_label("square", "yellow", plural=True), "group"),  # a count: "the yellow squares"
        (referent_label("cross", "green", plural=True), "group"),  # "the green crosses": plural of a shape ending in s
        (referent_label(colour="green"), "colour"),  # a shape question's referent: "the green object"
        (referent_label("cross"), "shape"),  # a colour question's: "the cross", which ends in s but is one shape
        (referent_label("triangle"), "shape"),
    ],
)
def test_label_kind_names_each_kind_of_the_worlds_labels(label, kind):
    assert label_kind(label) == kind


def test_every_single_shape_and_colour_label_has_its_kind():
    assert {label_kind(referent_label(s)) for s in SHAPES} == {"shape"}
    assert {label_kind(referent_label(colour=c)) for c in COLOURS} == {"colour"}
    assert {label_kind(referent_label(s, c, plural=True)) for s in SHAPES for c in COLOURS} == {"group"}


@pytest.mark.parametrize(
    ("shown", "label", "implied"),
    [
        ("the green crosses", "the cross", True),  # the plural of a shape ending in s
        ("the green crosses", "the green object", True),
        ("the red star and the blue circle", "the circle", True),
        ("the red star and the blue circle", "the blue object", True),
        ("the red star and the blue circle", "the green object", False),
        ("the red hexagon and the green star", "the red hexagons", False),  # only generic labels are implied
        ("the triangle", "the green object", False),  # the crop's label does not say its colour
        (SIGN_LABEL, "the cross", False),
        ("the cross", "the cross", True),  # the trainer keeps a crop's own label a positive
    ],
)
def test_implies_reads_a_generic_label_off_the_crops_own_label(shown, label, implied):
    assert implies(shown, label) is implied


def test_pixel_score_counts_the_named_colours_pixels_else_every_object_pixel():
    """An 8 x 8 background with 6 green pixels, 4 red and 2 of the sign's ink: a colour label counts its colours'
    pixels; a label naming none counts the pixels with a channel below 150 (all 12), which the background never has."""
    pixels = np.full((8, 8, 3), BACKGROUND, dtype=np.uint8)
    pixels[0:2, 0:3] = COLOURS["green"]
    pixels[5:7, 5:7] = COLOURS["red"]
    pixels[7, 0:2] = (20, 20, 20)
    crop = Image.fromarray(pixels)
    assert pixel_score(crop, referent_label(colour="green")) == 6
    assert pixel_score(crop, "the red star and the green circle") == 10
    assert pixel_score(crop, referent_label(colour="blue")) == 0
    assert pixel_score(crop, referent_label("triangle")) == 12
    assert pixel_score(crop, SIGN_LABEL) == 12


def test_same_size_crops_hold_the_whole_target_or_miss_it_at_the_gold_box_size():
    """The tool's crops, at the gold box's size: `hold` crops contain the target, misses share no area with it; a box
    that cannot move off the target gets no misses."""
    make_env = make_environment_factory(ToolConfig(), SAME_FRAME)
    image = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    target = (100, 90, 130, 120)
    call = ZoomCall(1, None, "the star", (80, 70, 160, 150), None)  # an 80 px gold box round the target
    scene = Scene(image, target, "the star")
    rng = np.random.default_rng(0)
    held = same_size_crops(call, scene, make_env, 5, rng, hold=True)
    missed = same_size_crops(call, scene, make_env, 5, rng, hold=False)
    assert len(held) == 5 and len(missed) == 5
    assert all(c.ok and c.label == "the star" for c in held + missed)
    assert {(c.box[2] - c.box[0], c.box[3] - c.box[1]) for c in held + missed} == {(80, 80)}
    assert len({c.crop.size for c in held + missed}) == 1  # the tool fits each to its budget alike
    assert all(box_contains(c.box, target) for c in held)
    assert not any(boxes_overlap(c.box, target) for c in missed)
    assert len({c.box for c in held}) > 1 and len({c.box for c in missed}) > 1  # drawn, not one fixed place
    huge = ZoomCall(1, None, "the star", (0, 0, 200, 200), None)  # no 200 px box of 224 avoids the middle target
    assert same_size_crops(huge, scene, make_env, 3, rng, hold=False) == []
    assert same_size_crops(call, scene, make_env, 0, rng, hold=True) == []


@pytest.mark.parametrize("gold_box", ["region", "tight"])
def test_world_pool_trains_on_the_crops_the_gate_cuts(tiny_kit, gold_box):
    """The pool's gold crops are the gate's (`gold_crops` with the same `gold_box`), pixel for pixel, in both worlds;
    each row's misses start with the gate's corner miss; shifted crops and extra misses come per row as asked."""
    crops, labels, misses, variants = world_pool(3, seed=1, own_misses=2, shifted=1, gold_box=gold_box)
    budget = pixel_budget(load_processor(tiny_kit["policy"]))
    make_env = make_environment_factory(ToolConfig(clip_model=str(tiny_kit["clip"])).resolved(budget), budget)
    calls, corners = [], []
    for world in WORLDS:
        rows = list(build_synthetic(3, seed=1, split="train", **(stages.recipe_world() | WORLDS[world])))
        got, scenes = gold_crops(rows, make_env, TrajectoryArguments(gold_box=gold_box))
        calls += got
        corners += miss_crops(got, scenes, make_env)
    assert labels == [c.label for c in calls]
    assert all(np.array_equal(np.asarray(a), np.asarray(c.crop)) for a, c in zip(crops, calls, strict=True))
    assert len(variants) == len(crops) and all(len(v) <= 1 for v in variants)
    for row, corner in enumerate(corners):
        own = [crop for r, crop in misses if r == row]
        if corner is not None:
            assert own and np.array_equal(np.asarray(own[0]), np.asarray(corner.crop))
        assert len(own) <= 3


def test_framing_box_is_a_square_of_the_side_round_the_target_inside_the_image():
    """By hand, on a 300 x 200 image: centred; moved in at an edge; grown to a target larger than the side; cut to the
    image when the side exceeds it."""
    assert framing_box([140, 90, 160, 110], (300, 200), 60) == (120, 70, 180, 130)
    assert framing_box([0, 0, 20, 20], (300, 200), 60) == (0, 0, 60, 60)
    assert framing_box([270, 170, 300, 200], (300, 200), 60) == (240, 140, 300, 200)
    assert framing_box([100, 50, 200, 90], (300, 200), 60) == (100, 40, 200, 100)  # 100 wide: the target's width
    assert framing_box([140, 90, 160, 110], (300, 200), 500) == (0, 0, 300, 200)


def test_cut_gold_by_side_frames_each_target_in_a_box_of_that_side():
    """A numeric `gold_box`: each row's crop is the tool's call on the framing box, with the row's label; every box
    holds its target and has the side asked (the seen frame is the image here, so boxes map 1:1)."""
    make_env = make_environment_factory(ToolConfig(), SAME_FRAME)
    image = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    targets = [[10, 10, 30, 30], [100, 90, 130, 120], [190, 200, 224, 224]]
    rows = [{"image": image, "target_bbox": t, "target_label": f"the star {i}"} for i, t in enumerate(targets)]
    calls, scenes = cut_gold(rows, make_env, "64")
    assert [c.label for c in calls] == [r["target_label"] for r in rows]
    assert [s.target_bbox for s in scenes] == targets
    for call, target in zip(calls, targets, strict=True):
        assert call.ok and box_contains(call.box, target)
        assert (call.box[2] - call.box[0], call.box[3] - call.box[1]) == (64, 64)
