"""The synthetic visual-search data: schema, determinism, and that the target is where `target_bbox` says, legible
there, and only a few pixels wide at the tiny model's resolution (so answering needs the zoom)."""

import math
import re

import datasets
import numpy as np
import pytest
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from data import DATASETS, get_dataset, task
from data.synthetic import (
    _QUESTION_BUILDERS,
    COLOURS,
    QUESTION_TYPES,
    REGIONS,
    SHAPES,
    WORDS,
    _place_pair,
    build_synthetic,
    chance_accuracy,
    main,
    object_label,
    region_cell,
    region_of,
    render_object,
)
from tests.tolerance import FLOAT64, approx

SMALL = {"min_size": 600, "max_size": 900}  # fast, and still big enough for every layout
TINY_BUDGET = {"factor": 28, "min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}  # the tiny test model's
COLUMNS = {"id", "source", "prompt", "image", "answer", "options", "target_bbox", "target_label"}


@pytest.fixture(scope="module")
def small() -> datasets.Dataset:
    return build_synthetic(10, seed=1, **SMALL)  # every question type twice


@pytest.fixture(scope="module")
def full_size() -> datasets.Dataset:
    return build_synthetic(5, seed=0)  # default 1500-3000 px sides, every question type once


def resolved_answer(row: dict) -> str:
    """The answer as text: the option the letter names for multiple choice, else the answer itself."""
    return row["options"][task.OPTION_LETTERS.index(row["answer"])] if row["options"] else row["answer"]


def target_colour(row: dict) -> str:
    """The colour of the (first) target: the answer of a colour question, else the first colour its label names."""
    if row["source"] == "synthetic/colour":
        return resolved_answer(row)
    return next(word for word in row["target_label"].split() if word in COLOURS)


def colour_mask(pixels: np.ndarray, colour: str, tolerance: int = 40) -> np.ndarray:
    return np.abs(pixels.astype(int) - COLOURS[colour]).max(axis=-1) <= tolerance


def ink_mask(pixels: np.ndarray) -> np.ndarray:
    """The sign's black text: nothing else in a scene (pale background, saturated decoys) is that dark."""
    return (pixels < 70).all(axis=-1)


def in_box(shape: tuple[int, int], bbox: list[int]) -> np.ndarray:
    inside = np.zeros(shape, dtype=bool)
    x1, y1, x2, y2 = bbox
    inside[y1:y2, x1:x2] = True
    return inside


def extent(mask: np.ndarray) -> tuple[int, int]:
    """Height and width of the smallest box holding every True pixel."""
    ys, xs = np.nonzero(mask)
    return int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)


def test_schema(small):
    assert set(small.column_names) == COLUMNS
    assert isinstance(small.features["image"], datasets.Image)
    assert [row["id"] for row in small] == [f"train-{i:06d}" for i in range(10)]
    assert [row["source"] for row in small] == [f"synthetic/{t}" for t in QUESTION_TYPES] * 2
    for row in small:
        image = row["image"]
        assert image.mode == "RGB" and all(600 <= side <= 900 for side in image.size)
        assert row["prompt"][0] == {"role": "system", "content": task.SYSTEM_PROMPT}
        assert row["prompt"][1]["role"] == "user" and task.USER_SUFFIX in row["prompt"][1]["content"]
        assert len(row["target_bbox"]) == 4 and all(isinstance(v, int) for v in row["target_bbox"])
        assert isinstance(row["answer"], str) and isinstance(row["options"], list)


def test_deterministic_and_split_dependent():
    def raw(**kwargs) -> list[dict]:
        dataset = build_synthetic(**kwargs, **SMALL).cast_column("image", datasets.Image(decode=False))
        return dataset.to_list()

    first = raw(n=3, seed=7, split="train")
    assert first == raw(n=3, seed=7, split="train")  # same rows, same PNG bytes
    assert raw(n=2, seed=7, split="train") == first[:2]  # a row does not depend on n
    for other in (raw(n=3, seed=7, split="test"), raw(n=3, seed=8, split="train")):
        assert all(a["image"]["bytes"] != b["image"]["bytes"] for a, b in zip(first, other))


