"""Evaluation sets (and the RL sets of `data.rl_sets`) by name, read from the files a user downloads into
`data.rows.TASK_FEATURES`, so a benchmark row goes through the agent exactly like a training row; `source` is the
reporting group (`vstar/direct_attributes`, `hrbench_4k/single`, ...). Layouts: docs/evaluation.md and docs/data.md.

Every row is validated first: a missing or unreadable image (checked by its header only: one that fails to decode
later is a scored failure), a missing question or answer, an answer that is not one of the options, or a duplicate id
raises `BadRowError` naming the file, the row (0-based record index) and the field; with `skip_bad_rows=True` the row
is skipped, logged and returned by `read_benchmark`."""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
from PIL import Image

from data.questions import option_text, split_options
from data.rl_sets import read_cof_rl, read_deepeyes, read_mini_o3
from data.rows import TASK_FEATURES, BadRowError, RawRow, expect_file, parquet_records
from data.synthetic import build_synthetic
from data.task import OPTION_LETTERS, build_prompt, parse_choice

logger = logging.getLogger(__name__)

BENCHMARKS = ("vstar", "hrbench", "mme_realworld", "synthetic", "deepeyes", "mini_o3", "cof_rl")
SYNTHETIC_EVAL_ROWS = 32  # the test split generated when no synthetic folder is given (~0.35 s a row to draw)


def _image_cell(value: Any) -> dict[str, Any]:
    """The `image` column value for `value` (a file path, raw or base64 bytes, or a `{"bytes": ...}` struct), once
    its header parses; raises ValueError (or OSError) saying what is wrong."""
    if isinstance(value, dict):  # parquet image structs: DeepEyes' images[i], HF Image columns
        value = value.get("bytes")
    if value is None or value == "":
        raise ValueError("missing")
    if isinstance(value, Path):
        if not value.is_file():
            raise ValueError(f"image file not found: {value}")
        with Image.open(value):  # opening parses the header: enough to catch empty and non-image files
            pass
        return {"bytes": None, "path": str(value)}
    data = base64.b64decode(value, validate=True) if isinstance(value, str) else bytes(value)
    with Image.open(io.BytesIO(data)):
        pass
    return {"bytes": data, "path": None}


def _validate(raw: RawRow, seen_ids: set[str]) -> dict[str, Any]:
    """The dataset row for `raw`, or BadRowError for its first unusable field."""
    values = raw.values

    def bad(column: str, reason: str) -> BadRowError:
        return BadRowError(raw.file, raw.row, raw.fields.get(column, column), reason)

    row_id = values.get("id")
    if row_id in (None, ""):
        raise bad("id", "missing")
    if str(row_id) in seen_ids:
        raise bad("id", f"duplicate id {row_id!r}")
    question, options, answer = values.get("question"), values.get("options") or [], values.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise bad("question", "missing")
    if answer is None or not str(answer).strip():
        raise bad("answer", "missing")
    if options and parse_choice(str(answer), options) is None:
        raise bad("answer", f"{answer!r} is not one of the {len(options)} options")
    try:
        image = _image_cell(values.get("image"))
    except (ValueError, OSError, Image.DecompressionBombError) as err:
        # bad base64 is a ValueError and an unreadable image an OSError; an image over PIL's MAX_IMAGE_PIXELS is a
        # DecompressionBombError (raise that limit to read such a benchmark)
        raise bad("image", str(err) or type(err).__name__) from err
    seen_ids.add(str(row_id))
    return {
        "id": str(row_id),
        "source": values["source"],
        "prompt": build_prompt(question, options),
        "image": image,
        "answer": str(answer).strip(),
        "options": list(options),
        "target_bbox": values.get("target_bbox"),
        "target_label": values.get("target_label"),
    }


# ------------------------------------------------------------------------------------------------------ readers
_VSTAR_FIELDS = {"id": "question_id", "question": "text", "answer": "label", "image": "image"}
_HRBENCH_FIELDS = {"id": "index", "question": "question", "answer": "answer", "image": "image"}
_MME_FIELDS = {"id": "Question_id", "question": "Text", "answer": "Ground truth", "image": "Image"}
_MME_LITE_FIELDS = {"id": "index", "question": "question", "answer": "answer", "image": "bytes"}


