"""Evaluation against hostile input (issue 59, item 5), read and parsed directly: no model loads.

A benchmark row that is a list, names an image by a number, holds an `Infinity`, huge or deeply nested box, or is not
UTF-8 is a counted skip with `skip_bad_rows`, else a `BadRowError` naming the file, the row and the field; a file that
is not its format at all is an error naming the file. A damaged `samples.jsonl` names its file and line. Every message
stays short whatever the row holds. Out-of-range arguments fail at parse, naming the argument and its range.
"""

import json
import logging
import math

import pandas as pd
import pytest

from configs import EvalArguments
from data.benchmarks import BadRowError, read_benchmark
from evaluate import parse_args
from evaluation.run import _check_resume, read_samples, recorded_ids
from tests.test_benchmarks import b64, hrbench_rows, hrbench_tsv, image_bytes, mme_dir, mme_items, vstar_dir  # noqa: F401
from tools import ToolConfig

MESSAGE_LIMIT = 600  # characters: a skip message names file, row and field and says why, never the value whole
DEEP = "[" * 100_000
NESTED_1000 = "[" * 1000 + "1" + "]" * 1000
QUESTION = "What is the colour of the cup?\n(A) red\n(B) blue\nAnswer with the option's letter."


def vstar_line(image="direct_attributes/sa_9.jpg", **fields) -> dict:
    return {"question_id": 9, "text": QUESTION, "category": "direct_attributes", "label": "A", "image": image} | fields


def with_annotation(root, annotation: str) -> bytes:
    """A V* question whose image exists and whose annotation file holds `annotation` (raw JSON text)."""
    image = root / "direct_attributes" / "sa_9.jpg"
    image.write_bytes(image_bytes())
    image.with_suffix(".json").write_bytes(annotation.encode("latin-1"))
    return json.dumps(vstar_line()).encode()


# case: (the line appended to test_questions.jsonl, the file named: "questions" or "annotation", the field)
VSTAR_CASES = {
    "row is a list": (lambda root: b"[1, 2, 3]", "questions", "(row)"),
    "image is a number": (lambda root: json.dumps(vstar_line(image=7)).encode(), "questions", "image"),
    "image is a nested list": (lambda root: json.dumps(vstar_line(image=[[[1]]])).encode(), "questions", "image"),
    "image path too long for the file system": (
        lambda root: json.dumps(vstar_line(image="a" * 5000 + ".jpg")).encode(),
        "questions",
        "image",
    ),
    "latin-1 line": (
        lambda root: json.dumps(vstar_line(), ensure_ascii=False).replace("cup", "tasse à café").encode("latin-1"),
        "questions",
        "(line)",
    ),
    "line opens 100000 brackets": (lambda root: DEEP.encode(), "questions", "(line)"),
    "id nested 1000 deep": (lambda root: ('{"question_id": ' + NESTED_1000 + "}").encode(), "questions", "(line)"),
    "Infinity in the box": (
        lambda root: with_annotation(root, '{"target_object": ["cup"], "bbox": [[Infinity, 0, 5, 5]]}'),
        "annotation",
        "bbox",
    ),
    "NaN in the box": (
        lambda root: with_annotation(root, '{"target_object": ["cup"], "bbox": [[NaN, 0, 5, 5]]}'),
        "annotation",
        "bbox",
    ),
    "box past int32": (
        lambda root: with_annotation(root, '{"target_object": ["cup"], "bbox": [[1e20, 0, 5, 5]]}'),
        "annotation",
        "bbox",
    ),
    "box nested 1000 deep": (
        lambda root: with_annotation(root, '{"target_object": ["cup"], "bbox": ' + NESTED_1000 + "}"),
        "annotation",
        "bbox",
    ),
    "annotation opens 100000 brackets": (lambda root: with_annotation(root, DEEP), "annotation", "bbox"),
    "latin-1 annotation": (
        lambda root: with_annotation(root, '{"target_object": ["tasse à café"], "bbox": [[1, 2, 3, 4]]}'),
        "annotation",
        "bbox",
    ),
}


def assert_names(error: BadRowError, file, row: int, field: str):
    assert (error.file, error.row, error.field) == (str(file), row, field)
    assert str(file) in str(error) and f"row {row}" in str(error) and repr(field) in str(error)
    assert len(str(error)) < MESSAGE_LIMIT, str(error)[:2000]


@pytest.mark.parametrize("case", list(VSTAR_CASES))
def test_a_hostile_vstar_row_is_named_or_skipped(vstar_dir, case):  # noqa: F811
    make_line, named, field = VSTAR_CASES[case]
    questions = vstar_dir / "test_questions.jsonl"
    line = make_line(vstar_dir)
    questions.write_bytes(questions.read_bytes() + line + b"\n")
    file, row = (questions, 3) if named == "questions" else (vstar_dir / "direct_attributes" / "sa_9.json", 0)
    with pytest.raises(BadRowError) as caught:
        read_benchmark("vstar", vstar_dir)
    assert_names(caught.value, file, row, field)

    dataset, skipped = read_benchmark("vstar", vstar_dir, skip_bad_rows=True)
    assert len(dataset) == 3 and [(bad.file, bad.row, bad.field) for bad in skipped] == [(str(file), row, field)]


