"""`python -m data.convert` on small releases the tests write in each public dataset's published layout
(`tests/release_fixtures.py`: each cites the upstream loader or card it follows, and its crops are made by a
transcription of the project's own crop code): every box composed into the original (relative, absolute,
crop-of-crop, padded, code read with `ast`), checked against the crops the release ships, replayed by the real tool
onto the target; the defects of issue 29, one row each with its hand-worked box; bad rows skipped and counted by
reason; a wrong convention caught as `crop_mismatch`; a wrong `--format` failing at once; the derived labels; the
preview (rendered in headless Chromium where it exists); and SFT training on a converted set."""

import html
import io
import json
import re
import subprocess
import textwrap
from pathlib import Path

import datasets
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from trl import ModelConfig

import sft
from configs import ScriptArguments, SFTConfig, TrajectoryArguments
from data import convert
from data.converters import labels
from data.converters.code_reader import CodeReader
from data.converters.common import (
    EDGE_TOLERANCE,
    LayoutError,
    SkipRow,
    content_images,
    content_parts,
    content_text,
    relative_to_pixels,
    to_image_box,
)
from data.converters.crop_check import Readings, crop_disagreement
from data.converters.labels import derive_label
from data.converters.thyme import thyme_clamp
from data.rows import Trajectory
from data.task import build_prompt, extract_answer
from data.trajectories import build_gold_trajectories, replay_calls
from tests.release_fixtures import (
    QUESTION,
    SIZE,
    TARGET,
    as_null_keyed_parts,
    cof_crop,
    cof_record,
    deepeyes_v2_record,
    mini_o3_observation,
    mini_o3_process_image,
    mini_o3_row,
    pixel_reasoner_crop,
    pixel_reasoner_record,
    pixel_reasoner_resize,
    resave_with_datasets,
    scene,
    think,
    thyme_record,
    write_cof,
    write_deepeyes_v2,
    write_mini_o3,
    write_pixel_reasoner,
    write_thyme,
)
from tests.release_fixtures import thyme_clamp as release_thyme_clamp
from tests.tolerance import FLOAT64, approx
from tiny import stages
from tools import ToolConfig, box_contains, make_environment_factory
from utils.recipes import parse_args_and_record, real_recipe_budget

CHROMIUM = Path("/usr/bin/chromium")
FIRST = {"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}  # (200, 60, 320, 180)
SECOND = {"bbox_2d": [0.25, 0.2, 0.9, 0.8], "source": "observation_1"}  # inside FIRST's 120 x 120: (230, 84, 308, 156)
SQUARE = [240, 90, 300, 150]  # the 60 px box around the target most rows zoom on


def converted(tmp_path: Path, fmt: str, source: Path, preview: int = 0) -> tuple[datasets.Dataset, dict]:
    out = tmp_path / f"{fmt}-out"
    stats = convert.main(["--format", fmt, "--input", str(source), "--output", str(out), "--preview", str(preview)])
    assert json.loads((out / "stats.json").read_text()) == {k: v for k, v in stats.items() if k != "preview"}
    return datasets.load_from_disk(str(out))["train"], stats


def conversion(tmp_path: Path, fmt: str, source: Path) -> tuple[datasets.Dataset | None, dict]:
    """`converted`, also when no row converts (the CLI then exits): (the dataset or None, the stats)."""
    trajectories, stats = convert.convert(fmt, source, ToolConfig())
    if not trajectories:
        return None, stats
    return converted(tmp_path, fmt, source)


def boxes(dataset: datasets.Dataset) -> list[list[list[int]]]:
    return [[call["box"] for call in row["gold_calls"]] for row in dataset]


def replayed_boxes(dataset: datasets.Dataset) -> list[list[tuple]]:
    """Per row, the original-pixel boxes the real tool cropped when SFT replayed its calls."""
    env = make_environment_factory(ToolConfig(), real_recipe_budget(None)[1])()
    out = []
    for row in dataset:
        replay_calls(row, env)
        out.append([call.box for call in env.calls])
    return out


def assert_every_crop_shows_the_target(dataset):
    for row, replayed in zip(dataset, replayed_boxes(dataset)):
        assert replayed, row["id"]
        for call, box in zip(row["gold_calls"], replayed):
            assert box_contains(call["box"], TARGET), (row["id"], call["box"])
            assert box_contains(box, TARGET), (row["id"], box)  # the tool's crop, mapped back from the seen frame


# ------------------------------------------------------------------------------------------------------ geometry
def test_relative_boxes_compose_into_the_original_and_overshoot_is_a_skip():
    assert relative_to_pixels([0.5, 0.2, 0.8, 0.6], (0, 0, 400, 300)) == (200.0, 60.0, 320.0, 180.0)
    # relative to a crop whose extent is (200, 60, 320, 180): 120 x 120
    assert relative_to_pixels([0.25, 0.2, 0.9, 0.8], (200, 60, 320, 180)) == approx(
        (230, 84, 308, 156), FLOAT64, terms=3
    )  # x extent + offset, in float64
    assert to_image_box((10.2, 20.7, 30.1, 40.9), SIZE) == (10, 20, 31, 41)  # rounded outwards
    assert to_image_box((-3, 0, 403, 300), SIZE) == (0, 0, 400, 300)  # within 1% of a side: cut to the image
    with pytest.raises(SkipRow, match="box_outside_image"):
        to_image_box((0, 0, 400 * (1 + 2 * EDGE_TOLERANCE), 300), SIZE)
    with pytest.raises(SkipRow, match="box_outside_image"):
        to_image_box((50, 50, 50, 80), SIZE)  # empty


# The ten derived labels docs/data.md shows: (thought before the call, question) -> (label, label_source).
DERIVED = [
    ("I need to zoom in on the red square to read it.", QUESTION, ("the red square", "thought")),
    ("Let me look at this image closely.", QUESTION, ("the small square", "question")),
    ("", "What is the colour of the umbrella?", ("the umbrella", "question")),
    ("", "How many apples are on the table?", ("the apples", "question")),
    ("I will zoom in on the license plate of the car.", "What is the plate number?", ("the license plate", "thought")),
    ("", "Is the cup to the left of the laptop?", ("the cup", "question")),
    ("", "What is written on the sign?", ("the sign", "question")),
    ("To answer, I should focus on the woman's handbag.", "What brand is it?", ("the woman's handbag", "thought")),
    ("The text is tiny; let me crop the top banner.", "What does the banner say?", ("the banner", "question")),
    ("I should check the clock on the tower.", "What time does the clock show?", ("the clock", "thought")),
]


@pytest.mark.parametrize(("thought", "question", "label"), DERIVED)
def test_labels_derive_from_the_thought_then_the_question(thought, question, label):
    assert derive_label(thought, question) == label


# The question rule before issue 59 (quadratic on "the the the ..."), kept as the oracle of the bounded one.
_OLD_PHRASE = r"((?:the|a|an|this|that|these|those)\s+[^.,;:!?()\[\]{}\n\"]+)"
_OLD_FROM_QUESTION = re.compile(rf"\b(?={_OLD_PHRASE})", re.IGNORECASE)


def old_question_label(question: str) -> str | None:
    for match in _OLD_FROM_QUESTION.finditer(question):
        candidate = match.group(1)
        if labels._DO_QUESTION.match(question) and not question[match.end(1) :].strip(" ?"):
            candidate = candidate.rsplit(maxsplit=1)[0]
        phrase = labels._noun_phrase(candidate)
        if phrase:
            return phrase
    return None


QUESTION_SOUP = ("What does ", "What ", "Is ", "the ", "a ", "This ", "red ", "man ", "hold", "of ", "in ", "sign",
                 " ", "  ", "?", "? ", ", ", ".", "\n", "x" * 90, "word " * 8, "image ", "colour ")  # fmt: skip


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(QUESTION_SOUP), max_size=24).map("".join))
@example("What does the man hold?")  # the phrase ends the question: its last word, the verb, is dropped
@example("What does the man hold ? ")
@example("What does the " + "x" * 300 + " man hold?")  # a phrase past the cap
def test_a_bounded_phrase_derives_every_label_the_tool_can_take_as_before(question):
    """Issue 59, item 4: the question's phrases are read to at most `MAX_PHRASE_CHARS` and the end-of-question test no
    longer copies the rest of the question per phrase (`"the " * 40,000` took ~85 s). Every label within the tool's
    80 characters is the old rule's."""
    old, new = old_question_label(question), derive_label("", question)
    limit = ToolConfig().max_label_chars
    if old is not None and len(old) <= limit:
        assert new == (old, "question")
    elif new is not None and new[0] != old:  # a phrase past the cap: cut, and still too long for the tool
        assert len(new[0]) > limit