def _read_vstar(root: Path) -> Iterator[RawRow | BadRowError]:
    questions = expect_file(
        root / "test_questions.jsonl",
        "the V* folder holding direct_attributes/, relative_position/, test_questions.jsonl",
    )
    with questions.open(encoding="utf-8") as lines:
        for row, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                yield BadRowError(questions, row, "(line)", f"not JSON: {err}")
                continue
            question, options = split_options(record["text"]) if isinstance(record.get("text"), str) else (None, [])
            image = root / record["image"] if record.get("image") else None
            values = {
                "id": record.get("question_id"),
                "source": f"vstar/{record.get('category')}",
                "question": question,
                "options": options,
                "answer": record.get("label"),
                "image": image,
            }
            if image is not None and image.with_suffix(".json").is_file():
                try:
                    values.update(_vstar_target(image.with_suffix(".json")))
                except (ValueError, KeyError, TypeError) as err:
                    yield BadRowError(image.with_suffix(".json"), 0, "bbox", f"unreadable target annotation: {err!r}")
                    continue
            yield RawRow(questions, row, values, _VSTAR_FIELDS)


def _vstar_target(annotation: Path) -> dict[str, Any]:
    """The target box (x1, y1, x2, y2 around all named objects) and label from V*'s per-image annotation."""
    record = json.loads(annotation.read_text(encoding="utf-8"))
    boxes = [(x, y, x + w, y + h) for x, y, w, h in record["bbox"]]  # V* stores x, y, width, height
    union = [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]
    return {"target_bbox": [round(v) for v in union], "target_label": " and ".join(record["target_object"])}


def _tsv_rows(file: Path) -> Iterator[dict[str, str]]:
    """Rows of a TSV file with a header line, as VLMEvalKit writes them (pandas' quoting), streamed."""
    csv.field_size_limit(sys.maxsize)  # a base64 8K image is far over csv's 128 kB default field limit
    with file.open(encoding="utf-8", newline="") as lines:
        yield from csv.DictReader(lines, delimiter="\t")


def _read_hrbench(file: Path) -> Iterator[RawRow]:
    expect_file(file, "an HR-Bench file: hr_bench_4k.tsv, hr_bench_8k.tsv or their .parquet versions")
    name = file.name.lower()
    variant = "hrbench_8k" if "8k" in name else "hrbench_4k" if "4k" in name else "hrbench"
    records = parquet_records(file) if file.suffix == ".parquet" else _tsv_rows(file)
    for row, record in enumerate(records):
        options = []
        for letter in OPTION_LETTERS:
            if record.get(letter) in (None, ""):
                break
            options.append(str(record[letter]).strip())
        values = {
            "id": record.get("index"),
            "source": f"{variant}/{record.get('category')}",
            "question": record.get("question"),
            "options": options,
            "answer": record.get("answer"),
            "image": record.get("image"),
        }
        yield RawRow(file, row, values, _HRBENCH_FIELDS)


def _read_mme_realworld(path: Path) -> Iterator[RawRow]:
    if path.is_dir() and (path / "data").is_dir():
        yield from _read_mme_realworld_lite(path / "data")
        return
    file = path if path.is_file() else path / "MME_RealWorld.json"
    expect_file(
        file, "the MME-RealWorld folder holding MME_RealWorld.json and its images, or the Lite folder with data/"
    )
    for row, record in enumerate(json.loads(file.read_text(encoding="utf-8"))):
        values = {
            "id": record.get("Question_id"),
            "source": f"mme_realworld/{record.get('Task')}/{record.get('Subtask')}/{record.get('Category')}",
            "question": record.get("Text"),
            "options": [option_text(c) for c in record.get("Answer choices") or []],
            "answer": record.get("Ground truth"),
            "image": file.parent / record["Image"] if record.get("Image") else None,
        }
        yield RawRow(file, row, values, _MME_FIELDS)


