"""Benchmark readers: the files a user downloads, read into the columns training uses.

`load_benchmark(name, path)` returns a `datasets.Dataset` with the columns of `data.synthetic.TASK_FEATURES`, so a
benchmark row goes through the agent exactly like a training row: `prompt` is built by `task.build_prompt` from the
bare question and its options (the benchmark's own option list and answer instruction are stripped, so prompts look
exactly like training prompts), `answer` is the option letter for multiple choice, and `source` is the reporting
group (`vstar/direct_attributes`, `hrbench_4k/single`, `mme_realworld/Perception/Monitoring/...`).

Layouts (see docs/evaluation.md for where each comes from and what was verified):

- `vstar`: the V* folder holding `direct_attributes/`, `relative_position/` and `test_questions.jsonl`
  (`image`, `text`, `category`, `question_id`, `label`); each image's `<name>.json` (`target_object`, `bbox` as
  x, y, w, h) gives the target box and label shown in the report.
- `hrbench`: one HR-Bench file, `hr_bench_4k.tsv` / `hr_bench_8k.tsv` or the parquet twins (`index`, `question`,
  `A`..`D`, `answer`, `category` single/cross, `cycle_category`, `image` as base64).
- `mme_realworld`: the folder holding `MME_RealWorld.json` and its image folders (or that JSON file), or the Lite
  folder holding `data/*.parquet` (lmms-eval's MME-RealWorld-lite: `index`, `question`, `multi-choice options`,
  `answer`, `category`, `l2-category`, `bytes` as base64).
- `deepeyes`: one DeepEyes-47k training parquet (`data_source`, `prompt`, `images[{bytes}]`,
  `reward_model.ground_truth`, `extra_info.question`), for RL.
- `mini_o3`: one Mini-o3 RL JSON list (`VisualProbe_train/train.json`, `DeepEyes_train_4K/train.json`,
  `VisualProbe_{Easy,Medium,Hard}/val.json`), or a folder holding `train.json`; records `images` (relative paths),
  `doc_id`, `problem` ("<image>\n..."), `solution`, `data_source`. A relative image path resolves against the JSON
  file's folder, else against that folder's parent (Mini-o3's `BASE_IMAGE_DIR`, which holds
  `VisualProbe_train/train.json`): the first that holds the file wins. The id is `doc_id`, or `<file stem>-<row>` for
  a record without one. For RL; the val files are evaluation sets in the same layout.
- `cof_rl`: one Chain-of-Focus RL parquet (`train.parquet`, `images.zip` unzipped beside it): `prompt`
  ([system, user]), `images[{"image": ...}]` (a path relative to the parquet's folder or a `file://` URL, bytes, or a
  `{bytes, path}` struct), `reward_model.ground_truth`, `data_source`, `extra_info.question` (the question; without
  it, the user turn less its `<image>` tag and CoF's instructions), for RL.
- `synthetic`: a `save_to_disk` folder, or nothing: then a small test split is generated.

Every row is validated before the dataset is built: a missing or unreadable image, a missing question or answer, an
answer that is not one of the options, or a duplicate id raises `BadRowError` naming the file, the row (0-based
record index) and the field; with `skip_bad_rows=True` the row is skipped, logged and returned by `read_benchmark`.
Images are checked by their header only; one that fails to decode later is a scored failure of that sample.

Each benchmark's scoring rule lives here too, beside its reader: `score_answer` (training's rule everywhere but
MME-RealWorld, whose reference scorer is looser: `mme_choice`) and `benchmark_metrics` (the breakdowns each benchmark
reports: HR-Bench's single/cross mean, MME-RealWorld's per task and subtask).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import pyarrow.parquet as pq
from PIL import Image

from data.synthetic import TASK_FEATURES, build_synthetic
from data.task import OPTION_LETTERS, build_prompt, is_correct, message_text, parse_choice

logger = logging.getLogger(__name__)

BENCHMARKS = ("vstar", "hrbench", "mme_realworld", "synthetic", "deepeyes", "mini_o3", "cof_rl")
SYNTHETIC_EVAL_ROWS = 32  # the test split generated when no synthetic folder is given (~0.35 s a row to draw)

# "(A) red" option lines, as V* embeds them in its question text and MME-RealWorld writes its answer choices.
_OPTION = re.compile(r"^\s*\(([A-H])\)\s*(.*?)\s*$")


class BadRowError(ValueError):
    """A benchmark row that cannot be evaluated. The message names the file, the row and the field to fix."""

    def __init__(self, file: str | os.PathLike, row: int, field: str, reason: str):
        self.file, self.row, self.field, self.reason = str(file), row, field, reason
        super().__init__(f"{file}: row {row}: field {field!r}: {reason}")


class _Raw(NamedTuple):
    """One row as read, before validation: `values` uses our column names, `fields` maps them to the file's."""

    file: Path
    row: int
    values: dict[str, Any]
    fields: dict[str, str]


