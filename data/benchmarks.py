"""Evaluation sets (and the RL sets of `data.rl_sets`) by name, read from the files a user downloads into
`data.rows.TASK_FEATURES`, so a benchmark row goes through the agent exactly like a training row; `source` is the
reporting group (`vstar/direct_attributes`, `hrbench_4k/single`, ...). Layouts: docs/evaluation.md and docs/data.md.

Every row is validated first: a missing or unreadable image (checked by its header only: one that fails to decode
later is a scored failure), a missing question or answer, an answer that is not one of the options, a duplicate id, a
record that is not an object or a line that is not UTF-8 JSON raises `BadRowError` naming the file, the row (0-based
record index) and the field; with `skip_bad_rows=True` the row is skipped, logged and returned by `read_benchmark`.
A file that is not its format as a whole (MME-RealWorld's JSON not a list, not UTF-8) is a ValueError naming it.
Messages show a row's values cut short (`data.quoting`): a hostile row must not make its own error message huge."""

from __future__ import annotations

import ast
import base64
import csv
import io
import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
from PIL import Image

from data.questions import option_text, split_options
from data.quoting import brief, cut
from data.rl_sets import read_cof_rl, read_deepeyes, read_mini_o3
from data.rows import TASK_FEATURES, BadRowError, RawRow, expect_file, parquet_records
from data.synthetic import build_synthetic
from data.task import OPTION_LETTERS, build_prompt, parse_choice

logger = logging.getLogger(__name__)

BENCHMARKS = (
    "vstar", "hrbench", "mme_realworld", "treebench", "visualprobe", "synthetic", "deepeyes", "mini_o3", "cof_rl",
)  # fmt: skip
SYNTHETIC_EVAL_ROWS = 32  # the test split generated when no synthetic folder is given (~0.35 s a row to draw)
MESSAGE_CHARS = 160  # of a value, a path or an error quoted in a bad row's message
INT32 = 2**31  # target_bbox is saved as int32 (`TASK_FEATURES`)


def _label(value: Any) -> str:
    """A text field of a row as a part of its `source` (a reporting group): a string as is, anything else previewed."""
    return value if isinstance(value, str) else brief(value)


def _image_cell(value: Any) -> dict[str, Any]:
    """The `image` column value for `value` (a file path, raw or base64 bytes, or a `{"bytes": ...}` struct), once
    its header parses; raises ValueError (or OSError) saying what is wrong."""
    if isinstance(value, dict):  # parquet image structs: DeepEyes' images[i], HF Image columns
        value = value.get("bytes")
    if value is None or value == "":
        raise ValueError("missing")
    if not isinstance(value, Path | str | bytes | bytearray | memoryview):
        # bytes(n) of a number would allocate n bytes, not read an image
        raise ValueError(f"not an image path, its bytes or base64: {brief(value)}")
    if isinstance(value, Path):
        if not value.is_file():
            raise ValueError(f"image file not found: {cut(str(value), MESSAGE_CHARS)}")
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
    if row_id is None or row_id == "":
        raise bad("id", "missing")
    if not isinstance(row_id, str | int | float):  # str() of a 1,000-deep list is a RecursionError
        raise bad("id", f"not a string or number: {brief(row_id)}")
    if str(row_id) in seen_ids:
        raise bad("id", f"duplicate id {brief(row_id)}")
    question, options, answer = values.get("question"), values.get("options") or [], values.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise bad("question", "missing")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise bad("answer", "missing")
    if not isinstance(answer, str | int | float):
        raise bad("answer", f"not a string or number: {brief(answer)}")
    if options and parse_choice(str(answer), options) is None:
        raise bad("answer", f"{brief(answer)} is not one of the {len(options)} options")
    try:
        image = _image_cell(values.get("image"))
    except (ValueError, OSError, Image.DecompressionBombError) as err:
        # bad base64 is a ValueError and an unreadable image an OSError; an image over PIL's MAX_IMAGE_PIXELS is a
        # DecompressionBombError (raise that limit to read such a benchmark)
        raise bad("image", cut(str(err), MESSAGE_CHARS) or type(err).__name__) from err
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
    with questions.open("rb") as lines:  # decoded line by line: one line that is not UTF-8 is one bad row
        for row, line in enumerate(lines):
            record = _json_line(questions, row, line)
            if isinstance(record, BadRowError):
                yield record
                continue
            question, options = split_options(record["text"]) if isinstance(record.get("text"), str) else (None, [])
            image = record.get("image")  # not a string: `_image_cell` says what it is
            image = root / image if isinstance(image, str) and image else image
            values = {
                "id": record.get("question_id"),
                "source": f"vstar/{_label(record.get('category'))}",
                "question": question,
                "options": options,
                "answer": record.get("label"),
                "image": image,
            }
            annotation = _annotation(image)
            if annotation is not None:
                try:
                    values.update(_vstar_target(annotation))
                except (ValueError, KeyError, TypeError, RecursionError) as err:
                    reason = f"unreadable target annotation of {questions.name} row {row}: {type(err).__name__}"
                    yield BadRowError(annotation, 0, "bbox", f"{reason}: {cut(str(err), MESSAGE_CHARS)}")
                    continue
            yield RawRow(questions, row, values, _VSTAR_FIELDS)