def test_every_hostile_vstar_row_in_one_file_is_counted_and_the_rest_read(vstar_dir, caplog):  # noqa: F811
    questions = vstar_dir / "test_questions.jsonl"
    lines = [make_line(vstar_dir) for make_line, named, _ in VSTAR_CASES.values() if named == "questions"]
    questions.write_bytes(questions.read_bytes() + b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING):
        dataset, skipped = read_benchmark("vstar", vstar_dir, skip_bad_rows=True)
    assert sorted(dataset["id"]) == ["0", "1", "2"]
    assert [bad.row for bad in skipped] == list(range(3, 3 + len(lines)))
    assert all(len(message) < MESSAGE_LIMIT for message in caplog.messages)


def test_a_hrbench_tsv_row_not_in_utf8_names_its_row_and_column(hrbench_tsv):  # noqa: F811
    text = hrbench_tsv.read_bytes()
    hrbench_tsv.write_bytes(text.replace(b"Which car is closer", "Quelle voiture, près".encode("latin-1")))
    with pytest.raises(BadRowError) as caught:
        read_benchmark("hrbench", hrbench_tsv)
    assert_names(caught.value, hrbench_tsv, 1, "question")
    assert "UTF-8" in str(caught.value)
    dataset, skipped = read_benchmark("hrbench", hrbench_tsv, skip_bad_rows=True)
    assert dataset["id"] == ["0"] and [(bad.row, bad.field) for bad in skipped] == [(1, "question")]


def test_a_hrbench_image_that_is_a_huge_number_allocates_nothing(tmp_path):
    """bytes(n) of an integer cell would ask for n bytes: 2**62 is a MemoryError, not a bad row."""
    rows = hrbench_rows()
    frame = pd.DataFrame(rows).astype({"image": object})
    frame["image"] = [2**62, 7]
    path = tmp_path / "hr_bench_4k.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(BadRowError) as caught:
        read_benchmark("hrbench", path)
    assert_names(caught.value, path, 0, "image")


def test_a_truncated_parquet_is_an_error_naming_it(tmp_path):
    path = tmp_path / "hr_bench_8k.parquet"
    pd.DataFrame(hrbench_rows()).to_parquet(path, index=False)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=f"{path}: not a readable parquet file"):
        read_benchmark("hrbench", path, skip_bad_rows=True)


def test_a_row_a_reader_cannot_parse_is_an_error_naming_the_file_and_where(tmp_path):
    """An exception a reader did not foresee (DeepEyes' `extra_info` a string, not a struct) ends its file: an error
    naming the file and the last row read, not a bare AttributeError."""
    path = tmp_path / "deepeyes.parquet"
    rows = [{"extra_info": "a string", "images": [{"bytes": image_bytes()}], "reward_model": {"ground_truth": "A"}}]
    pd.DataFrame(rows).to_parquet(path, index=False)
    with pytest.raises(ValueError, match=f"{path}: unreadable at its first row: AttributeError"):
        read_benchmark("deepeyes", path, skip_bad_rows=True)


def write_mme(root, items):
    (root / "MME_RealWorld.json").write_text(json.dumps(items))
    return root / "MME_RealWorld.json"


MME_ROW_CASES = {
    "row is a list": (lambda item: [1, 2], "(row)"),
    "Image is a number": (lambda item: item | {"Image": 7}, "Image"),
    "Answer choices is a number": (lambda item: item | {"Answer choices": 5}, "Answer choices"),
    "Answer choices holds numbers": (lambda item: item | {"Answer choices": [1, 2]}, "Answer choices"),
    "Ground truth is a long nested list": (
        lambda item: item | {"Ground truth": [list(range(5000))] * 50},
        "Ground truth",
    ),
    "Question_id is a long list": (lambda item: item | {"Question_id": list(range(100_000))}, "Question_id"),
}


@pytest.mark.parametrize("case", list(MME_ROW_CASES))
def test_a_hostile_mme_realworld_row_is_named_or_skipped(mme_dir, case):  # noqa: F811
    change, field = MME_ROW_CASES[case]
    items = mme_items()
    items[1] = change(items[1])
    file = write_mme(mme_dir, items)
    with pytest.raises(BadRowError) as caught:
        read_benchmark("mme_realworld", mme_dir)
    assert_names(caught.value, file, 1, field)
    dataset, skipped = read_benchmark("mme_realworld", mme_dir, skip_bad_rows=True)
    assert len(dataset) == 1 and [(bad.row, bad.field) for bad in skipped] == [(1, field)]