def test_no_label_is_invented_when_neither_names_a_thing():
    assert derive_label("Hmm.", "Is it daytime?") is None
    assert derive_label("Let me look at the top left.", "What is in the image?") is None


# ---------------------------------------------------------------------------------------------------- crop check
def test_the_crop_check_accepts_upstream_crops_and_rejects_other_regions():
    """The check against a release's own crops, on crops made by the upstream transcriptions: Mini-o3's truncated,
    NEAREST-resized observation and PixelReasoner's padded, smart-resized crop agree with the converter's boxes; a
    box shifted by a third of its side, one with x and y swapped, and CoF's 1.5x enlargement of the same box do not
    (the first two by content at an equal aspect, the last by content)."""
    image = scene()
    shipped = mini_o3_process_image(mini_o3_observation([image], FIRST))
    assert crop_disagreement(image, (200, 60, 320, 180), shipped) == (None, True)
    padded = pixel_reasoner_resize(pixel_reasoner_crop(image, [0.6, 0.3, 0.75, 0.5]))  # (200, 60, 340, 180), 140x112
    assert crop_disagreement(image, (200, 60, 340, 180), padded, resize_step=28) == (None, True)
    why, content = crop_disagreement(image, (240, 50, 300, 110), image.crop(SQUARE))  # 40 px up
    assert why.startswith("content correlation") and content
    why, _ = crop_disagreement(image, (90, 240, 150, 300), image.crop(SQUARE))  # x and y swapped
    assert why.startswith("content correlation")
    why, _ = crop_disagreement(image, (200, 60, 320, 180), cof_crop(image, [200, 60, 320, 180], enlarge_factor=1.5))
    assert why.startswith("content correlation")
    why, content = crop_disagreement(image, (200, 60, 320, 120), image.crop((200, 60, 320, 180)))
    assert why == "aspect 120x60 vs the release's 120x120 crop" and not content


# ------------------------------------------------------------------------------------------------------ Mini-o3
# A call their tool rejects although its box is valid for ours: 320 x 1 px, aspect over 200 (function_tools.py).
REJECTED = {"bbox_2d": [0.1, 0.5, 0.9, 0.505], "source": "original_image"}


def test_mini_o3_release(tmp_path):
    """Mini-o3's parquet release. Boxes relative to their source compose through it; `observation_i` is the i-th image
    the release shows, so a call their tool rejected (no image) does not shift it (issue 29, defect 5: the old reader
    took REJECTED's box as observation 1); a crop cut with x and y swapped is caught by the check."""
    on_missing = mini_o3_row([FIRST], index=4)
    on_missing["conversations"] = on_missing["conversations"].replace("original_image", "observation_3")
    rows = [
        mini_o3_row([FIRST, SECOND], index=0),
        mini_o3_row([REJECTED, FIRST, SECOND], index=1),  # observation_1 is FIRST's crop: (230, 84, 308, 156)
        mini_o3_row([FIRST], answer="", index=2),
        mini_o3_row([{"bbox_2d": [0.5, 0.2, 0.8, 0.8], "source": "original_image"}], plant="swap_xy", index=3),
        on_missing,  # shows an image after a call on an observation that does not exist yet
    ]
    dataset, stats = converted(tmp_path, "mini_o3_coldstart", write_mini_o3(tmp_path / "in", rows))
    assert stats["rows_read"] == 5 and stats["rows_converted"] == 2
    assert stats["rows_skipped"] == {"bad_source": 1, "crop_mismatch": 1, "empty_answer": 1}
    assert boxes(dataset) == [[[200, 60, 320, 180], [230, 84, 308, 156]]] * 2
    assert stats["calls_failed_upstream"] == 1
    assert stats["crop_check"] == {"calls_checked": 4, "calls_checked_by_content": 4, "rows_mismatched": 1}
    assert dataset[0]["gold_calls"][1]["thought"] == "Step 1: I zoom in on the red square."
    # the failed step 0 is dropped with its thought
    assert dataset[1]["gold_calls"][0]["thought"] == "Step 1: I zoom in on the red square."
    assert stats["calls_by_label_source"] == {"dataset": 0, "thought": 4, "question": 0}
    assert dataset[0]["final_thought"] == "It is red." and dataset[0]["answer"] == "red"
    assert dataset[0]["prompt"] == build_prompt(QUESTION)
    assert "crop_mismatch" in stats["skipped_examples"] and "row 3" in stats["skipped_examples"]["crop_mismatch"][0]
    assert_every_crop_shows_the_target(dataset)


def test_rows_over_the_rl_recipes_call_limit_are_dropped_and_counted(tmp_path):
    """Issue 47, item 2: a row with more calls than the paired RL recipe's max_tool_calling_iterations (mapo_paper's 5
    unless --rl_recipe or --max_calls says otherwise) is dropped as `too_many_calls`; every converted row is in the
    calls-per-row histogram; thoughts naming Mini-o3's observations, which this repo's conversation never shows, are
    counted."""
    named = mini_o3_row([FIRST], index=2)
    named["conversations"] = named["conversations"].replace("It is red.", "Observation 1 shows it is red.")
    rows = [mini_o3_row([FIRST, SECOND], index=0), mini_o3_row([FIRST] * 6, index=1), named]
    root = write_mini_o3(tmp_path / "in", rows)
    dataset, stats = converted(tmp_path, "mini_o3_coldstart", root)
    assert stats["max_calls"] == 5 and stats["calls_per_row"] == {"1": 1, "2": 1, "6": 1}
    assert stats["rows_converted"] == 2 and stats["rows_skipped"] == {"too_many_calls": 1}
    assert stats["skipped_examples"]["too_many_calls"] == ["row train-00000-of-00001-1-0: 6 calls, over max_calls=5"]
    assert [len(row["gold_calls"]) for row in dataset] == [2, 1]
    assert stats["thoughts_naming_observations"] == 1
    for flags, limit, dropped in (
        (["--rl_recipe", "recipes/tiny/rl/config_mapo.yaml"], 2, 1),
        (["--max_calls", "1"], 1, 2),
    ):
        out = tmp_path / f"limit-{limit}"
        stats = convert.main(["--format", "mini_o3_coldstart", "--input", str(root), "--output", str(out), *flags])
        assert stats["max_calls"] == limit and stats["rows_skipped"] == {"too_many_calls": dropped}, flags