def _json_line(file: Path, row: int, line: bytes) -> dict[str, Any] | BadRowError:
    """The record on one line of a JSON-lines file, or the BadRowError saying why there is none."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return BadRowError(file, row, "(line)", f"not UTF-8: byte {err.start} of the line is {line[err.start]:#04x}")
    except RecursionError:
        return BadRowError(file, row, "(line)", "not JSON: nested too deep to parse")
    except ValueError as err:  # JSONDecodeError, or an integer past Python's digit limit
        return BadRowError(file, row, "(line)", f"not JSON: {cut(str(err), MESSAGE_CHARS)}")
    if not isinstance(record, dict):
        return BadRowError(file, row, "(row)", f"not a JSON object: {type(record).__name__}")
    return record


def _json_file(file: Path, expected: str) -> list:
    """The JSON list `file` holds; a file that is not one is a ValueError naming it (it has no rows to skip)."""
    try:
        records = json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{file}: not UTF-8 (byte {err.start}); expected {expected}") from err
    except RecursionError as err:
        raise ValueError(f"{file}: not JSON: nested too deep to parse; expected {expected}") from err
    except ValueError as err:
        raise ValueError(f"{file}: not JSON ({cut(str(err), MESSAGE_CHARS)}); expected {expected}") from err
    if not isinstance(records, list):
        raise ValueError(f"{file}: a JSON {type(records).__name__}, not {expected}")
    return records


def _annotation(image: Any) -> Path | None:
    """V*'s annotation of `image`, the .json beside it, if there is one."""
    if not isinstance(image, Path):
        return None
    try:
        annotation = image.with_suffix(".json")
        return annotation if annotation.is_file() else None
    except (OSError, ValueError):  # a name too long for the file system, or none (`_image_cell` then says so)
        return None


def _vstar_target(annotation: Path) -> dict[str, Any]:
    """The target box (x1, y1, x2, y2 around all named objects) and label from V*'s per-image annotation."""
    record = json.loads(annotation.read_text(encoding="utf-8"))
    boxes = []
    for box in record["bbox"]:  # V* stores x, y, width, height
        if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
            raise ValueError(f"a box that is not 4 numbers: {brief(box)}")
        x, y, w, h = box
        boxes.append((x, y, x + w, y + h))
    target = _union(boxes)
    labels = record["target_object"]
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"target_object is not a list of names: {brief(labels)}")
    return {"target_bbox": target, "target_label": " and ".join(labels)}


