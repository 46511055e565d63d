"""`python -m data.convert` on small releases the tests write in each public dataset's published layout
(`tests/release_fixtures.py`: each cites the upstream loader or card it follows, and its crops are made by a
transcription of the project's own crop code): every box composed into the original (relative, absolute,
crop-of-crop, padded, code read with `ast`), checked against the crops the release ships, replayed by the real tool
onto the target; the defects of issue 29, one row each with its hand-worked box; bad rows skipped and counted by
reason; a wrong convention caught as `crop_mismatch`; a wrong `--format` failing at once; the derived labels; the
preview (rendered in headless Chromium where it exists); and SFT training on a converted set.

The releases' own tests: tests/test_convert_releases.py (Mini-o3, CoF, PixelReasoner) and tests/test_convert_code.py
(DeepEyesV2's and Thyme's code); what they share: tests/conversions.py."""

import io
import json
import re
import subprocess
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
from data.converters.crop_check import crop_disagreement
from data.converters.labels import derive_label
from data.task import extract_answer
from data.trajectories import build_gold_trajectories
from tests.conversions import FIRST, SECOND, SQUARE, assert_every_crop_shows_the_target, boxes, converted, release
from tests.release_fixtures import (
    QUESTION,
    SIZE,
    cof_crop,
    cof_record,
    mini_o3_observation,
    mini_o3_process_image,
    mini_o3_row,
    pixel_reasoner_crop,
    pixel_reasoner_resize,
    resave_with_datasets,
    scene,
    think,
    write_cof,
    write_mini_o3,
)
from tests.tolerance import FLOAT64, approx
from tiny import stages
from tools import ToolConfig, make_environment_factory
from utils.recipes import parse_args_and_record, real_recipe_budget

CHROMIUM = Path("/usr/bin/chromium")


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


# ------------------------------------------------------------------------------------------------------ shared
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
