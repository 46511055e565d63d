"""`python -m data.convert` on DeepEyesV2's and Thyme's releases, whose crops are Python read with `ast`
(`data.converters.code_reader`): every code form their sandboxes run gives its hand-worked box; rows whose crops
cannot be read, or disagree with the crops the release ships, are skipped by reason, never kept without a zoom;
Thyme's sandbox clamp, its fences' indentation and its release's shards and images."""

import html
import textwrap
from pathlib import Path

import datasets
import pytest

from data import convert
from data.converters.code_reader import CodeReader
from data.converters.common import (
    SkipRow,
)
from data.converters.thyme import thyme_clamp
from data.task import build_prompt
from tests.conversions import (
    SQUARE,
    THYME_CV2_SAVE,
    THYME_CV2_ZOOM,
    THYME_PIL_OPEN,
    THYME_PIL_SAVE,
    THYME_PIL_ZOOM,
    assert_every_crop_shows_the_target,
    boxes,
    conversion,
    thyme_cv2,
    thyme_pil,
)
from tests.release_fixtures import (
    QUESTION,
    SIZE,
    deepeyes_v2_record,
    thyme_record,
    write_deepeyes_v2,
    write_thyme,
)
from tests.release_fixtures import thyme_clamp as release_thyme_clamp


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