def test_the_stats_count_crops_under_the_floor_and_the_release_s_own_sizes(tmp_path):
    """Issue 47, item 1: each kept call's crop sized as SFT's replay shows it, under the real RL recipes' budget: the
    400x300 original is seen at 392x308; FIRST's 120x120 region comes back as 121x121, natively 112x112 (16 tokens),
    under the 40,000-pixel floor 224x224 (64); SECOND's 78x72 region 84x84 (9), floored 224x196 (56). Mini-o3 ships
    its observations at 512x512 or so (process_image): larger than ours. A 10,000-pixel floor lifts SECOND only."""
    root = write_mini_o3(tmp_path / "in", [mini_o3_row([FIRST, SECOND], index=0), mini_o3_row([FIRST], index=1)])
    _, stats = converted(tmp_path, "mini_o3_coldstart", root)
    crops = stats["crops"]
    assert (crops["crop_min_pixels"], crops["calls"], crops["under_floor"]) == (40000, 3, 3)
    assert (crops["tokens_native"]["min"], crops["tokens_native"]["max"]) == (9, 16)
    assert (crops["tokens_shown"]["min"], crops["tokens_shown"]["max"]) == (56, 64)
    assert crops["release_pixels"]["min"] >= 510 * 510 and crops["release_larger_than_shown"] == 3
    out = tmp_path / "floor-10000"
    stats = convert.main(["--format", "mini_o3_coldstart", "--input", str(root), "--output", str(out),
                          "--crop_min_pixels", "10000"])  # fmt: skip
    assert (stats["crops"]["crop_min_pixels"], stats["crops"]["under_floor"]) == (10000, 1)


# -------------------------------------------------------------------------------------------------------- CoF
@pytest.mark.parametrize("layout", ["images_folder", "zip", "root"])
def test_cof_images_are_found_where_the_release_puts_them(tmp_path, layout):
    """Defect 6: CoF's paths are relative to `images/` (LLaMA-Factory's `dataset_dir`, the unzipped `images.zip`); the
    old reader tried the folder only, so every row was `missing_image`. A zip not unzipped is read in place."""
    root = write_cof(tmp_path / "in", [cof_record([(SQUARE, "the red square")])], layout=layout)
    dataset, stats = converted(tmp_path, "cof_sft", root)
    assert stats["rows_converted"] == 1 and boxes(dataset) == [[SQUARE]]


def test_cof_release(tmp_path):
    """CoF's absolute boxes keep their labels; the question loses CoF's instructions and its options go to `options`
    (defect 7); a call their tool rejected adds no image; a row whose crops were cut with CoF's 1.5x enlargement is
    read enlarged (issue 49, item 2: it was `crop_mismatch`), the box of its crop (170, 30, 350, 210), counted under its
    reading; bad rows are counted, a box past the image on its own reason under either reading."""
    good, files = cof_record([None, (SQUARE, "the red square")], question="Is the red square left or right?",
                             options=["left", "right"], answer="B", image_name="0.png")  # fmt: skip
    malformed, more = cof_record([(SQUARE, "the red square")], image_name="1.png")
    malformed["messages"][2]["content"] = (
        think("x") + '<tool_call>{"name": "image_zoom_in_tool", "arguments": {</tool_call>'
    )
    records = [
        (good, files),
        (malformed, more),
        cof_record([(SQUARE, "the red square")], image_name="2.png"),
        cof_record([([240, 90, 900, 150], "the red square")], image_name="3.png"),  # past the 400 px wide image
        cof_record([(SQUARE, "the red square")], answer=" ", image_name="4.png"),
        cof_record([(SQUARE, " ".join(["word"] * 13))], image_name="5.png"),
        cof_record([([200, 60, 320, 180], "the red square")], enlarge=1.5, image_name="6.png"),
    ]
    root = write_cof(tmp_path / "in", records)
    (root / "images" / "2.png").unlink()
    dataset, stats = converted(tmp_path, "cof_sft", root)
    assert stats["rows_read"] == 7 and stats["rows_converted"] == 2
    assert stats["rows_skipped"] == {"malformed_call": 1, "missing_image": 1, "box_outside_image": 1,
                                     "empty_answer": 1, "label_too_long": 1}  # fmt: skip
    assert stats["rows_by_reading"] == {"as_written": 1, "enlarged_1.5": 1}
    assert boxes(dataset)[1] == [[170, 30, 350, 210]]  # (200, 60, 320, 180) enlarged 1.5x about (260, 120)
    (call,) = dataset[0]["gold_calls"]
    assert call == {"box": SQUARE, "thought": "Too small; I zoom in.", "label": "the red square",
                    "label_source": "dataset"}  # fmt: skip
    assert dataset[0]["prompt"] == build_prompt("Is the red square left or right?", ["left", "right"])
    assert dataset[0]["options"] == ["left", "right"] and dataset[0]["answer"] == "B"
    assert stats["calls_failed_upstream"] == 1
    assert dataset[0]["source"] == "cof" and dataset[0]["id"] == "cof_sft_data-0"  # part files never share an id
    assert_every_crop_shows_the_target(dataset)


# ------------------------------------------------------------------------------------------------ PixelReasoner
def test_pixel_reasoner_release(tmp_path):
    """PixelReasoner: normalised and pixel boxes on a 1-based `target_image` over the images shown, padded by 0.1.
    Defect 5: a pixel box on a crop is in the pixels of the crop as shown (140 x 112 after their smart_resize), not
    of its extent in the original (140 x 120), and a rejected call adds no image. Defect 4: a video row is skipped on
    its own reason. A release whose crops were cut with a 0-based target is caught by the check."""
    # A (0.6, 0.3, 0.75, 0.5) on image 1, padded (0.5, 0.2, 0.85, 0.6): (200, 60, 340, 180), shown 140 x 112.
    # B (40, 30, 100, 90) px of image 2 as shown: / (140, 112), padded, x (140, 120) + (200, 60): (226, 80, 314, 169)
    # (the old reader divided by 140 x 120: (226, 78, 314, 162)).
    pixel = pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1), ([40, 30, 100, 90], 2)], qid="pixel")
    # C on image 2 is too small for their tool (28 px wide), so adds no image; D (0.55, 0.25, 0.7, 0.45) on image 1:
    # (180, 45, 320, 165) is image 3; E (0.2, 0.2, 0.8, 0.8) on image 3, padded: (194, 57, 306, 153). The old reader
    # counted C as image 3.
    failed = pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1), ([0.5, 0.5, 0.5, 0.5], 2), ([0.55, 0.25, 0.7, 0.45], 1),
                                    ([0.2, 0.2, 0.8, 0.8], 3)], qid="failed")  # fmt: skip
    frames = [{"type": "video", "video": ["images/0.png", "images/0.png"]}, {"type": "text", "text": QUESTION}]
    video = pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1)], qid="video", first_parts=frames)
    # Its last call, on image 2 as written, was cut from image 3 (0-based): (0, 0, 160, 120), far from image 2.
    planted = pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1), ([0.1, 0.1, 0.3, 0.3], 1), ([0.2, 0.2, 0.8, 0.8], 2)],
                                    qid="zero_based", plant="zero_based")  # fmt: skip
    root = write_pixel_reasoner(tmp_path / "in", [pixel, failed, video, planted], zipped=True)
    dataset, stats = converted(tmp_path, "pixel_reasoner_sft", root)
    assert stats["rows_read"] == 4 and stats["rows_skipped"] == {"video": 1, "crop_mismatch": 1}
    assert boxes(dataset) == [[[200, 60, 340, 180], [226, 80, 314, 169]],
                              [[200, 60, 340, 180], [180, 45, 320, 165], [194, 57, 306, 153]]]  # fmt: skip
    assert stats["calls_failed_upstream"] == 1 and dataset["id"] == ["pixel", "failed"]
    assert dataset[0]["answer"] == "red"
    assert stats["rows_by_reading"] == {"padded_0.1": 2}
    assert_every_crop_shows_the_target(dataset)