MME_FILE_CASES = {
    "an object, not a list": (b'{"questions": []}', "a JSON list"),
    "latin-1": (json.dumps(mme_items(), ensure_ascii=False).replace("buses", "autobús").encode("latin-1"), "UTF-8"),
    "100000 brackets": (DEEP.encode(), "nested"),
    "not JSON": (b'[{"Question_id": 1,,}]', "not JSON"),
}


@pytest.mark.parametrize("case", list(MME_FILE_CASES))
@pytest.mark.parametrize("skip_bad_rows", [False, True])
def test_an_mme_realworld_file_not_in_its_format_is_an_error_naming_it(mme_dir, case, skip_bad_rows):  # noqa: F811
    content, reason = MME_FILE_CASES[case]
    file = mme_dir / "MME_RealWorld.json"
    file.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        read_benchmark("mme_realworld", mme_dir, skip_bad_rows=skip_bad_rows)
    assert str(file) in str(caught.value) and reason in str(caught.value)
    assert len(str(caught.value)) < MESSAGE_LIMIT


# -------------------------------------------------------------------------------------------------------- resume
def samples(*ids) -> bytes:
    return b"".join(json.dumps({"id": i, "correct": True}).encode() + b"\n" for i in ids)


def test_a_line_cut_by_an_interrupted_write_is_dropped_and_cut_from_the_file(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(samples("a", "b") + b'{"id": "c", "corr')
    assert [record["id"] for record in read_samples(path)] == ["a", "b"]
    assert path.read_bytes() == samples("a", "b")  # the next append starts on a fresh line


DAMAGED = {
    "not JSON": samples("a") + b'{"id": "b", oops}\n' + samples("c"),
    "not UTF-8": samples("a") + '{"id": "café"}\n'.encode("latin-1") + samples("c"),
    "not an object": samples("a") + b"[1, 2]\n" + samples("c"),
    "no id": samples("a") + b'{"correct": true}\n' + samples("c"),
    "nested 100000 deep": samples("a") + DEEP.encode() + b"\n" + samples("c"),
    "complete last line that is not JSON": samples("a") + b'{"id": "b", oops}\n',
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_samples_file_names_its_file_and_line_and_how_to_recover(tmp_path, case):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(DAMAGED[case])
    for read in (lambda: read_samples(path), lambda: recorded_ids(tmp_path)):
        with pytest.raises(ValueError) as caught:
            read()
        message = str(caught.value)
        assert f"{path}: line 2" in message and "delete" in message and len(message) < MESSAGE_LIMIT
    assert path.read_bytes() == DAMAGED[case]  # nothing is cut but a partial last line


def test_a_damaged_eval_args_names_its_file(tmp_path):
    (tmp_path / "eval_args.json").write_text('{"benchmark": "vstar",')
    with pytest.raises(ValueError, match="eval_args.json"):
        _check_resume(tmp_path, EvalArguments(model_name_or_path="m"), ToolConfig())


# -------------------------------------------------------------------------------------------------------- arguments
BAD_ARGUMENTS = [
    ("batch_size", "-1", ">= 1"),
    ("batch_size", "0", ">= 1"),
    ("limit", "0", ">= 1"),
    ("limit", "-5", ">= 1"),
    ("temperature", "-1", ">= 0"),
    ("temperature", "nan", ">= 0"),
    ("temperature", "inf", ">= 0"),
    ("max_tool_calling_iterations", "-1", ">= 0"),
    ("max_completion_length", "0", ">= 1"),
    ("top_p", "0", "(0, 1]"),
    ("top_p", "1.5", "(0, 1]"),
    ("top_p", "nan", "(0, 1]"),
    ("report_max_samples", "-1", ">= 0"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_ARGUMENTS)
def test_an_out_of_range_argument_fails_at_parse_naming_it_and_its_range(name, value, allowed):
    argv = ["--model_name_or_path", "outputs/tiny/qwen2_5_vl", "--benchmark", "vstar", f"--{name}", value]
    with pytest.raises(ValueError) as caught:
        parse_args(argv)
    assert name in str(caught.value) and allowed in str(caught.value) and value in str(caught.value).lower()


def test_the_edges_of_each_range_parse():
    args = EvalArguments(
        model_name_or_path="m", batch_size=1, limit=1, temperature=0.0, top_p=1.0, max_tool_calling_iterations=0,
        max_completion_length=1, report_max_samples=0,
    )  # fmt: skip
    assert (args.batch_size, args.limit, args.max_tool_calling_iterations) == (1, 1, 0)
    unbounded = EvalArguments(model_name_or_path="m", limit=None, max_tool_calling_iterations=None, temperature=0.7)
    assert unbounded.limit is None and unbounded.max_tool_calling_iterations is None
    assert not math.isnan(unbounded.temperature)