def test_answers_are_consistent(small):
    for row in small:
        options, answer = row["options"], row["answer"]
        if options:
            assert len(options) == 4 and len(set(options)) == 4 and answer in task.OPTION_LETTERS[:4]
            assert sum(task.is_correct(option, answer, options) for option in options) == 1
        else:
            assert answer and task.is_correct(answer, answer)
        text, source = resolved_answer(row), row["source"].removeprefix("synthetic/")
        if source == "colour":
            assert text in COLOURS
        elif source == "shape":
            assert text in SHAPES
        elif source == "text":
            assert text.isdigit() or text in WORDS
        elif source == "count":
            assert 2 <= int(text) <= 6
        else:
            assert text in ("left", "right", "above", "below")


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_labels_name_the_referent_never_the_answer():
    """A zoom label is what the model expects to see before it zooms: the question's referent. Over 2,000 questions
    of every type, open and multiple choice, no label holds the answer or any option, and every word of the label
    but the connectives comes from the question. Labels and answers are made by the question builders alone (the row
    test above checks that rows carry them unchanged), so they are drawn directly, without rendering 2,000 images."""
    rng = np.random.default_rng(0)
    seen = set()
    for i in range(2000):
        kind = QUESTION_TYPES[i % len(QUESTION_TYPES)]
        q = _QUESTION_BUILDERS[kind](rng, multiple_choice=bool(i % 2))
        label = q.label.lower()
        for text in (q.answer, *q.wrong):
            assert text.lower() not in label, (kind, q.question, q.label, q.answer)
        assert _words(q.label) - {"the", "and", "object", "objects"} <= _words(q.question), (q.question, q.label)
        seen.add(q.label)
    assert len(seen) > 50  # the referents vary with the question, not one fixed label


def test_rows_carry_referent_labels(small):
    for row in small:
        label, answer = row["target_label"].lower(), resolved_answer(row).lower()
        assert answer not in label and not any(option.lower() in label for option in row["options"])


def test_multiple_choice_fraction():
    assert all(row["options"] == [] for row in build_synthetic(5, mc_fraction=0.0, **SMALL))
    assert all(len(row["options"]) == 4 for row in build_synthetic(5, mc_fraction=1.0, **SMALL))


@pytest.mark.parametrize("direction", ["left", "right", "above", "below"])
def test_pair_layout_makes_exactly_one_direction_true(direction):
    sprites = [render_object("circle", 20, "red"), render_object("WOLF", 20)]
    rng = np.random.default_rng(0)
    for _ in range(50):
        boxes = _place_pair(rng, sprites, direction, (0, 0, 400, 400))
        if boxes is None:
            continue
        (ax, ay), (bx, by) = [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in boxes]
        holds = {"left": bx - ax > 30, "right": ax - bx > 30, "above": by - ay > 30, "below": ay - by > 30}
        assert [d for d, true in holds.items() if true] == [direction]


def test_target_is_inside_its_box(small):
    """The answer's colour (or the sign's ink) is inside `target_bbox` and (nearly) nowhere else."""
    for row in small:
        pixels = np.asarray(row["image"])
        height, width = pixels.shape[:2]
        x1, y1, x2, y2 = row["target_bbox"]
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        inside = in_box((height, width), row["target_bbox"])
        source = row["source"].removeprefix("synthetic/")
        if source == "text":
            mask = ink_mask(pixels)
            assert mask[inside].sum() > 5 and mask[~inside].sum() == 0  # a 12 px sign has thin, grey-ish strokes
            continue
        mask = colour_mask(pixels, target_colour(row))
        assert mask[inside].sum() > 25  # a 12 px star, the smallest object at these sizes, has ~50
        if source in ("colour", "shape"):  # count and position scenes hold same-coloured look-alikes on purpose
            assert mask[~inside].sum() < 0.05 * mask[inside].sum()


def test_target_needs_zoom_at_tiny_resolution(full_size):
    """At the default sizes the target is legible in the original (>= 20 px) but under 3 px once the image is
    downscaled to the tiny model's ~112x112 budget."""
    for row in full_size:
        image = row["image"]
        assert all(1500 <= side <= 3000 for side in image.size)
        resized_h, resized_w = smart_resize(image.height, image.width, **TINY_BUDGET)
        scale = math.sqrt(resized_h * resized_w / (image.height * image.width))
        crop = np.asarray(image.crop(row["target_bbox"]))
        source = row["source"].removeprefix("synthetic/")
        if source == "text":
            glyph_height, _ = extent(ink_mask(crop))
            assert 12 <= glyph_height and glyph_height * scale < 2
        elif source in ("colour", "shape"):
            size = max(extent(colour_mask(crop, target_colour(row))))
            assert 20 <= size and size * scale < 3


def test_labels_are_short(small, full_size):
    for row in [*small, *full_size]:
        label = row["target_label"]
        assert 0 < len(label) <= 80 and len(label.split()) <= 12


