"""`python -m data.convert` on sample files the tests write in each public dataset's layout, with a known target: every
box composed into the original (relative, absolute, crop-of-crop, code literals), replayed by the real tool onto the
target; bad rows skipped and counted by reason; a wrong `--format` failing at once; the derived labels; the preview
(rendered in headless Chromium where it exists); and SFT training on a converted set."""

import base64
import io
import json
import subprocess
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw
from trl import ModelConfig, SFTConfig

import sft
from configs import ScriptArguments, TrajectoryArguments
from data import convert
from data.converters import EDGE_TOLERANCE, LayoutError, SkipRow, derive_label, relative_to_pixels, to_image_box
from data.task import extract_answer
from data.trajectories import build_gold_trajectories, replay_calls
from tiny import stages
from tools import ToolConfig, box_contains, make_environment_factory
from utils.recipes import parse_args_and_record

SIZE = (400, 300)
TARGET = (250, 100, 290, 140)  # a red square on white: a crop shows it when it holds these pixels
QUESTION = "What colour is the small square?"
CHROMIUM = Path("/usr/bin/chromium")


def scene() -> Image.Image:
    image = Image.new("RGB", SIZE, "white")
    ImageDraw.Draw(image).rectangle((TARGET[0], TARGET[1], TARGET[2] - 1, TARGET[3] - 1), fill=(220, 20, 30))
    return image


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def think(text: str) -> str:
    return f"<think>{text}</think>"


# ------------------------------------------------------------------------------------------- sample writers
def write_mini_o3(root: Path, rows: list[list[dict]]) -> Path:
    """Parquet shard under data/, each row's `conversations` a JSON string, `images` the original as bytes."""
    (root / "data").mkdir(parents=True)
    table = pa.Table.from_pylist(
        [
            {
                "conversations": json.dumps(turns),
                "images": [{"bytes": png(scene()), "path": None}],
                "image_names": ["original_image.jpg"],
                "data_source": "visual_probe",
                "sample_index": i,
                "rollout_index": 0,
            }
            for i, turns in enumerate(rows)
        ]
    )
    pq.write_table(table, root / "data" / "train-00000.parquet")
    return root


def mini_o3_turns(*calls: dict, answer: str = "red") -> list[dict]:
    turns = [{"from": "system", "value": "..."}, {"from": "human", "value": f"<image>\n{QUESTION}"}]
    for k, call in enumerate(calls):
        grounding = f"<grounding>{json.dumps(call)}</grounding>"
        turns.append({"from": "gpt", "value": think(f"Step {k}: I zoom in on the red square.") + grounding})
        turns.append({"from": "human", "value": f"After the above Action {k}, here is the zoom-in image "
                      f"(Observation {k + 1}):\n<image>.\nContinue your reasoning."})  # fmt: skip
    turns.append({"from": "gpt", "value": think("It is red.") + f"<answer>{answer}</answer>"})
    return turns


def write_sharegpt(root: Path, file: str, records: list[dict]) -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    scene().save(root / "images" / "0.png")
    (root / file).parent.mkdir(parents=True, exist_ok=True)
    (root / file).write_text(json.dumps(records), encoding="utf-8")
    return root


def cof_record(*assistant: str, images=("./images/0.png",)) -> dict:
    messages = [
        {"role": "system", "content": "# Tools ..."},
        {"role": "user", "content": f"<image> Question: {QUESTION}"},
    ]
    for k, text in enumerate(assistant):
        if k:
            messages.append({"role": "user", "content": "<image>\nThink in the mind first."})
        messages.append({"role": "assistant", "content": text})
    return {"messages": messages, "images": list(images)}


def cof_call(box, label="the red square") -> str:
    arguments = {"bbox_2d": box, "label": label}
    return (
        think("Too small; I zoom in.")
        + f"<tool_call>{json.dumps({'name': 'image_zoom_in_tool', 'arguments': arguments})}</tool_call>"
    )


def converted(tmp_path: Path, fmt: str, source: Path, preview: int = 0) -> tuple[datasets.Dataset, dict]:
    out = tmp_path / f"{fmt}-out"
    stats = convert.main(["--format", fmt, "--input", str(source), "--output", str(out), "--preview", str(preview)])
    assert json.loads((out / "stats.json").read_text()) == {k: v for k, v in stats.items() if k != "preview"}
    return datasets.load_from_disk(str(out))["train"], stats


