"""Issue 64, item 6: TreeBench (VLMEvalKit's TreeBench.tsv) and VisualProbe (Mini-o3's val.json files) read from
their release layouts, scored by their sources' rules (by hand), TreeBench's boxes read for grounding, and one
evaluation run on TreeBench with its options shuffled."""

import base64
import io
import json

import pandas as pd
import pytest
from PIL import Image

from configs import EvalArguments
from data.benchmarks import read_benchmark
from data.rows import BadRowError
from data.task import OPTION_LETTERS
from evaluation import run as evaluation_run
from evaluation.metrics import benchmark_metrics, reply_verdict, score_answer, scoring_rule
from evaluation.robustness import plan_units, unit_row
from evaluation.run import read_samples, run_evaluation
from tiny.scripted import force_tool_calls
from tools import ToolConfig
from utils.models import load_processor


def jpeg(size=(96, 64), colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="JPEG")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------- TreeBench
def treebench_rows():
    """TreeBench.tsv's columns as VLMEvalKit's TreeBench class reads them: `target_instances` a Python list literal."""
    image = base64.b64encode(jpeg()).decode()
    return [
        {"index": 0, "image": image, "question": "What colour is the cup?", "A": "red", "B": "blue", "C": "green",
         "D": "white", "answer": "A", "category": "Perception/Attributes",
         "target_instances": "[[10, 20, 30, 40], [50, 8, 70, 30]]"},
        {"index": 1, "image": image, "question": "Which is nearer the camera?", "A": "the cup", "B": "the book",
         "C": None, "D": None, "answer": "B", "category": "Reasoning/Perspective Transform",
         "target_instances": "[[0, 0, 20, 20]]"},
        {"index": 2, "image": image, "question": "What is written?", "A": "STOP", "B": "GO", "C": None, "D": None,
         "answer": "A", "category": "Perception/OCR", "target_instances": "[[1, 2, 3]]"},  # a box of 3 numbers
    ]  # fmt: skip


@pytest.fixture
def treebench_tsv(tmp_path):
    path = tmp_path / "TreeBench.tsv"
    pd.DataFrame(treebench_rows()).to_csv(path, sep="\t", index=False)  # how VLMEvalKit dumps its TSVs
    return path


def test_treebench_reads_its_release_layout(treebench_tsv):
    with pytest.raises(BadRowError, match="row 2.*target_instances.*not a list of \\[x1, y1, x2, y2\\] boxes"):
        read_benchmark("treebench", treebench_tsv)
    dataset, skipped = read_benchmark("treebench", treebench_tsv, skip_bad_rows=True)
    assert len(dataset) == 2 and len(skipped) == 1 and skipped[0].field == "target_instances"
    first, second = dataset[0], dataset[1]
    assert first["source"] == "treebench/Perception/Attributes" and first["options"] == [
        "red",
        "blue",
        "green",
        "white",
    ]
    assert first["target_bbox"] == [10, 8, 70, 40]  # the box around both target instances
    assert second["options"] == ["the cup", "the book"] and second["target_bbox"] == [0, 0, 20, 20]
    assert second["source"] == "treebench/Reasoning/Perspective Transform" and second["answer"] == "B"


def test_treebench_is_scored_by_vlmevalkits_rule():
    options, source = ["red", "blue", "green", "white"], "treebench/Perception/Attributes"
    assert scoring_rule("treebench", source) == "treebench"
    verdict = score_answer("treebench", "b", "B", options, source)
    assert (verdict.correct, verdict.rule) == (True, "letter")  # the <answer> block is upper-cased first
    # upper-cased, "The answer is B" loses its prefix match: the first capital A-E is the E of THE
    assert not score_answer("treebench", "The answer is B", "B", options, source).correct
    assert score_answer("treebench", "", "A", options, source).rule == "empty_read_as_A"
    # without <answer> tags VLMEvalKit reads the reply whole, not upper-cased: the prefix is stripped, B read
    row = {"answer": "B", "options": options, "source": source}
    reply = reply_verdict("treebench", None, "The answer is B", row)
    assert (reply.correct, reply.rule) == (True, "letter")


def test_treebench_reports_task_and_subtask():
    records = [
        {"source": "treebench/Perception/Attributes", "correct": True},
        {"source": "treebench/Perception/OCR", "correct": False},
        {"source": "treebench/Reasoning/Ordering", "correct": True},
    ]
    metrics = benchmark_metrics("treebench", records)
    assert metrics["accuracy_by_task"] == {"Perception": 0.5, "Reasoning": 1.0}
    assert metrics["accuracy_by_subtask"]["Perception/OCR"] == 0.0


def test_treebench_options_shuffle_with_the_gold(treebench_tsv):
    dataset, _ = read_benchmark("treebench", treebench_tsv, skip_bad_rows=True)
    for unit in plan_units(dataset["id"], [0, 1], samples=1, seed=1):
        row = dataset[unit.row]
        shown = unit_row(row, unit, seed=1)
        gold = row["options"][OPTION_LETTERS.index(row["answer"])]
        assert shown["options"][OPTION_LETTERS.index(shown["answer"])] == gold


