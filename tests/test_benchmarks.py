"""Benchmark readers on small fixtures written in each benchmark's published on-disk layout.

The real files cannot be downloaded here, so each fixture rebuilds the layout the readers document (and
docs/evaluation.md cites): file names, field names, option formats and image encodings, with tiny generated images.
"""

import base64
import io
import json
import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import data.benchmarks as benchmarks
from data import get_dataset
from data.benchmarks import BadRowError, load_benchmark, read_benchmark
from data.questions import _LETTER_OPTION, _OPTION, _OPTIONS_HEADER, _option, split_options
from data.synthetic import build_synthetic
from data.task import build_prompt

VSTAR_SUFFIX = "Answer with the option's letter from the given choices directly."


def image_bytes(size=(64, 48), colour=(200, 30, 30), fmt="JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format=fmt)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decoded_size(dataset, i):
    return dataset[i]["image"].size


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture
def vstar_dir(tmp_path):
    """craigwu/vstar_bench: test_questions.jsonl + <category>/<image>.jpg with a <image>.json annotation each."""
    root = tmp_path / "vstar_bench"
    items = [
        ("direct_attributes/sa_1.jpg", "What is the color of the cup?", ["red", "blue", "green", "white"], "B",
         {"target_object": ["cup"], "bbox": [[10, 20, 30, 40]]}),
        ("direct_attributes/sa_2.jpg", "What is the material of the glove?", ["rubber", "cotton", "kevlar", "leather"],
         "A", {"target_object": ["glove"], "bbox": [[1, 2, 3, 4]]}),
        ("relative_position/sa_3.jpg", "Is the dog on the left or right side of the cat?", ["left", "right"], "A",
         {"target_object": ["dog", "cat"], "bbox": [[5, 5, 10, 10], [30, 8, 10, 20]]}),
    ]  # fmt: skip
    lines = []
    for qid, (rel, question, options, label, annotation) in enumerate(items):
        image = root / rel
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(image_bytes(size=(80 + qid, 60)))
        annotation |= {"question": question, "options": options}
        image.with_suffix(".json").write_text(json.dumps(annotation))
        letters = "\n".join(f"({chr(65 + i)}) {option}" for i, option in enumerate(options))
        text = f"{question}\n{letters}\n{VSTAR_SUFFIX}"
        record = {"image": rel, "text": text, "category": rel.split("/")[0], "question_id": qid, "label": label}
        lines.append(json.dumps(record))
    (root / "test_questions.jsonl").write_text("\n".join(lines) + "\n")
    return root


def hrbench_rows():
    """DreamMr/HR-Bench rows: index, question, answer letter, A-D, category single/cross, cycle_category, base64."""
    return [
        {"index": 0, "question": "What is written on the sign?", "answer": "C", "A": "STOP", "B": "GO", "C": "EXIT",
         "D": "OPEN", "category": "single", "cycle_category": "cycle_0", "image": b64(image_bytes((90, 70)))},
        {"index": 1, "question": "Which car is closer to the tree?", "answer": "A", "A": "the red one",
         "B": "the blue one", "C": "neither", "D": "both", "category": "cross", "cycle_category": "cycle_0",
         "image": b64(image_bytes((91, 70)))},
    ]  # fmt: skip


@pytest.fixture
def hrbench_tsv(tmp_path):
    path = tmp_path / "hr_bench_4k.tsv"
    pd.DataFrame(hrbench_rows()).to_csv(path, sep="\t", index=False)  # how VLMEvalKit dumps its TSVs
    return path


@pytest.fixture
def hrbench_parquet(tmp_path):
    path = tmp_path / "hr_bench_8k.parquet"
    pd.DataFrame(hrbench_rows()).to_parquet(path, index=False)
    return path


def mme_items():
    """yfzhang114/MME-RealWorld's MME_RealWorld.json entries (evaluation/output_test_template.json's fields)."""
    return [
        {"Question_id": "perception/monitoring/Vehicle/counting/0310", "Image": "monitoring_images/a.jpg",
         "Text": "What is the number of buses in the image?", "Question Type": "Multiple Choice",
         "Answer choices": ["(A) 13", "(B) 90", "(C) 77", "(D) 6", "(E) The image does not feature the buses"],
         "Ground truth": "E", "Category": "Vehicle/counting", "Subtask": "Monitoring", "Task": "Perception"},
        {"Question_id": "reasoning/diagram_and_table/diagram/0020", "Image": "diagram_and_table/b.png",
         "Text": "In which year does the rate first exceed 1,400,000?", "Question Type": "Multiple Choice",
         "Answer choices": ["(A) 2029", "(B) 2030", "(C) 2031", "(D) 2032", "(E) The image does not feature it."],
         "Ground truth": "C", "Category": "diagram", "Subtask": "Diagram and Table", "Task": "Reasoning"},
    ]  # fmt: skip


@pytest.fixture
def mme_dir(tmp_path):
    root = tmp_path / "MME-RealWorld"
    for item, fmt in zip(mme_items(), ("JPEG", "PNG")):
        (root / item["Image"]).parent.mkdir(parents=True, exist_ok=True)
        (root / item["Image"]).write_bytes(image_bytes(fmt=fmt))
    (root / "MME_RealWorld.json").write_text(json.dumps(mme_items(), indent=4))
    return root


@pytest.fixture
def mme_lite_dir(tmp_path):
    """lmms-eval's MME-RealWorld-lite: data/*.parquet with index, question, multi-choice options, answer, category,
    l2-category and `bytes` (the image as base64)."""
    root = tmp_path / "MME-RealWorld-Lite"
    (root / "data").mkdir(parents=True)
    rows = [
        {"index": 7, "question": item["Text"], "multi-choice options": item["Answer choices"],
         "answer": item["Ground truth"], "category": f"{item['Task']}/{item['Subtask']}",
         "l2-category": item["Category"], "bytes": b64(image_bytes())}
        for item in mme_items()
    ]  # fmt: skip
    rows[1]["index"] = 8
    pq.write_table(pa.Table.from_pylist(rows), root / "data" / "train-00000-of-00001.parquet")
    return root


@pytest.fixture
def deepeyes_parquet(tmp_path):
    """ChenShawn/DeepEyes-Datasets-47k: data_source, prompt[system, user], images[{bytes}], reward_model, extra_info."""
    rows = []
    for i, (question, truth) in enumerate([("What is the color of the bag?", "black"), ("How many cups?", "3")]):
        rows.append(
            {
                "data_source": "vstar",
                "prompt": [
                    {"role": "system", "content": "You are a helpful assistant. # Tools ..."},
                    {"role": "user", "content": f"<image>\n{question}\nThink first, call **image_zoom_in_tool** ..."},
                ],
                "images": [{"bytes": image_bytes(), "path": None}],
                "ability": "vl_chart",
                "env_name": "visual_toolbox_v2",
                "reward_model": {"ground_truth": truth, "style": "model"},
                "extra_info": {"answer": truth, "index": i, "question": f"<image>\n{question}", "split": "train"},
            }
        )
    path = tmp_path / "data_0.1.2_visual_toolbox_v2.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --------------------------------------------------------------------------------------------------------- readers
def test_split_options_strips_embedded_options_and_instruction():
    text = f"What is the color of the cup?\n(A) red\n(B) light blue\n{VSTAR_SUFFIX}"
    assert split_options(text) == ("What is the color of the cup?", ["red", "light blue"])
    assert split_options("  How many cups?  ") == ("How many cups?", [])
    assert split_options("Pick one\n(B) no A first") == ("Pick one\n(B) no A first", [])


# data/questions.py's option-line patterns before issue 59 (their lazy text and trailing `\s*` were quadratic in the
# spaces inside a line, as was the header's `\s*:?\s*$`): the oracles of `_option` and the possessive header.
REGEX_OPTION = re.compile(r"^\s*\(([A-H])\)\s*(.*?)\s*$")
REGEX_LETTER_OPTION = re.compile(r"^\s*([A-H])[.:)]\s+(.*?)\s*$")
REGEX_OPTIONS_HEADER = re.compile(r"^\s*(?:options|choices)\s*:?\s*$", re.IGNORECASE)
# Whitespace `\s` takes beyond ASCII's (an information separator, NEL, NBSP, a line separator) among the text.
LINE_SOUP = ("(", ")", "(A)", "(H)", "(I)", "A", "B", "a", ".", ":", "A.", "C:", " ", "  ", "\t", "\n", "\r", "\x0b",
             "\x1f", "\x85", "\u00a0", "\u2028", "\u3000", "x", "red", "options", "Choices", "OPTIONS")  # fmt: skip
lines = st.lists(st.sampled_from(LINE_SOUP), max_size=12).map("".join)


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(lines)
def test_option_lines_and_headers_are_what_the_regexes_read(line):
    """An option line's letter and text, and whether a line is an "Options:" header, on lines of letters, brackets,
    whitespace of many kinds, newlines inside and at the end: what the full patterns read. Seen failing with each
    of three bugs planted: a newline allowed in an option's text, its trailing whitespace cut to spaces only, and the
    header's colon made required."""
    for head, full in ((_OPTION, REGEX_OPTION), (_LETTER_OPTION, REGEX_LETTER_OPTION)):
        match = full.match(line)
        assert _option(line, head) == (match.groups() if match else None)
    assert (_OPTIONS_HEADER.match(line) is None) == (REGEX_OPTIONS_HEADER.match(line) is None)


def test_vstar(vstar_dir):
    dataset = load_benchmark("vstar", vstar_dir)
    assert {"id", "prompt", "image", "answer", "options"} <= set(dataset.column_names)
    assert dataset["id"] == ["0", "1", "2"]
    row = dataset[0]
    assert row["prompt"] == build_prompt("What is the color of the cup?", ["red", "blue", "green", "white"])
    assert VSTAR_SUFFIX not in row["prompt"][-1]["content"]  # the prompt is exactly a training prompt
    assert (row["answer"], row["source"]) == ("B", "vstar/direct_attributes")
    assert decoded_size(dataset, 0) == (80, 60) and decoded_size(dataset, 2) == (82, 60)
    assert row["target_bbox"] == [10, 20, 40, 60] and row["target_label"] == "cup"  # x, y, w, h -> x1, y1, x2, y2
    relative = dataset[2]
    assert relative["options"] == ["left", "right"] and relative["source"] == "vstar/relative_position"
    assert relative["target_bbox"] == [5, 5, 40, 28] and relative["target_label"] == "dog and cat"


@pytest.mark.parametrize("fixture", ["hrbench_tsv", "hrbench_parquet"])
def test_hrbench(fixture, request):
    path = request.getfixturevalue(fixture)
    dataset = load_benchmark("hrbench", path)
    variant = "hrbench_4k" if fixture == "hrbench_tsv" else "hrbench_8k"
    assert dataset["id"] == ["0", "1"]
    assert dataset["source"] == [f"{variant}/single", f"{variant}/cross"]
    assert dataset[0]["prompt"] == build_prompt("What is written on the sign?", ["STOP", "GO", "EXIT", "OPEN"])
    assert dataset["answer"] == ["C", "A"]
    assert decoded_size(dataset, 1) == (91, 70)


def test_mme_realworld_full(mme_dir):
    for path in (mme_dir, mme_dir / "MME_RealWorld.json"):  # the folder or the JSON file itself
        dataset = load_benchmark("mme_realworld", path)
        assert dataset["id"] == [item["Question_id"] for item in mme_items()]
        assert dataset[0]["options"] == ["13", "90", "77", "6", "The image does not feature the buses"]
        assert dataset[0]["prompt"] == build_prompt(mme_items()[0]["Text"], dataset[0]["options"])
        assert dataset["answer"] == ["E", "C"]
        assert dataset["source"] == [
            "mme_realworld/Perception/Monitoring/Vehicle/counting",
            "mme_realworld/Reasoning/Diagram and Table/diagram",
        ]
        assert decoded_size(dataset, 1) == (64, 48)


def test_mme_realworld_lite(mme_lite_dir):
    dataset = load_benchmark("mme_realworld", mme_lite_dir)
    assert dataset["id"] == ["7", "8"]
    assert dataset[1]["options"] == ["2029", "2030", "2031", "2032", "The image does not feature it."]
    assert dataset["source"] == [
        "mme_realworld_lite/Perception/Monitoring/Vehicle/counting",
        "mme_realworld_lite/Reasoning/Diagram and Table/diagram",
    ]
    assert decoded_size(dataset, 0) == (64, 48)


def test_deepeyes(deepeyes_parquet):
    dataset = load_benchmark("deepeyes", deepeyes_parquet)
    stem = deepeyes_parquet.stem
    assert dataset["id"] == [f"{stem}-0", f"{stem}-1"]
    assert dataset[0]["prompt"] == build_prompt("What is the color of the bag?")  # DeepEyes' own prompt is replaced
    assert dataset["answer"] == ["black", "3"] and dataset["options"] == [[], []]
    assert dataset["source"] == ["deepeyes/vstar"] * 2
    assert decoded_size(dataset, 0) == (64, 48)


def test_registered_for_the_rl_entry(deepeyes_parquet, hrbench_tsv):
    """data.load_split calls get_dataset(name, path=..., split=...) for every non-synthetic dataset name."""
    assert len(get_dataset("deepeyes", path=str(deepeyes_parquet), split="train")) == 2
    assert len(get_dataset("hrbench", path=str(hrbench_tsv), split="train", skip_bad_rows=False)) == 2


def test_synthetic(tmp_path, monkeypatch):
    saved = build_synthetic(3, seed=1, split="test", min_size=300, max_size=400)
    saved.save_to_disk(tmp_path / "synthetic")
    assert load_benchmark("synthetic", tmp_path / "synthetic")["id"] == saved["id"]
    monkeypatch.setattr(benchmarks, "SYNTHETIC_EVAL_ROWS", 2)  # the generated default split, kept small here
    generated = load_benchmark("synthetic")
    assert generated["id"] == ["test-000000", "test-000001"]  # a test split: never rows training draws
    # An evaluation's limit draws only the rows it reads, and they are the same rows: each is drawn from its index.
    drawn, _ = benchmarks.read_benchmark("synthetic", rows=1)
    assert len(drawn) == 1 and drawn[0] == generated[0]
    assert len(benchmarks.read_benchmark("synthetic", rows=5)[0]) == 2  # never past the split


def test_missing_files_say_what_layout_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="test_questions.jsonl"):
        load_benchmark("vstar", tmp_path)
    with pytest.raises(FileNotFoundError, match="MME_RealWorld.json"):
        load_benchmark("mme_realworld", tmp_path)
    with pytest.raises(ValueError, match="data_path"):
        load_benchmark("hrbench")