def test_pixel_reasoner_crops_choose_the_padding_per_row(tmp_path):
    """Issue 49, item 2: a release whose crops are the plain box converts (every row was `crop_mismatch` when the
    reader padded by 0.1 only). Each row is read padded, then unpadded (most converted first), and keeps the reading
    whose crops match the release's; `stats.json` counts rows per reading; a row cut with a padding neither reading
    has (0.25) matches none and is `crop_mismatch`, naming both. Planted: with the padded reading alone, the plain
    rows are `crop_mismatch` (3 of 4 rows skipped)."""
    # A (0.6, 0.3, 0.75, 0.5) on image 1, unpadded: SQUARE (240, 90, 300, 150), shown 56 x 56 (smart_resize of 60 x 60).
    # B (0.1, 0.1, 0.9, 0.9) of image 2's extent (60 x 60 at (240, 90)): (246, 96, 294, 144).
    # C (5, 5, 51, 51) px of image 2 as shown (56 x 56): / 56 x 60 + (240, 90): (245.4, 95.4, 294.6, 144.6), outwards.
    plain = [([0.6, 0.3, 0.75, 0.5], 1), ([0.1, 0.1, 0.9, 0.9], 2)]
    records = [
        pixel_reasoner_record(plain, qid="plain", padding=0),
        pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1), ([5, 5, 51, 51], 2)], qid="plain_pixels", padding=0),
        pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1)], qid="padded"),  # (200, 60, 340, 180), as above
        pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1)], qid="quarter", padding=0.25),
    ]
    dataset, stats = converted(tmp_path, "pixel_reasoner_sft", write_pixel_reasoner(tmp_path / "in", records))
    assert dataset["id"] == ["plain", "plain_pixels", "padded"]
    assert boxes(dataset) == [[SQUARE, [246, 96, 294, 144]], [SQUARE, [245, 95, 295, 145]], [[200, 60, 340, 180]]]
    assert stats["rows_by_reading"] == {"padded_0.1": 1, "unpadded": 2}
    assert stats["rows_skipped"] == {"crop_mismatch": 1} and stats["crop_check"]["rows_mismatched"] == 1
    (why,) = stats["skipped_examples"]["crop_mismatch"]
    assert "under no reading: " in why and "padded_0.1: call 1" in why and "unpadded: call 1" in why
    assert_every_crop_shows_the_target(dataset)


def test_readings_are_tried_most_converted_first_and_report_the_rows_own_reason():
    """`Readings`: the first reading that converts is kept and recorded; the one that has converted most goes first;
    a row no reading converts is skipped on the reason of a reading whose crops agreed, else `crop_mismatch`."""
    readings, tried = Readings(["a", "b"]), []

    def row(converts: set, other: str | None = None):
        def read(name):
            tried.append(name)
            if name in converts:
                return Trajectory("id", "src", Image.new("RGB", (4, 4)), "q?", "x")
            raise SkipRow(other if other and name == "b" else "crop_mismatch", f"{name} disagrees")

        return read

    assert readings.read(row({"b"})).reading == "b" and tried == ["a", "b"]
    tried.clear()
    assert readings.read(row({"a", "b"})).reading == "b" and tried == ["b"]  # b has converted more
    assert readings.read(row({"a"})).reading == "a" and readings.rows == {"a": 1, "b": 2}
    with pytest.raises(SkipRow) as skip:
        readings.read(row(set(), other="empty_answer"))
    assert skip.value.reason == "empty_answer"
    with pytest.raises(SkipRow) as skip:
        readings.read(row(set()))
    assert (
        skip.value.reason == "crop_mismatch"
        and skip.value.detail == "under no reading: b: b disagrees; a: a disagrees"
    )
    with pytest.raises(ValueError, match="distinct"):
        Readings(["a", "a"])


# ------------------------------------------------------------------------------------------ DeepEyesV2 code forms
def v2_converted(tmp_path, *records, zipped=False):
    return conversion(tmp_path, "deepeyes_v2_sft", write_deepeyes_v2(tmp_path / "in", list(records), zipped=zipped))


# Defect 2: code forms their sandbox runs, each with the box it must give, worked by hand on the 400 x 300 scene.
V2_FORMS = {
    "tuple": ("crop = image_1.crop((240, 90, 300, 150))\ndisplay(crop)", [SQUARE]),
    "list": ("crop = image_1.crop([240, 90, 300, 150])\ndisplay(crop)", [SQUARE]),
    # w, h = 400, 300: (int(240.0), int(90.0), int(300.0), int(150.0)); a cell's last value is displayed
    "size arithmetic": (
        "w, h = image_1.size\nimage_1.crop((int(w * 0.6), int(h * 0.3), int(w * 0.75), h // 2))",
        [SQUARE],
    ),
    # (200, 60) + (40, 30, 100, 90)
    "crop of a crop": (
        "c1 = image_1.crop((200, 60, 320, 180))\nc2 = c1.crop((40, 30, 100, 90))\ndisplay(c2)",
        [SQUARE],
    ),
    "crop of an enhanced image": (
        "from PIL import ImageEnhance\nsharp = ImageEnhance.Contrast(image_1).enhance(1.3)\n"
        "display(sharp.crop((240, 90, 300, 150)))",
        [SQUARE],
    ),
    # the 120 px crop at 240 px: half a pixel of the original per pixel, (200, 60) + (80, 60, 200, 180) / 2
    "crop of a resized crop": (
        "big = image_1.crop((200, 60, 320, 180)).resize((240, 240))\ndisplay(big.crop((80, 60, 200, 180)))",
        [SQUARE],
    ),
    "two crops shown": (
        "a = image_1.crop((240, 90, 300, 150))\nb = image_1.crop((200, 60, 320, 180))\ndisplay(a, b)",
        [SQUARE, [200, 60, 320, 180]],
    ),
    "a guard": (
        "img = image_1\nif img is None:\n    raise ValueError('no image')\ndisplay(img.crop((240, 90, 300, 150)))",
        [SQUARE],
    ),
}


@pytest.mark.parametrize("form", V2_FORMS)
def test_deepeyes_v2_code_forms_are_evaluated(tmp_path, form):
    code, expected = V2_FORMS[form]
    dataset, stats = v2_converted(tmp_path, deepeyes_v2_record([code]))
    assert stats["rows_skipped"] == {} and boxes(dataset) == [expected], stats
    assert dataset[0]["gold_calls"][0]["label"] == "the red square"  # "I examine the red square."
    assert_every_crop_shows_the_target(dataset)