def _union(boxes: Sequence[Sequence[float]]) -> list[int]:
    """The box around `boxes` (x1, y1, x2, y2 each), rounded to pixels; a ValueError for none, a box that is not
    finite, or one past the int32 column."""
    if not boxes:
        raise ValueError("no box")
    union = [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]
    if not all(math.isfinite(v) for v in union):
        raise ValueError(f"a box that is not finite: {brief(union)}")
    target = [round(v) for v in union]
    if not all(-INT32 <= v < INT32 for v in target):  # the column is int32: saving it would fail after every row
        raise ValueError(f"a box past the int32 range: {brief(target)}")
    return target


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tsv_rows(file: Path) -> Iterator[dict[str, str]]:
    """Rows of a TSV file with a header line, as VLMEvalKit writes them (pandas' quoting), streamed."""
    csv.field_size_limit(sys.maxsize)  # a base64 8K image is far over csv's 128 kB default field limit
    # bytes that are not UTF-8 are kept as lone surrogates: that row's error (`_not_utf8`), not the end of the file
    with file.open(encoding="utf-8", errors="surrogateescape", newline="") as lines:
        reader = csv.DictReader(lines, delimiter="\t")
        try:
            yield from reader
        except csv.Error as err:
            raise ValueError(
                f"{file}: line {reader.line_num}: not a TSV file: {cut(str(err), MESSAGE_CHARS)}"
            ) from err


def _not_utf8(record: dict[Any, Any]) -> str | None:
    """The first column of a TSV row whose text was not UTF-8 (`_tsv_rows`), if any."""
    for column, value in record.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return cut(str(column).encode("utf-8", "backslashreplace").decode("utf-8"), MESSAGE_CHARS)
    return None


def _parquet_records(file: Path) -> Iterator[dict]:
    """`parquet_records`, whose errors (a truncated or non-parquet file) otherwise do not say which file."""
    try:
        yield from parquet_records(file)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{file}: not a readable parquet file: {cut(str(err), MESSAGE_CHARS)}") from err


def _lettered_options(record: dict[Any, Any]) -> list[str]:
    """The options of a TSV or parquet row with one column per letter (A, B, ...; HR-Bench's and VLMEvalKit's
    layout), up to the first letter left empty: missing, "" or a NaN (pandas' empty cell)."""
    options = []
    for letter in OPTION_LETTERS:
        value = record.get(letter)
        if value in (None, "") or (isinstance(value, float) and math.isnan(value)):
            break
        options.append(str(value).strip())
    return options