def test_an_evaluation_on_treebench_shuffled_with_its_boxes(tiny_kit, treebench_tsv, tmp_path):
    """The tiny policy (scripted: one zoom, then "A") on TreeBench's release layout, options shuffled by seed 1:
    every row twice, right exactly where the shown gold is A; the zoom boxes against the target boxes."""
    original = evaluation_run.load_model

    def load_model(name_or_path, **kwargs):
        model = original(name_or_path, **kwargs)
        force_tool_calls(model, load_processor(name_or_path).tokenizer)
        return model

    args = EvalArguments(
        model_name_or_path=str(tiny_kit["policy"]), benchmark="treebench", data_path=[str(treebench_tsv)],
        output_dir=str(tmp_path / "run"), max_completion_length=320, max_tool_calling_iterations=2, batch_size=4,
        device="cpu", skip_bad_rows=True, shuffle_options="1",
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation_run, "load_model", load_model)
        metrics = run_evaluation(args, ToolConfig(clip_model=str(tiny_kit["clip"])))
    records = read_samples(tmp_path / "run" / "samples.jsonl")
    assert len(records) == 4 and metrics["n"] == 2 and metrics["skipped_rows"] == 1
    assert all(r["correct"] == (r["answer"] == "A") for r in records)
    released = [r for r in records if r["order"] == "released"]
    assert metrics["answer_order"]["released"] == 0.5  # released golds A and B: "A" right once
    assert list(metrics["scoring"]) == ["treebench"]
    assert metrics["grounding"]["all"]["samples"] == 2 and set(metrics["grounding"]["by_source"]) == {
        r["source"] for r in released
    }


# ----------------------------------------------------------------------------------------------- VisualProbe
@pytest.fixture
def visualprobe_root(tmp_path):
    """Mini-o3's BASE_IMAGE_DIR: VisualProbe_{Easy,Hard}/val.json, image paths relative to BASE_IMAGE_DIR."""
    root = tmp_path / "mini_o3_data"
    for split, colour in (("VisualProbe_Easy", (10, 200, 10)), ("VisualProbe_Hard", (10, 10, 200))):
        (root / split / "images").mkdir(parents=True)
        (root / split / "images" / "0.jpg").write_bytes(jpeg(colour=colour))
        records = [
            {"images": [f"{split}/images/0.jpg"], "doc_id": 0, "problem": "<image>\nWhat is written on the sign?",
             "solution": "STOP", "data_source": split.lower()},
            {"images": [f"{split}/images/0.jpg"], "doc_id": 1,
             "problem": "<image>\nWhich colour is the car?\n(A) red\n(B) blue", "solution": "B",
             "data_source": split.lower()},
        ]  # fmt: skip
        (root / split / "val.json").write_text(json.dumps(records))
    return root


def test_visualprobe_reads_mini_o3s_layout(visualprobe_root):
    dataset, _ = read_benchmark("visualprobe", visualprobe_root)
    assert dataset["id"] == ["VisualProbe_Easy/0", "VisualProbe_Easy/1", "VisualProbe_Hard/0", "VisualProbe_Hard/1"]
    assert dataset["source"] == ["visualprobe/VisualProbe_Easy"] * 2 + ["visualprobe/VisualProbe_Hard"] * 2
    assert dataset[1]["options"] == ["red", "blue"] and dataset[1]["answer"] == "B"
    assert dataset[0]["options"] == [] and dataset[0]["answer"] == "STOP"
    one, _ = read_benchmark("visualprobe", visualprobe_root / "VisualProbe_Hard")  # one split's folder
    assert one["id"] == ["VisualProbe_Hard/0", "VisualProbe_Hard/1"]
    with pytest.raises(FileNotFoundError, match="VisualProbe_\\{Easy,Medium,Hard\\}/val.json"):
        read_benchmark("visualprobe", visualprobe_root / "elsewhere")


@pytest.mark.parametrize(
    ("prediction", "answer", "expected"),
    [
        ("B", "B", (True, "exact")), (" STOP ", "STOP", (True, "exact")), ("(B) blue", "B", (True, "letter")),
        ("B. blue", "B", (True, "letter")), ("b", "B", (False, "none")), ("The answer is B", "B", (False, "none")),
        ("stop", "STOP", (False, "none")),
    ],
)  # fmt: skip
def test_visualprobe_is_scored_by_mini_o3s_rule(prediction, answer, expected):
    verdict = score_answer("visualprobe", prediction, answer, ["red", "blue"], "visualprobe/VisualProbe_Easy")
    assert (verdict.correct, verdict.rule) == expected


def test_visualprobe_reads_no_reply_without_tags():
    """Mini-o3 scores a reply without an <answer> block 0: its reply-level reading is ours."""
    row = {"answer": "B", "options": ["red", "blue"], "source": "visualprobe/VisualProbe_Easy"}
    assert reply_verdict("visualprobe", None, "B", row).rule == "no_answer"