def replayed_boxes(dataset: datasets.Dataset) -> list[list[tuple]]:
    """Per row, the original-pixel boxes the real tool cropped when SFT replayed its calls."""
    env = make_environment_factory(ToolConfig(), convert.preview_budget(None)[1])()
    out = []
    for row in dataset:
        replay_calls(row, env)
        out.append([call.box for call in env.calls])
    return out


def assert_every_crop_shows_the_target(dataset):
    for row, boxes in zip(dataset, replayed_boxes(dataset)):
        assert boxes, row["id"]
        for call, box in zip(row["gold_calls"], boxes):
            assert box_contains(call["box"], TARGET), (row["id"], call["box"])
            assert box_contains(box, TARGET), (row["id"], box)  # the tool's crop, mapped back from the seen frame


# ------------------------------------------------------------------------------------------------------ geometry
def test_relative_boxes_compose_into_the_original_and_overshoot_is_a_skip():
    assert relative_to_pixels([0.5, 0.2, 0.8, 0.6], (0, 0, 400, 300)) == (200.0, 60.0, 320.0, 180.0)
    # relative to a crop whose extent is (200, 60, 320, 180): 120 x 120
    assert relative_to_pixels([0.25, 0.2, 0.9, 0.8], (200, 60, 320, 180)) == pytest.approx((230, 84, 308, 156))
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


def test_no_label_is_invented_when_neither_names_a_thing():
    assert derive_label("Hmm.", "Is it daytime?") is None
    assert derive_label("Let me look at the top left.", "What is in the image?") is None