def _read_hrbench(file: Path) -> Iterator[RawRow]:
    expect_file(file, "an HR-Bench file: hr_bench_4k.tsv, hr_bench_8k.tsv or their .parquet versions")
    name = file.name.lower()
    variant = "hrbench_8k" if "8k" in name else "hrbench_4k" if "4k" in name else "hrbench"
    records = _parquet_records(file) if file.suffix == ".parquet" else _tsv_rows(file)
    for row, record in enumerate(records):
        column = _not_utf8(record)
        if column is not None:
            yield BadRowError(file, row, column, "not UTF-8 text")
            continue
        values = {
            "id": record.get("index"),
            "source": f"{variant}/{_label(record.get('category'))}",
            "question": record.get("question"),
            "options": _lettered_options(record),
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
    for row, record in enumerate(_json_file(file, "a JSON list of MME-RealWorld questions")):
        if not isinstance(record, dict):
            yield BadRowError(file, row, "(row)", f"not a JSON object: {type(record).__name__}")
            continue
        choices = record.get("Answer choices") or []
        if not _strings(choices):
            yield BadRowError(file, row, "Answer choices", f"not a list of strings: {brief(choices)}")
            continue
        image = record.get("Image")  # not a string: `_image_cell` says what it is
        parts = (_label(record.get(key)) for key in ("Task", "Subtask", "Category"))
        values = {
            "id": record.get("Question_id"),
            "source": "mme_realworld/" + "/".join(parts),
            "question": record.get("Text"),
            "options": [option_text(c) for c in choices],
            "answer": record.get("Ground truth"),
            "image": file.parent / image if isinstance(image, str) and image else image,
        }
        yield RawRow(file, row, values, _MME_FIELDS)


def _strings(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)


def _read_mme_realworld_lite(data: Path) -> Iterator[RawRow]:
    files = sorted(data.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no *.parquet in {data}; expected the MME-RealWorld-Lite folder's data/ files")
    for file in files:
        for row, record in enumerate(_parquet_records(file)):
            choices = record.get("multi-choice options") or []
            if not _strings(choices):
                yield BadRowError(file, row, "multi-choice options", f"not a list of strings: {brief(choices)}")
                continue
            category = _label(record.get("category") or "")
            # lmms-eval's split of the Lite `category`: the task from its text, the subtask after the last "/"
            task = "Perception" if "perception" in category.lower() else "Reasoning"
            values = {
                "id": record.get("index"),
                "source": f"mme_realworld_lite/{task}/{category.split('/')[-1]}/{_label(record.get('l2-category'))}",
                "question": record.get("question"),
                "options": [option_text(c) for c in choices],
                "answer": record.get("answer"),
                "image": record.get("bytes"),
            }
            yield RawRow(file, row, values, _MME_LITE_FIELDS)


def _read_treebench(file: Path) -> Iterator[RawRow | BadRowError]:
    """TreeBench as VLMEvalKit downloads it (`HaochenWang/TreeBench`'s TreeBench.tsv; `vlmeval/dataset/image_mcq.py`,
    class TreeBench): `index`, `image` (base64), `question`, options in columns A, B, ..., `answer` (a letter),
    `category` (`Perception/<subtask>` or `Reasoning/<subtask>`) and `target_instances` (a Python list of x1, y1, x2,
    y2 boxes, read as VLMEvalKit reads it: `ast.literal_eval`); the target box is the box around them."""
    expect_file(file, "TreeBench.tsv (VLMEvalKit's download of HaochenWang/TreeBench) or a .parquet of its columns")
    records = _parquet_records(file) if file.suffix == ".parquet" else _tsv_rows(file)
    fields = {
        "id": "index",
        "question": "question",
        "answer": "answer",
        "image": "image",
        "target_bbox": "target_instances",
    }
    for row, record in enumerate(records):
        column = _not_utf8(record)
        if column is not None:
            yield BadRowError(file, row, column, "not UTF-8 text")
            continue
        values = {
            "id": record.get("index"),
            "source": f"treebench/{_label(record.get('category'))}",
            "question": record.get("question"),
            "options": _lettered_options(record),
            "answer": record.get("answer"),
            "image": record.get("image"),
        }
        instances = record.get("target_instances")
        if instances not in (None, ""):
            try:
                boxes = ast.literal_eval(instances) if isinstance(instances, str) else instances
                if not isinstance(boxes, list | tuple) or not all(
                    isinstance(b, list | tuple) and len(b) == 4 and all(_is_number(v) for v in b) for b in boxes
                ):
                    raise ValueError(f"not a list of [x1, y1, x2, y2] boxes: {brief(boxes)}")
                if boxes:
                    values["target_bbox"] = _union(boxes)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
                yield BadRowError(file, row, "target_instances", cut(str(err), MESSAGE_CHARS) or type(err).__name__)
                continue
        yield RawRow(file, row, values, fields)


# Mini-o3's VisualProbe validation files under its BASE_IMAGE_DIR (README, "RL"), easiest first
VISUALPROBE_SPLITS = ("VisualProbe_Easy", "VisualProbe_Medium", "VisualProbe_Hard")


def _read_visualprobe(path: Path) -> Iterator[RawRow | BadRowError]:
    """VisualProbe as Mini-o3 releases it (its README: `${BASE_IMAGE_DIR}/VisualProbe_{Easy,Medium,Hard}/val.json`),
    each file a JSON list of `{"images": [path relative to BASE_IMAGE_DIR], "doc_id", "problem", "solution",
    "data_source"}`, read as Mini-o3's RL files are (`data.rl_sets.read_mini_o3`). `path`: BASE_IMAGE_DIR (every
    split there), one split's folder, or a val.json; ids are `<split folder>/<doc_id>`, sources
    `visualprobe/<split folder>`."""
    if path.is_dir() and any((path / split / "val.json").is_file() for split in VISUALPROBE_SPLITS):
        files = [path / split / "val.json" for split in VISUALPROBE_SPLITS if (path / split / "val.json").is_file()]
    else:
        files = [path / "val.json" if path.is_dir() else path]
        expect_file(
            files[0], "Mini-o3's BASE_IMAGE_DIR holding VisualProbe_{Easy,Medium,Hard}/val.json, or one of them"
        )
    for file in files:
        split = file.parent.name
        for raw in read_mini_o3(file):
            if isinstance(raw, RawRow):
                values = raw.values | {"id": f"{split}/{raw.values['id']}", "source": f"visualprobe/{split}"}
                raw = raw._replace(values=values)
            yield raw


_READERS = {
    "vstar": _read_vstar,
    "hrbench": _read_hrbench,
    "mme_realworld": _read_mme_realworld,
    "treebench": _read_treebench,
    "visualprobe": _read_visualprobe,
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
    for raw in (raw for path in paths for raw in _named(_READERS[name](Path(path)), path)):
        try:
            if isinstance(raw, BadRowError):
                raise raw
            try:
                rows.append(_validate(raw, seen_ids))
            except (TypeError, AttributeError, KeyError, IndexError, RecursionError, OverflowError) as err:
                # a value no check above foresaw: still this row's fault, so skippable
                raise BadRowError(
                    raw.file, raw.row, "(row)", f"{type(err).__name__}: {cut(str(err), MESSAGE_CHARS)}"
                ) from err
        except BadRowError as caught:
            err = _bounded(caught)
            if not skip_bad_rows:
                if err is caught:
                    raise
                raise err from None  # the original's message is the one too long to show
            logger.warning("skipping bad row: %s", err)
            skipped.append(err)
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))}: no usable {name} rows ({len(skipped)} skipped)")
    return datasets.Dataset.from_list(rows, features=TASK_FEATURES), skipped


