"""`python -m data.convert` on Mini-o3's, Chain-of-Focus' and PixelReasoner's releases as published
(`tests/release_fixtures.py`): every box composed into the original (relative, absolute, crop-of-crop, padded),
checked against the crops the release ships and replayed by the real tool onto the target; rows over the RL recipes'
call limit dropped and counted; crops under the floor counted; images found where each release puts them; each row's
crops read by the reading that converts most of them."""

import pytest
from PIL import Image

from data import convert
from data.converters.common import (
    SkipRow,
)
from data.converters.crop_check import Readings
from data.rows import Trajectory
from data.task import build_prompt
from tests.conversions import FIRST, SECOND, SQUARE, assert_every_crop_shows_the_target, boxes, converted
from tests.release_fixtures import (
    QUESTION,
    cof_record,
    mini_o3_row,
    pixel_reasoner_record,
    think,
    write_cof,
    write_mini_o3,
    write_pixel_reasoner,
)

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