SHOW_THROUGH_A_DICT = "crop = image_1.crop((240, 90, 300, 150))\nshow = {'it': display}\nshow['it'](crop)"
V2_SKIPS = {
    # shown through a path the reader does not follow: the release shows an image after a turn it read no crop from
    "unread_code": [SHOW_THROUGH_A_DICT],
    "unsupported_code": ["for box in [(240, 90, 300, 150)]:\n    display(image_1.crop(box))"],
    "unsupported_tool": ['<tool_call>{"name": "search", "arguments": {"query": "red square"}}</tool_call>'],
    "whole image": ["from PIL import ImageEnhance\ndisplay(ImageEnhance.Contrast(image_1).enhance(1.5))"],
    "rotation": ["display(image_1.rotate(90).crop((0, 0, 60, 60)))"],
    "x and y swapped": ["display(image_1.crop((240, 90, 300, 170)))"],
}
V2_REASON = {"whole image": "unsupported_tool", "rotation": "unsupported_code", "x and y swapped": "crop_mismatch"}


@pytest.mark.parametrize("case", V2_SKIPS)
def test_deepeyes_v2_rows_whose_crops_cannot_be_read_are_skipped_never_kept_without_zoom(tmp_path, case):
    """Defect 2: a code turn that cropped is never kept as a no-zoom row: code the reader cannot evaluate is skipped
    on a reason, and where the release shows an image after a code turn from which no crop was read, the row is
    `unread_code` (the old regex read nothing and kept the row). A search is another tool. The last case ships the
    crop of (90, 240, 170, 300), x and y swapped, for the code's (240, 90, 300, 170)."""
    cells = V2_SKIPS[case]
    plant = ["display(image_1.crop((90, 240, 170, 300)))"] if case == "x and y swapped" else None
    _, stats = v2_converted(tmp_path, deepeyes_v2_record(cells, plant_code=plant))
    assert stats["rows_converted"] == 0 and stats["rows_skipped"] == {V2_REASON.get(case, case): 1}


def test_deepeyes_v2_a_failed_cell_adds_no_image_and_names_persist(tmp_path):
    """A cell that raised in their sandbox shows no image: it is dropped, and the next cell, which uses a name the
    kernel kept from an earlier cell, is read with it. The release is left zipped."""
    cells = ["c1 = image_1.crop((200, 60, 320, 180))", "c1.crop((40, 30, 100, 90)).no_such_method()",
             "display(c1.crop((40, 30, 100, 90)))"]  # fmt: skip
    dataset, stats = v2_converted(tmp_path, deepeyes_v2_record(cells), zipped=True)
    assert stats["rows_converted"] == 1 and boxes(dataset) == [[SQUARE]]
    assert stats["calls_failed_upstream"] == 1


# ----------------------------------------------------------------------------------------------- Thyme code forms
# Thyme's code as its README (section 6) and paper (figures 8-16) show it: the path written as a literal the sandbox
# rewrites, the image saved under /mnt/data/temp_processed_images/ with a random suffix, and its path printed (how
# the sandbox finds it). A literal `x1, y1, x2, y2` or `crop_box` is widened by the sandbox to 64 px a side.
THYME_CV2_SAVE = """random_suffix = str(uuid4())[:8]
processed_filename = f"0001_{random_suffix}.jpg"
processed_path = os.path.join("/mnt/data/temp_processed_images/", processed_filename)
cv2.imwrite(processed_path, resized_image)
print(processed_path)"""
THYME_PIL_SAVE = """random_suffix = random.randint(1000, 9999)
processed_filename = f"0001_{random_suffix}.jpg"
processed_path = "/mnt/data/temp_processed_images/" + processed_filename
zoomed_image.save(processed_path)
print(processed_path)"""
THYME_CV2_OPEN = 'import cv2\nimport os\nimport numpy as np\nfrom uuid import uuid4\nimage_path = "/data/0001.jpg"\n'
THYME_CV2_OPEN += "image = cv2.imread(image_path)\n"
THYME_PIL_OPEN = (
    'import os\nimport random\nfrom PIL import Image\nimage_path = "/data/0001.jpg"\nimage = Image.open(image_path)\n'
)
THYME_CV2_ZOOM = "resized_image = cv2.resize(cropped_image, None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)\n"
THYME_PIL_ZOOM = "zoomed_image = cropped_image.resize((cropped_image.width * 2, cropped_image.height * 2))\n"


def thyme_cv2(crop: str) -> str:
    return THYME_CV2_OPEN + crop + "\n" + THYME_CV2_ZOOM + THYME_CV2_SAVE


def thyme_pil(crop: str) -> str:
    return THYME_PIL_OPEN + crop + "\n" + THYME_PIL_ZOOM + THYME_PIL_SAVE


# Each form with the boxes it must give, worked by hand on the 400 x 300 scene (the target is (250, 100, 290, 140)).
THYME_FORMS = {
    # README: 240..300 is 60 px; the sandbox widens both sides to 64 from their low edge
    "README: unpacked literals, numpy slice, cv2.resize": (
        thyme_cv2("x1, y1, x2, y2 = 240, 90, 300, 150\ncropped_image = image[y1:y2, x1:x2]"),
        [[240, 90, 304, 154]],
    ),
    "figure 8: PIL crop of unpacked literals, resize": (
        thyme_pil("x1, y1, x2, y2 = 200, 60, 320, 180\ncropped_image = image.crop((x1, y1, x2, y2))"),
        [[200, 60, 320, 180]],
    ),
    "figure 16: img, a name from splitext, no resize": (
        'from PIL import Image\nimage_path = "/data/0001.jpg"\nimg = Image.open(image_path)\n'
        "x1, y1, x2, y2 = 230, 80, 310, 160\ncropped_img = img.crop((x1, y1, x2, y2))\n"
        "random_suffix = random.randint(1000, 9999)\n"
        "filename, ext = os.path.splitext(os.path.basename(image_path))\n"
        'processed_filename = f"{filename}_{random_suffix}{ext}"\n'
        'processed_path = os.path.join("/mnt/data/temp_processed_images/", processed_filename)\n'
        "cropped_img.save(processed_path)\nprint(processed_path)",
        [[230, 80, 310, 160]],
    ),
    # (250, 100, 290, 140) is 40 px: widened to (250, 100, 314, 164)
    "named box widened": (
        thyme_pil("crop_box = (250, 100, 290, 140)\ncropped_image = image.crop(crop_box)"),
        [[250, 100, 314, 164]],
    ),
    # a literal slice is not widened: the sandbox's slice case never runs on Python 3.9+
    "literal slice with a channel slice": (
        thyme_cv2("cropped_image = image[90:150, 240:300, :]"),
        [SQUARE],
    ),
    "literal slice with an ellipsis": (thyme_cv2("cropped_image = image[90:150, 240:300, ...]"), [SQUARE]),
    # 0.6 * 400, 0.3 * 300: not literals, not widened
    "coordinates from the shape": (
        thyme_cv2(
            "h, w = image.shape[:2]\nx1, y1 = int(w * 0.6), int(h * 0.3)\n"
            "cropped_image = image[y1:y1 + 60, x1:x1 + 60]"
        ),
        [SQUARE],
    ),  # fmt: skip
    "coordinates from the PIL size": (
        thyme_pil(
            "width, height = image.size\nbox = (width * 0.6, height * 0.3, width * 0.75, height * 0.5)\n"
            "cropped_image = image.crop(box)"
        ),
        [SQUARE],
    ),  # fmt: skip
    # (200, 60) + (40, 30, 100, 90); an inline tuple is not widened
    "a crop of a crop": (
        thyme_pil(
            "x1, y1, x2, y2 = 200, 60, 320, 180\nfirst = image.crop((x1, y1, x2, y2))\n"
            "cropped_image = first.crop((40, 30, 100, 90))"
        ),
        [SQUARE],
    ),  # fmt: skip
    "cv. for cv2.": (
        thyme_cv2("cropped_image = image[90:150, 240:300]").replace("cv2.resize", "cv.resize"),
        [SQUARE],
    ),
    # the sandbox's own test: names that are not exactly x1..bottom are not widened; two crops, printed in order
    "prefixed names, two crops": (
        THYME_PIL_OPEN + "sq_x1, sq_y1, sq_x2, sq_y2 = 240, 90, 300, 150\n"
        "wide_x1, wide_y1, wide_x2, wide_y2 = 200, 60, 320, 180\n"
        "sq = image.crop((sq_x1, sq_y1, sq_x2, sq_y2))\nwide = image.crop((wide_x1, wide_y1, wide_x2, wide_y2))\n"
        'sq_path = f"/mnt/data/temp_processed_images/sq_{random.randint(1000, 9999)}.png"\n'
        'wide_path = f"/mnt/data/temp_processed_images/wide_{random.randint(1000, 9999)}.png"\n'
        "sq.save(sq_path)\nwide.save(wide_path)\nprint(sq_path)\nprint(wide_path)",
        [SQUARE, [200, 60, 320, 180]],
    ),
    # a basename printed: the sandbox counts the names printed against the files written
    "a basename printed": (
        THYME_PIL_OPEN + "cropped = image.crop((240, 90, 300, 150))\n"
        'path = f"/mnt/data/temp_processed_images/sq_{random.randint(1000, 9999)}.png"\n'
        'cropped.save(path)\nprint(f"Cropped: {os.path.basename(path)}")',
        [SQUARE],
    ),
}


