"""Readers of the RL training sets (DeepEyes-47k, Mini-o3's RL JSON, Chain-of-Focus' RL parquet) into `RawRow`s,
validated and loaded by `data.benchmarks.load_benchmark`; their layouts: docs/evaluation.md (DeepEyes) and docs/data.md
("RL sets")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data.questions import cof_question, dataset_question, split_options
from data.rows import BadRowError, RawRow, expect_file, parquet_records
from data.task import message_text

# Rows a rule cannot score fairly, by `source`: what they are and why. DeepEyes-47k's chart file holds free-form answers
# about multi-panel ArxivQA figures, which DeepEyes scores with an LLM judge (`data_source == "chart"` in its
# `verl/utils/reward_score/__init__.py`, routed to `vl_agent.compute_score`); compared as normalised strings, most
# right answers score 0. `rewards.check_rule_rewards` refuses them under rule-based outcome rewards.
JUDGED_SOURCES = {
    "deepeyes/chart": "DeepEyes-47k's chart rows (data_v0.8_visual_toolbox_v2.parquet, ArxivQA figures): free-form "
    "answers DeepEyes scores with an LLM judge",
}
_DEEPEYES_FIELDS = {"question": "extra_info.question", "answer": "reward_model.ground_truth", "image": "images[0]"}
_MINI_O3_FIELDS = {"id": "doc_id", "question": "problem", "answer": "solution", "image": "images[0]"}


def read_deepeyes(file: Path) -> Iterator[RawRow]:
    expect_file(file, "a DeepEyes-47k parquet file, e.g. data_v0.8_visual_toolbox_v2.parquet")
    for row, record in enumerate(parquet_records(file)):
        text = (record.get("extra_info") or {}).get("question")
        # the training prompt inserts the image itself; a literal "<image>" tag would only be noise
        question, options = split_options(text.replace("<image>", "")) if isinstance(text, str) else (None, [])
        values = {
            "id": f"{file.stem}-{row}",
            "source": f"deepeyes/{record.get('data_source')}",
            "question": question,
            "options": options,
            "answer": (record.get("reward_model") or {}).get("ground_truth"),
            "image": (record.get("images") or [None])[0],
        }
        yield RawRow(file, row, values, _DEEPEYES_FIELDS)


def read_mini_o3(path: Path) -> Iterator[RawRow | BadRowError]:
    file = path / "train.json" if path.is_dir() else path
    expect_file(file, "a Mini-o3 RL JSON file, e.g. VisualProbe_train/train.json, or the folder holding train.json")
    records = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(records, list):
        raise ValueError(f"{file}: expected a JSON list of Mini-o3 records, got {type(records).__name__}")
    # Mini-o3 joins `images` to BASE_IMAGE_DIR, the folder above VisualProbe_train/train.json; paths written
    # relative to the JSON's own folder are accepted too, so either way of unpacking the release reads
    bases = (file.parent, file.parent.parent)
    for row, record in enumerate(records):
        if not isinstance(record, dict):
            yield BadRowError(file, row, "(row)", f"not a JSON object: {type(record).__name__}")
            continue
        text = record.get("problem")
        # the same words as the cold start's first human turn (`data.converters.mini_o3`)
        question, options = dataset_question(text) if isinstance(text, str) else (None, [])
        relative = (record.get("images") or [None])[0]
        image = None
        if isinstance(relative, str) and relative:
            image = next((base / relative for base in bases if (base / relative).is_file()), None)
            if image is None:
                places = " nor ".join(f"{base}/" for base in bases)
                yield BadRowError(file, row, "images[0]", f"image file not found: {relative} (in {places})")
                continue
        doc_id = record.get("doc_id")
        values = {
            "id": f"{file.stem}-{row}" if doc_id in (None, "") else doc_id,
            "source": f"mini_o3/{record.get('data_source')}",
            "question": question,
            "options": options,
            "answer": record.get("solution"),
            "image": image if image is not None else relative,
        }
        yield RawRow(file, row, values, _MINI_O3_FIELDS)


def _cof_question(record: dict[str, Any]) -> tuple[str | None, str]:
    """The text of a CoF row's question and the field it came from: `extra_info.question`, else the last user turn."""
    text = (record.get("extra_info") or {}).get("question")
    if isinstance(text, str) and text.strip():
        return text, "extra_info.question"
    users = [m for m in record.get("prompt") or [] if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return None, "prompt"
    return message_text(users[-1]), "prompt"


def _cof_image(value: Any, folder: Path) -> Any:
    """A CoF `images[i]` entry as `data.benchmarks` checks it: a string is a path (never base64), relative to `folder`."""
    if isinstance(value, dict):
        if "image" in value:  # verl's {"image": ...}; the value itself may be a {bytes, path} struct
            return _cof_image(value["image"], folder)
        value = value.get("bytes") or value.get("path")  # an HF image struct, DeepEyes-style
    if isinstance(value, str) and value:
        return folder / value.removeprefix("file://")  # an absolute path stays absolute
    return value


def read_cof_rl(file: Path) -> Iterator[RawRow]:
    expect_file(file, "a Chain-of-Focus RL parquet file, e.g. train.parquet, with its images unzipped beside it")
    for row, record in enumerate(parquet_records(file)):
        text, question_field = _cof_question(record)
        question, options = cof_question(text) if isinstance(text, str) else (None, [])
        values = {
            "id": f"{file.stem}-{row}",
            "source": f"cof/{record.get('data_source')}",
            "question": question,
            "options": options,
            "answer": (record.get("reward_model") or {}).get("ground_truth"),
            "image": _cof_image((record.get("images") or [None])[0], file.parent),
        }
        fields = {"question": question_field, "answer": "reward_model.ground_truth", "image": "images[0].image"}
        yield RawRow(file, row, values, fields)