# -------------------------------------------------------------------------------------------------------- bad rows
def break_vstar_image(root):
    (root / "direct_attributes" / "sa_2.jpg").unlink()
    return "vstar", root, root / "test_questions.jsonl", 1, "image", "not found"


def break_hrbench_image(path):
    frame = pd.read_csv(path, sep="\t")
    frame.loc[1, "image"] = b64(b"this is not an image")
    frame.to_csv(path, sep="\t", index=False)
    return "hrbench", path, path, 1, "image", "cannot identify image"


def break_mme_answer(root):
    items = mme_items()
    del items[0]["Ground truth"]
    (root / "MME_RealWorld.json").write_text(json.dumps(items))
    return "mme_realworld", root, root / "MME_RealWorld.json", 0, "Ground truth", "missing"


def break_hrbench_option(path):
    frame = pd.read_csv(path, sep="\t")
    frame.loc[0, "answer"] = "E"  # HR-Bench has four options
    frame.to_csv(path, sep="\t", index=False)
    return "hrbench", path, path, 0, "answer", "not one of the 4 options"


def break_deepeyes_truth(path):
    table = pq.read_table(path).to_pylist()
    table[1]["reward_model"] = None
    pq.write_table(pa.Table.from_pylist(table), path)
    return "deepeyes", path, path, 1, "reward_model.ground_truth", "missing"