def thyme_converted(tmp_path, *records, form="parquet"):
    return conversion(tmp_path, "thyme_sft", write_thyme(tmp_path / "in", list(records), form=form))


@pytest.mark.parametrize("form", THYME_FORMS)
def test_thyme_code_forms_are_evaluated(tmp_path, form):
    code, expected = THYME_FORMS[form]
    dataset, stats = thyme_converted(tmp_path, thyme_record([("Let me crop the small square.", code)]))
    assert stats["rows_skipped"] == {} and boxes(dataset) == [expected], stats
    assert stats["crop_check"]["calls_checked_by_content"] == len(expected)
    assert_every_crop_shows_the_target(dataset)


# Issue 49, item 6: blocks indented inside their fence. Thyme's `code_regex` takes the first line's indentation with
# the fence; its sandbox gives that line the second's back, dedents and strips (`parse_thyme_code`). Read with
# DeepEyesV2's indentation repair instead (each line stripped, re-indented after a ":"), the lines after an `except`
# fell inside it, the crop was never read, and the row was skipped as `unread_code`.
THYME_TRY = "try:\n    cropped_image = image.crop((240, 90, 300, 150))\nexcept Exception:\n    cropped_image = image"
THYME_INDENTED = {
    "a try in the middle": thyme_pil(THYME_TRY),
    "opening with a try": (
        f"try:\n{textwrap.indent(THYME_PIL_OPEN, '    ')}except Exception:\n    image = None\n"
        f"cropped_image = image.crop((240, 90, 300, 150))\n{THYME_PIL_ZOOM}{THYME_PIL_SAVE}"
    ),
}


@pytest.mark.parametrize("form", THYME_INDENTED)
def test_thyme_code_indented_inside_its_fence_is_read_as_the_sandbox_aligns_it(tmp_path, form):
    """Planted: with DeepEyesV2's repair as Thyme's parse, both forms come out `unread_code`."""
    code = textwrap.indent(THYME_INDENTED[form], "    ")
    dataset, stats = thyme_converted(tmp_path, thyme_record([("Let me crop the small square.", code)]))
    assert stats["rows_skipped"] == {} and boxes(dataset) == [[SQUARE]], stats


def test_the_sandbox_clamp_is_thymes():
    """`thyme_clamp` against the fixture's line-for-line transcription of the sandbox's, on boxes that take each of its
    branches (ordered, cut at the edges, widened from the low edge, pulled back from the far one, a tiny image)."""
    cases = [((240, 90, 300, 150), SIZE), ((300, 150, 240, 90), SIZE), ((-5, -5, 30, 20), SIZE),
             ((380, 280, 420, 330), SIZE), ((399.6, 10, 500, 12), SIZE), ((10, 10, 20, 20), (50, 40)),
             ((1250, 1030, 1360, 1070), (2496, 1392))]  # fmt: skip
    for box, size in cases:
        assert thyme_clamp(box, size) == release_thyme_clamp(*box, *size), (box, size)
    assert thyme_clamp((1250, 1030, 1360, 1070), (2496, 1392)) == [1250, 1030, 1360, 1094]  # README: 110 x 64


@pytest.mark.parametrize("form", ["parquet", "jsonl"])
def test_thyme_release_reads_parquet_shards_and_base64_images_with_clean_text(tmp_path, form):
    """Defect 1: Thyme's release is parquet shards under data/ whose `image` cells are base64 (the old reader globbed
    JSON only, and took a base64 string for a file name: every row `missing_image`). Defect 3: its code sits inside
    one `<think>`, so neither a call's thought nor the final thought may keep a `<think>` or `</think>`, and the
    question loses the sandbox's path, size and output-format lines. Two code blocks share the sandbox's names: the
    second crops the first's crop."""
    blocks = [
        ("Let me crop the small square.",
         thyme_cv2("x1, y1, x2, y2 = 200, 60, 320, 180\ncropped_image = image[y1:y2, x1:x2]")),
        ("Closer still.",
         "cropped_image = cropped_image[30:90, 40:100]\n" + THYME_CV2_ZOOM + THYME_CV2_SAVE),
    ]  # fmt: skip
    dataset, stats = thyme_converted(tmp_path, thyme_record(blocks), form=form)
    assert stats["rows_converted"] == 1 and boxes(dataset) == [[[200, 60, 320, 180], SQUARE]]
    calls = dataset[0]["gold_calls"]
    assert [c["thought"] for c in calls] == ["Let me crop the small square.", "Closer still."]
    assert (calls[0]["label"], calls[0]["label_source"]) == ("the small square", "thought")
    assert dataset[0]["final_thought"] == "The crop shows it is red."
    assert dataset[0]["prompt"] == build_prompt(QUESTION) and dataset[0]["answer"] == "red"
    assert_every_crop_shows_the_target(dataset)