# ------------------------------------------------------------------------------------------------------ formats
def test_mini_o3_boxes_on_observations_compose_with_the_observation_s_box(tmp_path):
    first = {"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}  # (200, 60, 320, 180)
    second = {"bbox_2d": [0.25, 0.2, 0.9, 0.8], "source": "observation_1"}  # inside the first: (230, 84, 308, 156)
    wrong = {"bbox_2d": [0.1, 0.1, 0.2, 0.2], "source": "observation_3"}  # an observation not made yet
    rows = [mini_o3_turns(first, second), mini_o3_turns(first), mini_o3_turns(wrong), mini_o3_turns(first, answer="")]
    dataset, stats = converted(tmp_path, "mini_o3_coldstart", write_mini_o3(tmp_path / "in", rows))
    assert stats["rows_read"] == 4 and stats["rows_converted"] == 2
    assert stats["rows_skipped"] == {"bad_source": 1, "empty_answer": 1}
    assert [c["box"] for c in dataset[0]["gold_calls"]] == [[200, 60, 320, 180], [230, 84, 308, 156]]
    assert dataset[0]["gold_calls"][1]["thought"] == "Step 1: I zoom in on the red square."
    assert {c["label"] for c in dataset[0]["gold_calls"]} == {"the red square"}
    assert stats["calls_by_label_source"] == {"dataset": 0, "thought": 3, "question": 0}
    assert dataset[0]["final_thought"] == "It is red." and dataset[0]["answer"] == "red"
    assert dataset[0]["prompt"][-1]["content"].startswith(QUESTION)
    assert_every_crop_shows_the_target(dataset)


def test_cof_absolute_boxes_keep_their_labels_and_bad_rows_are_counted(tmp_path):
    good = cof_record(cof_call([240, 90, 300, 150]), think("Red.") + "<answer>red</answer>")
    records = [
        good,
        cof_record(
            think("x") + '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2</tool_call>',
            "<answer>red</answer>",
        ),  # fmt: skip
        cof_record(cof_call([240, 90, 300, 150]), "<answer>red</answer>", images=("./images/missing.png",)),
        cof_record(cof_call([240, 90, 900, 150]), "<answer>red</answer>"),  # past the 400 px wide image
        cof_record(cof_call([240, 90, 300, 150]), think("Red.") + "<answer> </answer>"),
        cof_record(cof_call([240, 90, 300, 150], label=" ".join(["word"] * 13)), "<answer>red</answer>"),
    ]
    dataset, stats = converted(tmp_path, "cof_sft", write_sharegpt(tmp_path / "in", "cof_sft_data.json", records))
    assert stats["rows_read"] == 6 and stats["rows_converted"] == 1
    assert stats["rows_skipped"] == {
        "malformed_call": 1, "missing_image": 1, "box_outside_image": 1, "empty_answer": 1, "label_too_long": 1,
    }  # fmt: skip
    (call,) = dataset[0]["gold_calls"]
    assert call == {"box": [240, 90, 300, 150], "thought": "Too small; I zoom in.", "label": "the red square",
                    "label_source": "dataset"}  # fmt: skip
    assert dataset[0]["source"] == "cof" and dataset[0]["id"] == "cof_sft_data-0"  # part files never share an id
    assert_every_crop_shows_the_target(dataset)


def test_pixel_reasoner_normalised_and_pixel_boxes_on_a_1_based_target_image(tmp_path):
    def message(role, *parts):
        return {"role": role, "content": list(parts)}

    def call(box, target):
        arguments = {"bbox_2d": box, "target_image": target}
        return {"type": "text", "text": think("I zoom in on the red square.")
                + f'<tool_call>{json.dumps({"name": "crop_image_normalized", "arguments": arguments})}</tool_call>'}  # fmt: skip

    record = {
        "qid": "q0",
        "message_list": [
            message("user", {"type": "image", "image": "images/0.png"}, {"type": "text", "text": QUESTION}),
            # normalised on the original, padded 0.1 per side: (0.5, 0.2, 0.85, 0.6) -> (200, 60, 340, 180)
            message("assistant", call([0.6, 0.3, 0.75, 0.5], 1)),
            message("user", {"type": "image", "image": "crop1.png"}),
            # pixels of image 2 (140 x 120): (40, 30, 100, 90) / its size, padded -> (226, 78, 314, 162)
            message("assistant", call([40, 30, 100, 90], 2)),
            message("assistant", {"type": "text", "text": think("Red.") + "The answer is \\boxed{red}."}),
        ],
    }
    bad = {
        "qid": "q1",
        "message_list": [*record["message_list"][:2], message("assistant", call([0.1, 0.1, 0.2, 0.2], 5))],
    }
    root = write_sharegpt(tmp_path / "in", "pixel_reasoner.json", [record, bad])
    dataset, stats = converted(tmp_path, "pixel_reasoner_sft", root)
    assert stats["rows_converted"] == 1 and stats["rows_skipped"] == {"bad_source": 1}
    assert [c["box"] for c in dataset[0]["gold_calls"]] == [[200, 60, 340, 180], [226, 78, 314, 162]]
    assert dataset[0]["answer"] == "red" and dataset[0]["id"] == "q0"
    assert_every_crop_shows_the_target(dataset)


def test_deepeyes_v2_pil_crop_code_and_thyme_numpy_slices_are_read_in_their_orders(tmp_path):
    code = "<code>```python\ncrop = image_1.crop((240, 90, 300, 150))\ndisplay(crop)\n```</code>"
    v2 = [cof_record(think("I examine the red square.") + code, think("Red.") + "<answer>red</answer>")]
    dataset, stats = converted(
        tmp_path, "deepeyes_v2_sft", write_sharegpt(tmp_path / "v2", "json/sft_part_0.json", v2)
    )
    assert stats["rows_converted"] == 1 and dataset[0]["gold_calls"][0]["box"] == [240, 90, 300, 150]
    assert dataset[0]["gold_calls"][0]["label"] == "the red square"
    assert_every_crop_shows_the_target(dataset)

    image64 = base64.b64encode(png(scene())).decode()
    question = f'### User Image Path:** "/abs/orig.jpg"\n### User Image Size:** "400x300"\n{QUESTION}'
    response = (think("Let me crop the small square.") + "<code>\nimport cv2\nimage = cv2.imread(path)\n"
                "crop = image[90:150, 240:300]\ncv2.imwrite('c.jpg', crop)\n</code><sandbox_output><image>"
                "</sandbox_output>" + think("It is red.") + "<answer>red</answer>")  # fmt: skip
    thyme = tmp_path / "thyme"
    thyme.mkdir()
    (thyme / "train.json").write_text(json.dumps([{"image": [image64], "question": question, "response": response}]))
    dataset, stats = converted(tmp_path, "thyme_sft", thyme)
    (call,) = dataset[0]["gold_calls"]
    assert call["box"] == [240, 90, 300, 150]  # numpy order y1:y2, x1:x2 read back to x1, y1, x2, y2
    assert (call["label"], call["label_source"]) == ("the small square", "thought")
    assert dataset[0]["prompt"][-1]["content"].startswith(QUESTION) and dataset[0]["final_thought"] == "It is red."
    assert_every_crop_shows_the_target(dataset)


# A final turn that answers twice: blue, then red on second thought.
TWO_ANSWERS = think("Blue, at first sight.") + "<answer>blue</answer>" + think("No: red.") + "<answer>red</answer>"


@pytest.mark.parametrize("fmt", ["cof_sft", "mini_o3_coldstart"])
def test_a_turn_with_two_answers_is_read_by_its_last_in_conversion_as_in_evaluation(tmp_path, fmt):
    """One answer rule (`data.task.extract_answer`, the last `<answer>`): the converted row's answer is the one the
    rewards and evaluation would read from the same text, so SFT never trains on an answer evaluation would not
    score."""
    assert extract_answer(TWO_ANSWERS) == "red"
    if fmt == "cof_sft":
        root = write_sharegpt(
            tmp_path / "in", "cof_sft_data.json", [cof_record(cof_call([240, 90, 300, 150]), TWO_ANSWERS)]
        )
    else:
        turns = mini_o3_turns({"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"})
        root = write_mini_o3(tmp_path / "in", [[*turns[:-1], {"from": "gpt", "value": TWO_ANSWERS}]])
    dataset, stats = converted(tmp_path, fmt, root)
    assert stats["rows_converted"] == 1
    assert dataset[0]["answer"] == extract_answer(TWO_ANSWERS) == "red"


def test_label_limits_are_the_tool_s_unless_the_command_line_says_otherwise(tmp_path):
    """`--max_label_words` / `--max_label_chars` default to `ToolConfig`'s and override them."""
    args = convert.parse_args(["--format", "cof_sft", "--input", "i", "--output", "o"])
    assert (args.max_label_words, args.max_label_chars) == (ToolConfig().max_label_words, ToolConfig().max_label_chars)
    answer = think("Red.") + "<answer>red</answer>"
    records = [cof_record(cof_call(TARGET, label=label), answer) for label in ("the red square", "the square")]
    root = write_sharegpt(tmp_path / "in", "cof_sft_data.json", records)
    argv = ["--format", "cof_sft", "--input", str(root), "--output", str(tmp_path / "out"), "--max_label_words", "2"]
    stats = convert.main(argv)
    assert stats["rows_converted"] == 1 and stats["rows_skipped"] == {"label_too_long": 1}  # 3 words over 2


def test_a_wrong_format_fails_at_once_naming_what_it_expected_and_found(tmp_path):
    root = write_mini_o3(tmp_path / "in", [mini_o3_turns({"bbox_2d": [0.5, 0.2, 0.8, 0.6]})])
    with pytest.raises(LayoutError, match=r"--format cof_sft: no cof_sft_data.json under .* \(found: \['data'\]\)"):
        convert.main(["--format", "cof_sft", "--input", str(root), "--output", str(tmp_path / "out")])
    sharegpt = write_sharegpt(tmp_path / "pr", "x.json", [{"messages": [], "images": []}])
    with pytest.raises(LayoutError, match=r"expected fields \['message_list'\], found \['images', 'messages'\]"):
        convert.main(["--format", "pixel_reasoner_sft", "--input", str(sharegpt), "--output", str(tmp_path / "o")])


# ------------------------------------------------------------------------------------------- preview and SFT
def test_the_preview_writes_the_original_the_replayed_crops_and_a_page(tmp_path):
    first = {"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}
    second = {"bbox_2d": [0.25, 0.2, 0.9, 0.8], "source": "observation_1"}
    root = write_mini_o3(tmp_path / "in", [mini_o3_turns(first, second), mini_o3_turns(first)])
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


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium package (/usr/bin/chromium)")
def test_the_preview_page_renders_in_headless_chromium(tmp_path):
    root = write_mini_o3(tmp_path / "in", [mini_o3_turns({"bbox_2d": [0.5, 0.2, 0.8, 0.6]})])
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
    first = {"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}
    root = write_mini_o3(tmp_path / "in", [mini_o3_turns(first)] * 4)
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
        make_environment_factory(ToolConfig(), convert.preview_budget(None)[1]),
    )
    assert stats.calls == {1: 4} and "I zoom in on the red square." in gold[0]["messages"][2]["content"]