def _read_mme_realworld_lite(data: Path) -> Iterator[RawRow]:
    files = sorted(data.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no *.parquet in {data}; expected the MME-RealWorld-Lite folder's data/ files")
    for file in files:
        for row, record in enumerate(parquet_records(file)):
            category = str(record.get("category") or "")
            # lmms-eval's split of the Lite `category`: the task from its text, the subtask after the last "/"
            task = "Perception" if "perception" in category.lower() else "Reasoning"
            values = {
                "id": record.get("index"),
                "source": f"mme_realworld_lite/{task}/{category.split('/')[-1]}/{record.get('l2-category')}",
                "question": record.get("question"),
                "options": [option_text(c) for c in record.get("multi-choice options") or []],
                "answer": record.get("answer"),
                "image": record.get("bytes"),
            }
            yield RawRow(file, row, values, _MME_LITE_FIELDS)


_READERS = {
    "vstar": _read_vstar,
    "hrbench": _read_hrbench,
    "mme_realworld": _read_mme_realworld,
    "deepeyes": read_deepeyes,
    "mini_o3": read_mini_o3,
    "cof_rl": read_cof_rl,
}


def load_saved_split(path: str | os.PathLike, split: str) -> datasets.Dataset:
    """One split of a `save_to_disk` folder (a `DatasetDict`, or a single `Dataset` taken as that split)."""
    loaded = datasets.load_from_disk(os.fspath(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{path} has splits {list(loaded)}, not {split!r}")
        return loaded[split]
    return loaded


def _synthetic(path: str | os.PathLike | None, split: str | None, rows: int | None = None) -> datasets.Dataset:
    """The synthetic benchmark: a `save_to_disk` folder, or a freshly generated test split (never a training one) of
    `SYNTHETIC_EVAL_ROWS` rows, or only its first `rows`: each row is drawn from its own index, so they are the same
    rows, and an evaluation with a small `limit` does not draw (and PNG-encode) the rest."""
    if path is None:
        n = SYNTHETIC_EVAL_ROWS if rows is None else min(rows, SYNTHETIC_EVAL_ROWS)
        return build_synthetic(n, seed=0, split=split or "test")
    return load_saved_split(path, split or "test")


# -------------------------------------------------------------------------------------------------------- API
def read_benchmark(
    name: str,
    path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    split: str | None = None,
    skip_bad_rows: bool = False,
    rows: int | None = None,
) -> tuple[datasets.Dataset, list[BadRowError]]:
    """`load_benchmark`, also returning the rows it skipped (empty unless `skip_bad_rows`). `path` may list several
    files of the format, read in turn (ids must stay unique across them). `rows`: how many of the first rows the
    caller will read (its `limit`); only the generated synthetic split uses it, to draw no more."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {list(BENCHMARKS)}")
    paths = [path] if path is None or isinstance(path, str | os.PathLike) else list(path)
    if name == "synthetic":  # generated or saved by this repo: nothing third-party to validate
        if len(paths) > 1:
            raise ValueError(f"the synthetic benchmark reads one saved folder, not {len(paths)} paths")
        return _synthetic(paths[0], split, rows), []
    if not paths or paths[0] is None:
        raise ValueError(f"benchmark {name!r} reads local files: pass the path you downloaded it to (data_path)")
    rows, skipped, seen_ids = [], [], set()
    for raw in (raw for path in paths for raw in _READERS[name](Path(path))):
        try:
            if isinstance(raw, BadRowError):
                raise raw
            rows.append(_validate(raw, seen_ids))
        except BadRowError as err:
            if not skip_bad_rows:
                raise
            logger.warning("skipping bad row: %s", err)
            skipped.append(err)
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))}: no usable {name} rows ({len(skipped)} skipped)")
    return datasets.Dataset.from_list(rows, features=TASK_FEATURES), skipped


def load_benchmark(
    name: str, path: str | os.PathLike | None = None, *, split: str | None = None, skip_bad_rows: bool = False
) -> datasets.Dataset:
    """Benchmark `name` (one of `BENCHMARKS`) from its downloaded files at `path`, as a validated `datasets.Dataset`.

    `split` only applies to formats that have splits (synthetic `save_to_disk` folders; default "test"). A bad row
    raises `BadRowError`, or is skipped and logged with `skip_bad_rows=True` (`read_benchmark` also returns them).
    """
    return read_benchmark(name, path, split=split, skip_bad_rows=skip_bad_rows)[0]