# ------------------------------------------------------------------------------------------------------ helpers
def split_options(text: str) -> tuple[str, list[str]]:
    """Split a question that embeds "(A) ..." option lines into the bare question and the option texts.

    Whatever follows the options (V*'s "Answer with the option's letter from the given choices directly.") is
    dropped: training prompts carry their own instruction (`task.USER_SUFFIX`). Text without option lines comes back
    stripped, with no options.
    """
    lines = text.strip().splitlines()
    first = next((i for i, line in enumerate(lines) if (m := _OPTION.match(line)) and m.group(1) == "A"), None)
    if first is None:
        return text.strip(), []
    options: list[str] = []
    for letter, line in zip(OPTION_LETTERS, lines[first:]):
        match = _OPTION.match(line)
        if match is None or match.group(1) != letter:
            break
        options.append(match.group(2))
    return "\n".join(lines[:first]).strip(), options


def _option_text(choice: str) -> str:
    """An option without its letter: "(B) 457" -> "457"; text without a letter prefix is kept."""
    match = _OPTION.match(choice)
    return match.group(2) if match else choice.strip()


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


def _validate(raw: _Raw, seen_ids: set[str]) -> dict[str, Any]:
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


def _expect(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; expected {what}")
    return path


def _parquet_rows(file: Path) -> Iterator[dict[str, Any]]:
    """Rows of a parquet file, a batch at a time: benchmark files embed their images."""
    for batch in pq.ParquetFile(file).iter_batches(batch_size=64):
        yield from batch.to_pylist()


def _tsv_rows(file: Path) -> Iterator[dict[str, str]]:
    """Rows of a TSV file with a header line, as VLMEvalKit writes them (pandas' quoting), streamed."""
    csv.field_size_limit(sys.maxsize)  # a base64 8K image is far over csv's 128 kB default field limit
    with file.open(encoding="utf-8", newline="") as lines:
        yield from csv.DictReader(lines, delimiter="\t")


# ------------------------------------------------------------------------------------------------------ readers
_VSTAR_FIELDS = {"id": "question_id", "question": "text", "answer": "label", "image": "image"}


def _read_vstar(root: Path) -> Iterator[_Raw | BadRowError]:
    questions = _expect(
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
            yield _Raw(questions, row, values, _VSTAR_FIELDS)


def _vstar_target(annotation: Path) -> dict[str, Any]:
    """The target box (x1, y1, x2, y2 around all named objects) and label from V*'s per-image annotation."""
    record = json.loads(annotation.read_text(encoding="utf-8"))
    boxes = [(x, y, x + w, y + h) for x, y, w, h in record["bbox"]]  # V* stores x, y, width, height
    union = [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]
    return {"target_bbox": [round(v) for v in union], "target_label": " and ".join(record["target_object"])}


_HRBENCH_FIELDS = {"id": "index", "question": "question", "answer": "answer", "image": "image"}


def _read_hrbench(file: Path) -> Iterator[_Raw]:
    _expect(file, "an HR-Bench file: hr_bench_4k.tsv, hr_bench_8k.tsv or their .parquet versions")
    name = file.name.lower()
    variant = "hrbench_8k" if "8k" in name else "hrbench_4k" if "4k" in name else "hrbench"
    records = _parquet_rows(file) if file.suffix == ".parquet" else _tsv_rows(file)
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
        yield _Raw(file, row, values, _HRBENCH_FIELDS)


_MME_FIELDS = {"id": "Question_id", "question": "Text", "answer": "Ground truth", "image": "Image"}
_MME_LITE_FIELDS = {"id": "index", "question": "question", "answer": "answer", "image": "bytes"}


def _read_mme_realworld(path: Path) -> Iterator[_Raw]:
    if path.is_dir() and (path / "data").is_dir():
        yield from _read_mme_realworld_lite(path / "data")
        return
    file = path if path.is_file() else path / "MME_RealWorld.json"
    _expect(file, "the MME-RealWorld folder holding MME_RealWorld.json and its images, or the Lite folder with data/")
    for row, record in enumerate(json.loads(file.read_text(encoding="utf-8"))):
        values = {
            "id": record.get("Question_id"),
            "source": f"mme_realworld/{record.get('Task')}/{record.get('Subtask')}/{record.get('Category')}",
            "question": record.get("Text"),
            "options": [_option_text(c) for c in record.get("Answer choices") or []],
            "answer": record.get("Ground truth"),
            "image": file.parent / record["Image"] if record.get("Image") else None,
        }
        yield _Raw(file, row, values, _MME_FIELDS)


def _read_mme_realworld_lite(data: Path) -> Iterator[_Raw]:
    files = sorted(data.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no *.parquet in {data}; expected the MME-RealWorld-Lite folder's data/ files")
    for file in files:
        for row, record in enumerate(_parquet_rows(file)):
            category = str(record.get("category") or "")
            # lmms-eval's split of the Lite `category`: the task from its text, the subtask after the last "/"
            task = "Perception" if "perception" in category.lower() else "Reasoning"
            values = {
                "id": record.get("index"),
                "source": f"mme_realworld_lite/{task}/{category.split('/')[-1]}/{record.get('l2-category')}",
                "question": record.get("question"),
                "options": [_option_text(c) for c in record.get("multi-choice options") or []],
                "answer": record.get("answer"),
                "image": record.get("bytes"),
            }
            yield _Raw(file, row, values, _MME_LITE_FIELDS)


_DEEPEYES_FIELDS = {"question": "extra_info.question", "answer": "reward_model.ground_truth", "image": "images[0]"}


def _read_deepeyes(file: Path) -> Iterator[_Raw]:
    _expect(file, "a DeepEyes-47k parquet file, e.g. data_v0.8_visual_toolbox_v2.parquet")
    for row, record in enumerate(_parquet_rows(file)):
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
        yield _Raw(file, row, values, _DEEPEYES_FIELDS)


_MINI_O3_FIELDS = {"id": "doc_id", "question": "problem", "answer": "solution", "image": "images[0]"}


def _read_mini_o3(path: Path) -> Iterator[_Raw | BadRowError]:
    file = path / "train.json" if path.is_dir() else path
    _expect(file, "a Mini-o3 RL JSON file, e.g. VisualProbe_train/train.json, or the folder holding train.json")
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
        # the training prompt inserts the image itself; a literal "<image>" tag would only be noise
        question, options = mini_o3_question(text) if isinstance(text, str) else (None, [])
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
        yield _Raw(file, row, values, _MINI_O3_FIELDS)


# "A. red" / "A: red" / "A) red" option lines, the other way the zoom-trajectory sets write options (Thyme, CoF's
# "A." questions); an "Options:" line before them is part of the block
_LETTER_OPTION = re.compile(r"^\s*([A-H])[.:)]\s+(.*?)\s*$")
_OPTIONS_HEADER = re.compile(r"^\s*(?:options|choices)\s*:?\s*$", re.IGNORECASE)
_QUESTION_PREFIX = re.compile(r"^\s*Question:\s*", re.IGNORECASE)


def dataset_question(
    text: str, instructions: Sequence[str] = (), cut_from: Sequence[str] = ()
) -> tuple[str, list[str]]:
    """The bare question and its options from a dataset's own user turn, so a prompt is ours alone (`build_prompt`)
    and the SFT and RL readers of one dataset ask the same words.

    `<image>` tags and a leading "Question:" are removed; the text from the first of `cut_from` on is dropped (a
    dataset's trailing format block, e.g. Thyme's "### User Image Path"), and so is every line that starts with one of
    `instructions` (its answer and tool instructions); then the options are split off: "(A) ..." lines
    (`split_options`), else "A. ..." lines (two or more, in letter order, an "Options:" line before them dropped).
    """
    text = text.replace("<image>", "")
    cuts = [text.find(marker) for marker in cut_from if marker in text]
    text = _QUESTION_PREFIX.sub("", text[: min(cuts)] if cuts else text)
    lines = [line for line in text.splitlines() if not line.strip().startswith(tuple(instructions))]
    question, options = split_options("\n".join(lines))
    if options:
        return question, options
    lines = question.splitlines()
    first = next((i for i, line in enumerate(lines) if (m := _LETTER_OPTION.match(line)) and m.group(1) == "A"), None)
    if first is not None:
        letters = []
        for letter, line in zip(OPTION_LETTERS, lines[first:]):
            match = _LETTER_OPTION.match(line)
            if match is None or match.group(1) != letter:
                break
            letters.append(match.group(2))
        if len(letters) >= 2:
            head = lines[:first]
            if head and _OPTIONS_HEADER.match(head[-1]):
                head = head[:-1]
            return "\n".join(head).strip(), letters
    return question.strip(), []


def mini_o3_question(problem: str) -> tuple[str, list[str]]:
    """A Mini-o3 question (the RL `problem`, or the cold start's first human turn: the same text) and its options."""
    return dataset_question(problem)


# CoF's prepare_zoomin_data.py builds the user turn as "<image> Question: {question}" + an answer instruction + its
# tool instruction (USER_PROMPT); its SFT set's user turns are written the same way. These are cut off, so the prompt
# is ours alone, the same words for `cof_rl` and the `cof_sft` converter (`data.converters`).
COF_INSTRUCTIONS = ("Answer the question using", "Answer with the option's letter", "Think in the mind first")


def cof_question(text: str) -> tuple[str, list[str]]:
    """A CoF question (`extra_info.question`, or a user turn as CoF writes it) and its options."""
    return dataset_question(text, COF_INSTRUCTIONS)


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
    """A CoF `images[i]` entry as `_image_cell` takes it: a string is a path (never base64), relative to `folder`."""
    if isinstance(value, dict):
        if "image" in value:  # verl's {"image": ...}; the value itself may be a {bytes, path} struct
            return _cof_image(value["image"], folder)
        value = value.get("bytes") or value.get("path")  # an HF image struct, DeepEyes-style
    if isinstance(value, str) and value:
        return folder / value.removeprefix("file://")  # an absolute path stays absolute
    return value


def _read_cof_rl(file: Path) -> Iterator[_Raw]:
    _expect(file, "a Chain-of-Focus RL parquet file, e.g. train.parquet, with its images unzipped beside it")
    for row, record in enumerate(_parquet_rows(file)):
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
        yield _Raw(file, row, values, fields)


_READERS = {
    "vstar": _read_vstar,
    "hrbench": _read_hrbench,
    "mme_realworld": _read_mme_realworld,
    "deepeyes": _read_deepeyes,
    "mini_o3": _read_mini_o3,
    "cof_rl": _read_cof_rl,
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
    path: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    skip_bad_rows: bool = False,
    rows: int | None = None,
) -> tuple[datasets.Dataset, list[BadRowError]]:
    """`load_benchmark`, also returning the rows it skipped (empty unless `skip_bad_rows`). `rows`: how many of the
    first rows the caller will read (its `limit`); only the generated synthetic split uses it, to draw no more."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {list(BENCHMARKS)}")
    if name == "synthetic":  # generated or saved by this repo: nothing third-party to validate
        return _synthetic(path, split, rows), []
    if path is None:
        raise ValueError(f"benchmark {name!r} reads local files: pass the path you downloaded it to (data_path)")
    rows, skipped, seen_ids = [], [], set()
    for raw in _READERS[name](Path(path)):
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
        raise ValueError(f"{path}: no usable {name} rows ({len(skipped)} skipped)")
    return datasets.Dataset.from_list(rows, features=TASK_FEATURES), skipped


def load_benchmark(
    name: str, path: str | os.PathLike | None = None, *, split: str | None = None, skip_bad_rows: bool = False
) -> datasets.Dataset:
    """Benchmark `name` (one of `BENCHMARKS`) from its downloaded files at `path`, as a validated `datasets.Dataset`.

    `split` only applies to formats that have splits (synthetic `save_to_disk` folders; default "test"). A bad row
    raises `BadRowError`, or is skipped and logged with `skip_bad_rows=True` (`read_benchmark` also returns them).
    """
    return read_benchmark(name, path, split=split, skip_bad_rows=skip_bad_rows)[0]


# ------------------------------------------------------------------------------------------------------- scoring
_MME_PREFIXES = (
    "The best answer is", "The correct answer is", "The answer is", "The answer", "The best option is",
    "The correct option is", "Best answer:", "Best option:",
)  # fmt: skip


def mme_choice(prediction: str, options: Sequence[str]) -> int | None:
    """The option MME-RealWorld's reference scorer reads in `prediction` (`eval_your_results.py`,
    `extract_characters_regex`): the first capital A-E anywhere, once answer prefixes are removed; without one, the
    option whose "(X) text" contains the prediction. Looser than `task.parse_choice`, and kept so because the
    benchmark's published numbers use it."""
    text = prediction.strip()
    for prefix in _MME_PREFIXES:
        text = text.replace(prefix, "")
    letter = re.search(r"[ABCDE]", text)
    if letter is None:
        if len(text.split()) > 10:
            return None
        choices = [f"({OPTION_LETTERS[i]}) {option}".lower() for i, option in enumerate(options)]
        return next((i for i, choice in enumerate(choices) if text.lower() in choice), None)
    index = OPTION_LETTERS.index(letter.group())
    return index if index < len(options) else None


def score_answer(
    benchmark: str, prediction: str | None, answer: str, options: Sequence[str]
) -> tuple[bool, str | None]:
    """(correct, failure reason) of a final answer under the benchmark's rule.

    Every benchmark uses training's rule (`task.is_correct`: the option letter or the option's text, else normalised
    equality), except MME-RealWorld, whose reference scorer is looser (`mme_choice`). A multiple-choice answer that
    names no option is a failure; a missing answer is the agent's failure, already recorded.
    """
    if prediction is None:
        return False, None
    if not prediction.strip():
        return False, "empty <answer>"
    if not options:
        return is_correct(prediction, answer), None
    if benchmark == "mme_realworld":
        choice = mme_choice(prediction, options)
        correct = choice is not None and choice == parse_choice(answer, options)
    else:
        choice = parse_choice(prediction, options)
        correct = is_correct(prediction, answer, options)
    if choice is None:
        return False, f"answer outside the options: {prediction[:100]!r}"
    return correct, None


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def accuracy_by(records: Iterable[dict], key: Callable[[dict], str]) -> dict[str, float]:
    """Accuracy of `records` (dicts with a boolean `correct`) grouped by `key(record)`, in key order."""
    groups = defaultdict(list)
    for record in records:
        groups[key(record)].append(float(record["correct"]))
    return {name: mean(values) for name, values in sorted(groups.items())}


def benchmark_metrics(benchmark: str, records: Sequence[dict]) -> dict:
    """The breakdowns a benchmark's reference reports, from records carrying `source` and `correct`."""
    if benchmark == "hrbench":  # the reference reports each category and their mean
        by_category = accuracy_by(records, lambda r: r["source"].rsplit("/", 1)[-1])
        single, cross = by_category.get("single"), by_category.get("cross")
        return {"single": single, "cross": cross, "mean": mean([v for v in (single, cross) if v is not None])}
    if benchmark == "mme_realworld":  # sources are <variant>/<Task>/<Subtask>/<Category>
        return {
            "accuracy_by_task": accuracy_by(records, lambda r: r["source"].split("/")[1]),
            "accuracy_by_subtask": accuracy_by(records, lambda r: "/".join(r["source"].split("/")[1:3])),
        }
    return {}