@pytest.mark.parametrize(
    ("fixture", "breaker"),
    [
        ("vstar_dir", break_vstar_image),
        ("hrbench_tsv", break_hrbench_image),
        ("mme_dir", break_mme_answer),
        ("hrbench_tsv", break_hrbench_option),
        ("deepeyes_parquet", break_deepeyes_truth),
    ],
)
def test_bad_row_names_file_row_and_field_or_is_skipped(fixture, breaker, request):
    name, path, file, row, field, reason = breaker(request.getfixturevalue(fixture))
    with pytest.raises(BadRowError) as caught:
        load_benchmark(name, path)
    error = caught.value
    assert (error.file, error.row, error.field) == (str(file), row, field)
    assert (
        reason in str(error) and str(file) in str(error) and f"row {row}" in str(error) and repr(field) in str(error)
    )

    dataset, skipped = read_benchmark(name, path, skip_bad_rows=True)
    assert [(bad.row, bad.field) for bad in skipped] == [(row, field)]
    assert len(dataset) == {"vstar": 2, "hrbench": 1, "mme_realworld": 1, "deepeyes": 1}[name]


def test_duplicate_ids_are_bad_rows(hrbench_tsv):
    frame = pd.read_csv(hrbench_tsv, sep="\t")
    frame.loc[1, "index"] = 0
    frame.to_csv(hrbench_tsv, sep="\t", index=False)
    with pytest.raises(BadRowError, match="duplicate id"):
        load_benchmark("hrbench", hrbench_tsv)