def test_thyme_rows_whose_crops_cannot_be_read_or_disagree_are_skipped(tmp_path):
    """An image written through a path the reader does not follow is `unread_code`; a crop the release cut with x and
    y swapped (`img[x1:x2, y1:y2]` run, `img[y1:y2, x1:x2]` written) is `crop_mismatch`; a block that failed in the
    sandbox (no image) is dropped, the row kept; a loop is `unsupported_code`, the statement quoted in the stats and
    the preview."""
    unread = thyme_cv2("cropped_image = image[90:150, 240:300]").replace(
        "cv2.imwrite(processed_path, resized_image)",
        "savers = {'png': cv2.imwrite}\nsavers['png'](processed_path, resized_image)",
    )
    swapped = thyme_cv2("cropped_image = image[240:300, 90:150]")
    good = thyme_cv2("cropped_image = image[90:160, 240:300]")
    failing = thyme_cv2("cropped_image = image[90:150, 240:300]\ncropped_image.no_such_method()")
    loop = thyme_pil("for box in [(240, 90, 300, 150)]:\n    cropped_image = image.crop(box)")
    records = [thyme_record([("Crop.", unread)]), thyme_record([("Crop.", good)], plant_code=[swapped]),
               thyme_record([("Crop.", failing), ("Again.", thyme_cv2("cropped_image = image[90:150, 240:300]"))]),
               thyme_record([("Crop.", loop)])]  # fmt: skip
    root = write_thyme(tmp_path / "in", records)
    out = tmp_path / "out"
    stats = convert.main(["--format", "thyme_sft", "--input", str(root), "--output", str(out), "--preview", "1"])
    assert stats["rows_skipped"] == {"unsupported_code": 1, "unread_code": 1, "crop_mismatch": 1}
    dataset = datasets.load_from_disk(str(out))["train"]
    assert boxes(dataset) == [[SQUARE]] and dataset[0]["gold_calls"][0]["thought"] == "Again."
    assert stats["calls_failed_upstream"] == 1
    (why,) = stats["skipped_examples"]["unsupported_code"]
    assert why == ("2round-00000-of-00001.parquet row 3: line 6: a `For` statement in "
                   "`for box in [(240, 90, 300, 150)]:`")  # fmt: skip
    assert html.escape("for box in [(240, 90, 300, 150)]:") in Path(stats["preview"]).read_text()


def test_the_code_reader_reports_what_it_cannot_evaluate():
    reader = CodeReader(SIZE, {}, "display", original_as="image_1")
    with pytest.raises(SkipRow, match=r"unsupported_code: line 1: the name 'box', not defined before"):
        reader.run("display(image_1.crop(box))")
    with pytest.raises(SkipRow, match=r"unsupported_code: line 2: a crop box the reader cannot compute"):
        reader.run("box = [10] * 4\ndisplay(image_1.crop(box))")
    with pytest.raises(SkipRow, match=r"malformed_call: code does not parse"):
        reader.run("display(image_1.crop((1, 2, 3, 4))")


# ------------------------------------------------------------------------------------------------------ shared
def release(tmp_path: Path, fmt: str, parts: bool = False) -> tuple[Path, Path, list[dict]]:
    """Two good rows of `fmt` as the release ships them (the folder, the record file, its records); the first record
    has a key the second lacks, as releases do. `parts`: message contents as null-keyed typed parts."""
    root = tmp_path / fmt
    if fmt == "mini_o3_coldstart":
        rows = [mini_o3_row([FIRST, SECOND], index=0), mini_o3_row([FIRST], index=1)]
        rows[1]["rollout_index"] = None  # read as a missing index: 0
        if parts:
            for row in rows:
                turns = json.loads(row["conversations"])
                row["conversations"] = json.dumps([{**t, "value": as_null_keyed_parts(t["value"])} for t in turns])
        return write_mini_o3(root, rows), root / "data" / "train-00000-of-00001.parquet", rows
    if fmt == "pixel_reasoner_sft":
        records = [pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1)], qid=f"q{k}") for k in range(2)]
        del records[1][0]["qid"]  # read as a missing id: the file and row
        return write_pixel_reasoner(root, records), root / "release.json", [r for r, _ in records]
    if fmt == "thyme_sft":
        records = [thyme_record([("Crop.", thyme_cv2("cropped_image = image[60:180, 200:320]"))]) for _ in range(2)]
        records[0]["id"] = "unread"
        return write_thyme(root, records), root / "data" / "2round-00000-of-00001.parquet", records
    if fmt == "cof_sft":
        records = [cof_record([(SQUARE, "the red square")], image_name=f"{k}.png") for k in range(2)]
        records[0][0]["id"] = "first"
        write, file = write_cof, "cof_sft_data.json"
    else:
        records = [deepeyes_v2_record(["display(image_1.crop((240, 90, 300, 150)))"], image_name=f"{k}.png")
                   for k in range(2)]  # fmt: skip
        records[0][0]["id"] = "first"
        write, file = write_deepeyes_v2, "json/sft_part_0.json"
    if parts:
        for record, _ in records:
            record["messages"] = [{**m, "content": as_null_keyed_parts(m["content"])} for m in record["messages"]]
    return write(root, records), root / file, [r for r, _ in records]


def test_content_parts_are_read_by_type_and_non_null_value():
    """A part is of the kind its `type` names, read from that key's non-null value (a part without `type`, from the key
    it has); `datasets`' null keys name nothing."""
    parts = [
        {"type": "text", "text": "What is it?", "image": None, "video": None},
        {"type": "image", "image": "a.png", "text": None, "video": None},
        {"type": "video", "video": None, "text": None, "image": "b.png"},  # a video part with no video: nothing
        {"image": "c.png", "text": None},
        {"type": "image_url", "image_url": {"url": "d.png"}, "text": None},
    ]
    assert content_parts(parts) == [("text", "What is it?"), ("image", "a.png"), ("image", "c.png"),
                                     ("image", {"url": "d.png"})]  # fmt: skip
    assert content_text(parts) == "What is it?" and content_images(parts) == 3
    assert content_parts("<image>\nWhat is it?") == [("text", "<image>\nWhat is it?")]
    assert content_images("<image>\nWhat is it?") == 1 and content_parts(None) == []


FORMATS_ALL = ["mini_o3_coldstart", "cof_sft", "pixel_reasoner_sft", "deepeyes_v2_sft", "thyme_sft"]


@pytest.mark.parametrize("fmt", FORMATS_ALL)
def test_a_release_re_saved_by_datasets_converts_the_same_rows(tmp_path, fmt):
    """Issue 37: what `datasets` writes (every record, message and part with every key, most null; `to_json`'s JSON
    Lines under a `.json` name) converts to the same rows as the release: a null key is a missing key, and a part is
    read by its type and its non-null value (PixelReasoner's text parts carry `"image": null`, which every row was
    skipped on as showing two images). Where messages can hold typed parts (sharegpt, Mini-o3's turns), the same
    conversation written as null-keyed parts converts the same too."""
    root, file, records = release(tmp_path / "as_released", fmt)
    expected, stats = converted(tmp_path, fmt, root)
    assert stats["rows_converted"] == 2, stats
    resave_with_datasets(file, records)
    assert "null" in file.read_text(errors="ignore") or file.suffix == ".parquet"
    again, stats = converted(tmp_path / "re_saved", fmt, root)
    assert stats["rows_converted"] == 2, stats
    assert again["id"] == expected["id"] and "None" not in "".join(again["id"])
    assert boxes(again) == boxes(expected) and again["prompt"] == expected["prompt"]
    assert_every_crop_shows_the_target(again)
    if fmt in ("mini_o3_coldstart", "cof_sft", "deepeyes_v2_sft"):
        root, file, records = release(tmp_path / "as_parts", fmt, parts=True)
        resave_with_datasets(file, records)
        as_parts, stats = converted(tmp_path / "parts", fmt, root)
        assert stats["rows_converted"] == 2, stats
        assert boxes(as_parts) == boxes(expected) and as_parts["prompt"] == expected["prompt"]