def first_row(name: str, path: str | os.PathLike) -> dict[str, Any]:
    """The first row of benchmark `name` (a format of `BENCHMARKS` read from files) at `path`, validated as
    `read_benchmark` validates each row (its image's header parsed), without reading the rest: a check that a download
    is there and readable. Raises what reading it whole would raise there (BadRowError, ValueError, OSError), naming
    the file; a ValueError when it holds no row."""
    if name not in _READERS:
        raise ValueError(f"benchmark {name!r} is not read from files; known: {sorted(_READERS)}")
    for raw in _named(_READERS[name](Path(path)), path):
        if isinstance(raw, BadRowError):
            raise _bounded(raw)
        try:
            return _validate(raw, set())
        except (TypeError, AttributeError, KeyError, IndexError, RecursionError, OverflowError) as err:
            raise BadRowError(
                raw.file, raw.row, "(row)", f"{type(err).__name__}: {cut(str(err), MESSAGE_CHARS)}"
            ) from err
    raise ValueError(f"{path}: no {name} rows")


def _named(reader: Iterator[RawRow | BadRowError], path: Any) -> Iterator[RawRow | BadRowError]:
    """`reader`'s rows; an exception it did not turn into a bad row ends the file, so it becomes an error naming the
    file and where it stopped (a reader cannot resume after its row)."""
    last = None
    try:
        for raw in reader:
            last = raw.row
            yield raw
    except (TypeError, AttributeError, KeyError, IndexError, RecursionError, OverflowError, UnicodeError) as err:
        where = "at its first row" if last is None else f"after row {last}"
        raise ValueError(f"{path}: unreadable {where}: {type(err).__name__}: {cut(str(err), MESSAGE_CHARS)}") from err


def _bounded(err: BadRowError) -> BadRowError:
    """`err` with its field and reason cut short (the RL-set readers quote values whole)."""
    if len(err.field) <= MESSAGE_CHARS and len(err.reason) <= 2 * MESSAGE_CHARS:
        return err
    return BadRowError(err.file, err.row, cut(err.field, MESSAGE_CHARS), cut(err.reason, 2 * MESSAGE_CHARS))


def load_benchmark(
    name: str, path: str | os.PathLike | None = None, *, split: str | None = None, skip_bad_rows: bool = False
) -> datasets.Dataset:
    """Benchmark `name` (one of `BENCHMARKS`) from its downloaded files at `path`, as a validated `datasets.Dataset`.

    `split` only applies to formats that have splits (synthetic `save_to_disk` folders; default "test"). A bad row
    raises `BadRowError`, or is skipped and logged with `skip_bad_rows=True` (`read_benchmark` also returns them).
    """
    return read_benchmark(name, path, split=split, skip_bad_rows=skip_bad_rows)[0]