def test_render_object_and_label():
    star = render_object("star", 30, "red")
    assert star.mode == "RGBA" and star.size == (30, 30)
    alpha = np.asarray(star)[..., 3]
    assert alpha[15, 15] == 255 and alpha[0, 0] == 0  # filled centre, transparent corner
    sign = render_object("4821", 30)
    assert sign.mode == "RGBA" and sign.height == 30 and sign.width > sign.height
    assert object_label("star", "red") == "red star"
    assert object_label("4821") == "digits 4821" and object_label("FISH") == "text FISH"
    with pytest.raises(ValueError, match="colour"):
        render_object("star", 30)


def test_registry():
    assert DATASETS["synthetic"] is build_synthetic
    assert len(get_dataset("synthetic", n=1, **SMALL)) == 1
    with pytest.raises(ValueError, match="synthetic"):
        get_dataset("no-such-dataset")


def test_cli_saves_to_disk(tmp_path, monkeypatch):
    argv = ["synthetic", "--n", "2", "--split", "val", "--min_size", "600", "--max_size", "700"]
    monkeypatch.setattr("sys.argv", [*argv, "--output_dir", str(tmp_path)])
    main()
    saved = datasets.load_from_disk(str(tmp_path))
    assert saved["id"] == ["val-000000", "val-000001"]
    assert saved["answer"] == build_synthetic(2, split="val", min_size=600, max_size=700)["answer"]


def test_question_types_and_object_fraction_are_chosen_and_checked():
    rows = build_synthetic(4, question_types=["shape", "count"], **SMALL)
    assert [row["source"] for row in rows] == ["synthetic/shape", "synthetic/count"] * 2
    with pytest.raises(ValueError, match="question_types must be a non-empty subset"):
        build_synthetic(1, question_types=["colour", "weight"], **SMALL)
    with pytest.raises(ValueError, match="object_fraction must be"):
        build_synthetic(1, object_fraction=(0.05, 0.01), **SMALL)


def test_region_cells_and_region_of_by_hand():
    # A 90 x 60 image: columns at 0, 30, 60, 90 and rows at 0, 20, 40, 60; cells are numbered row by row.
    assert region_cell(0, 90, 60) == (0, 0, 30, 20)
    assert region_cell(5, 90, 60) == (60, 20, 90, 40)  # "right"
    assert region_cell(8, 90, 60) == (60, 40, 90, 60)
    assert REGIONS[5] == "right" and REGIONS[4] == "center"
    assert region_of([61, 21, 70, 30], 90, 60) == 5
    assert region_of([0, 0, 90, 60], 90, 60) == 4  # the centre (45, 30) is in the middle cell
    assert region_of([80, 50, 90, 60], 90, 60) == 8  # a box ending on the image's edge stays in the last cell


def test_region_hint_names_the_cell_that_holds_the_whole_target():
    rows = build_synthetic(10, seed=1, region_hint=True, **SMALL)  # every question type twice
    regions = set()
    for row in rows:
        width, height = row["image"].size
        region = region_of(row["target_bbox"], width, height)
        regions.add(region)
        x1, y1, x2, y2 = region_cell(region, width, height)
        box = row["target_bbox"]
        assert x1 <= box[0] and y1 <= box[1] and box[2] <= x2 and box[3] <= y2
        question = row["prompt"][-1]["content"].split("\n")[0]
        assert question.endswith(f" Look in the {REGIONS[region]} of the image."), question
        assert sum(f"the {name} of" in question for name in REGIONS) == 1
    assert len(regions) >= 5  # drawn, not one fixed cell
    plain = build_synthetic(2, seed=1, **SMALL)
    assert not any("Look in" in row["prompt"][-1]["content"] for row in plain)


def test_region_hint_refuses_clusters_too_big_for_a_cell():
    with pytest.raises(ValueError, match="region_hint: a count question's cluster does not fit"):
        build_synthetic(1, region_hint=True, object_fraction=(0.02, 0.04), **SMALL)
    rows = build_synthetic(2, region_hint=True, object_fraction=(0.02, 0.04), question_types=["shape"], **SMALL)
    assert len(rows) == 2


@pytest.mark.parametrize(
    "source, options, expected",
    [("synthetic/colour", [], 1 / 8), ("synthetic/shape", [], 1 / 7), ("synthetic/count", [], 1 / 5),
     ("synthetic/position", [], 1 / 2), ("synthetic/text", [], 1 / 80), ("synthetic/text", ["A", "B", "C", "D"], 1 / 4)],
)  # fmt: skip
def test_chance_accuracy(source, options, expected):
    assert chance_accuracy(source, options) == approx(expected, FLOAT64, terms=1)


def test_chance_accuracy_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="unknown synthetic source 'synthetic/weight'"):
        chance_accuracy("synthetic/weight")