# A final turn that answers twice: blue, then red on second thought.
TWO_ANSWERS = think("Blue, at first sight.") + "<answer>blue</answer>" + think("No: red.") + "<answer>red</answer>"


@pytest.mark.parametrize("fmt", ["cof_sft", "mini_o3_coldstart"])
def test_a_turn_with_two_answers_is_read_by_its_last_in_conversion_as_in_evaluation(tmp_path, fmt):
    """One answer rule (`data.task.extract_answer`, the last `<answer>`): the converted row's answer is the one the
    rewards and evaluation would read from the same text, so SFT never trains on an answer evaluation would not
    score."""
    assert extract_answer(TWO_ANSWERS) == "red"
    if fmt == "cof_sft":
        record, files = cof_record([(SQUARE, "the red square")])
        record["messages"][-1]["content"] = TWO_ANSWERS
        root = write_cof(tmp_path / "in", [(record, files)])
    else:
        row = mini_o3_row([FIRST])
        turns = json.loads(row["conversations"])
        turns[-1]["value"] = TWO_ANSWERS
        root = write_mini_o3(tmp_path / "in", [{**row, "conversations": json.dumps(turns)}])
    dataset, stats = converted(tmp_path, fmt, root)
    assert stats["rows_converted"] == 1
    assert dataset[0]["answer"] == extract_answer(TWO_ANSWERS) == "red"


def test_label_limits_are_the_tool_s_unless_the_command_line_says_otherwise(tmp_path):
    """`--max_label_words` / `--max_label_chars` default to `ToolConfig`'s and override them."""
    args = convert.parse_args(["--format", "cof_sft", "--input", "i", "--output", "o"])
    assert (args.max_label_words, args.max_label_chars) == (ToolConfig().max_label_words, ToolConfig().max_label_chars)
    records = [cof_record([(SQUARE, label)], image_name=f"{i}.png") for i, label in
               enumerate(("the red square", "the square"))]  # fmt: skip
    root = write_cof(tmp_path / "in", records)
    argv = ["--format", "cof_sft", "--input", str(root), "--output", str(tmp_path / "out"), "--max_label_words", "2"]
    stats = convert.main(argv)
    assert stats["rows_converted"] == 1 and stats["rows_skipped"] == {"label_too_long": 1}  # 3 words over 2


def test_a_wrong_format_fails_at_once_naming_what_it_expected_and_found(tmp_path):
    root = write_mini_o3(tmp_path / "in", [mini_o3_row([FIRST])])
    with pytest.raises(
        LayoutError, match=r"--format cof_sft: no cof_sft_data\*.json or .* under .* \(found: \['data'\]\)"
    ):
        convert.main(["--format", "cof_sft", "--input", str(root), "--output", str(tmp_path / "out")])
    sharegpt = write_cof(tmp_path / "pr", [cof_record([(SQUARE, "the red square")])])
    (sharegpt / "cof_sft_data.json").rename(sharegpt / "x.json")
    with pytest.raises(LayoutError, match=r"expected fields \['message_list'\], found \['images', 'messages'\]"):
        convert.main(["--format", "pixel_reasoner_sft", "--input", str(sharegpt), "--output", str(tmp_path / "o")])
    with pytest.raises(LayoutError, match=r"expected fields \['image', 'question', 'response'\], found \['conversat"):
        convert.main(["--format", "thyme_sft", "--input", str(root), "--output", str(tmp_path / "t")])


def test_the_dataset_keeps_each_original_as_the_release_encoded_it(tmp_path):
    """Rows stream to disk with their original's own file bytes: no decoded image is kept per row (the converter's
    memory does not grow with the release: docs/benchmarks.md) and none is re-encoded (a 2000 x 1500 PNG cost
    seconds a row)."""
    row = mini_o3_row([FIRST])
    jpeg = io.BytesIO()
    Image.open(io.BytesIO(row["images"][0]["bytes"])).save(jpeg, format="JPEG", quality=95)
    row["images"][0] = {"bytes": jpeg.getvalue(), "path": None}
    dataset, stats = converted(tmp_path, "mini_o3_coldstart", write_mini_o3(tmp_path / "in", [row]))
    assert stats["rows_converted"] == 1
    stored = dataset.cast_column("image", datasets.Image(decode=False))[0]["image"]["bytes"]
    assert stored == jpeg.getvalue()


# ------------------------------------------------------------------------------------------- preview and SFT
def test_the_preview_writes_the_original_the_replayed_crops_and_a_page(tmp_path):
    root = write_mini_o3(tmp_path / "in", [mini_o3_row([FIRST, SECOND]), mini_o3_row([FIRST], index=1)])
    _, stats = converted(tmp_path, "mini_o3_coldstart", root, preview=1)
    preview = Path(stats["preview"]).parent
    assert sorted(p.name for p in (preview / "0").iterdir()) == [
        "crop_1.png",
        "crop_2.png",
        "image.png",
        "trajectory.json",
    ]
    assert not (preview / "1").exists()
    crop = np.asarray(Image.open(preview / "0" / "crop_2.png"))
    assert (crop[..., 0] > 200).any() and ((crop[..., 1] < 60) & (crop[..., 0] > 200)).mean() > 0.1  # the red square
    record = json.loads((preview / "0" / "trajectory.json").read_text())
    assert [c["label_source"] for c in record["calls"]] == ["thought", "thought"]
    assert all(len(c["bbox_2d"]) == 4 for c in record["calls"]) and record["messages"][-1]["role"] == "user"
    page = (preview / "index.html").read_text()
    assert 'src="0/crop_2.png"' in page and "the red square" in page


@pytest.mark.process
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium package (/usr/bin/chromium)")
def test_the_preview_page_renders_in_headless_chromium(tmp_path):
    root = write_mini_o3(tmp_path / "in", [mini_o3_row([FIRST])])
    _, stats = converted(tmp_path, "mini_o3_coldstart", root, preview=1)
    shot = tmp_path / "shot.png"
    subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1000,700", f"file://{stats['preview']}"], check=True, capture_output=True,
                   timeout=120)  # fmt: skip
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
    red = ((pixels[:, 0] > 200) & (pixels[:, 1] < 60) & (pixels[:, 2] < 60)).sum()
    assert red > 200, red  # the image and its crop were loaded and drawn, not broken-image icons


@pytest.mark.slow
def test_sft_trains_on_a_converted_set_by_name(tiny_kit, tmp_path):
    root = write_mini_o3(tmp_path / "in", [mini_o3_row([FIRST], index=i) for i in range(4)])
    out = tmp_path / "converted"
    convert.main(["--format", "mini_o3_coldstart", "--input", str(root), "--output", str(out)])
    argv = ["--config", str(stages.REPO / "recipes/tiny/sft/config_sft.yaml"), "--dataset_name", str(out),
            "--model_name_or_path", str(tiny_kit["policy"]), "--output_dir", str(tmp_path / "sft"), "--max_steps", "2",
            "--per_device_train_batch_size", "2", "--report_to", "none"]  # fmt: skip
    trainer = sft.main(
        *parse_args_and_record((ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig), argv)
    )
    assert trainer.state.global_step == 2 and (tmp_path / "sft" / "model.safetensors").exists()
    gold, stats = build_gold_trajectories(
        datasets.load_from_disk(str(out))["train"],
        make_environment_factory(ToolConfig(), real_recipe_budget(None)[1]),
    )
    assert stats.calls == {1: 4} and "I zoom in on the red square." in gold[0]["messages"][2]["content"]
