"""What every release reader shares: the skip reasons, box geometry, reading records and their content parts (a copy
re-saved by `datasets` reads as the release: `without_nulls`, `part_value`), the record files, and the image cells."""

from __future__ import annotations

import base64
import binascii
import functools
import io
import itertools
import json
import math
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from PIL import Image

from data.quoting import brief, cut
from data.rows import Trajectory, parquet_records
from data.task import tag_contents

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in the original image's pixels

# Why a row was skipped; the converter's stats count every one.
SKIP_REASONS = {
    "malformed_call": "a call's JSON or code could not be parsed",
    "malformed_row": "the record is not in the format's shape (not an object, a field of another type) or its text "
    "cannot be read (not UTF-8, nested past the parser's depth, a number past Python's 4,300 digits)",
    "missing_image": "the row's original image, or a crop it ships, is missing, unreadable or over the image size cap",
    "outside_input": "an image path that leads outside --input (absolute, file://, ../, a symlink out): never read",
    "video": "the row's question shows a video (PixelReasoner): the zoom tool reads one image",
    "multi_image": "the row's question shows several images: the zoom tool reads one",
    "box_outside_image": "a call's box, composed into the original, is empty or leaves the image",
    "bad_source": "a call zooms on an image the trajectory has not produced yet",
    "unsupported_tool": "a tool other than the crop (search, frame selection, an image operation that is not a crop)",
    "unsupported_code": "code the reader does not evaluate (a loop, a function, coordinates it cannot compute)",
    "unread_code": "the release shows a new image after a code turn from which no crop was read",
    "slow_code": "reading the row's code took over the reader's time limit (`code_reader.CODE_SECONDS_PER_ROW`)",
    "image_count_mismatch": "the release shows a different number of images than the calls read (or than it ships)",
    "crop_mismatch": "a replayed crop disagrees with the crop the release ships (aspect ratio or content)",
    "empty_answer": "the row has no final answer",
    "empty_question": "the row has no question",
    "no_label": "no label could be derived for a call, and the dataset has none",
    "label_too_long": "the dataset's label is over the tool's limits",
    "too_many_calls": "more calls than the paired RL recipe's max_tool_calling_iterations (--max_calls): RL cuts it short",
    "unreadable_file": "a record file that cannot be read from a row on (a truncated parquet shard): counts files",
}
# A box may overshoot the image by this fraction of its side (rounding in the dataset's own code); more, and its
# coordinates are not in the frame the format says: skipped, not clamped into a wrong crop.
EDGE_TOLERANCE = 0.01
# An image file (on disk, in a zip, in base64) over this many bytes is skipped unread: far over any photo a release
# ships (a 4000 x 3000 PNG is ~25 MB), and a zip of a few MB can hold a member of gigabytes.
MAX_IMAGE_FILE_BYTES = 128 * 2**20
# A skip's detail is cut to this many characters: a message quoting a hostile row (a number of 400 digits, a
# structure nested 100,000 deep) stays one short line of stats.json and the summary.
MAX_SKIP_DETAIL = 400
# What a reader's code can raise on a row whose content is of a shape it does not expect (a field of another type, a
# number past a float's range, nesting past Python's recursion limit): the row is skipped as `malformed_row`, never the
# conversion lost.
ROW_ERRORS = (RecursionError, ArithmeticError, LookupError, TypeError, AttributeError, ValueError)


class SkipRow(Exception):
    """A row the converter leaves out; `reason` is a key of `SKIP_REASONS`, `where` names the file and row."""

    def __init__(self, reason: str, detail: str = "", where: str = ""):
        assert reason in SKIP_REASONS, reason
        detail = cut(detail, MAX_SKIP_DETAIL)
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail, self.where = reason, detail, where
        self.statement = ""  # for `unsupported_code`: the statement of the code the reader could not read

    def at(self, where: str) -> SkipRow:
        self.where = where
        return self


class LayoutError(ValueError):
    """The input is not in the layout `--format` names: raised at once, naming what was expected and found."""


def listed(record: dict, key: str, items: type | None = None) -> list:
    """`record[key]`, a list (missing: empty) of `items` where given; any other shape is `SkipRow("malformed_row")`
    (a string where messages should be, `images: 5`), not a reader failing on it."""
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SkipRow("malformed_row", f"{key} is of type {type(value).__name__}, not a list: {brief(value)}")
    if items is not None:
        for i, item in enumerate(value):
            if not isinstance(item, items):
                raise SkipRow("malformed_row", f"{key}[{i}] is of type {type(item).__name__}, not {items.__name__}")
    return value


# ------------------------------------------------------------------------------------------------- box geometry
def relative_to_pixels(box: Sequence[float], extent: Sequence[float]) -> tuple[float, float, float, float]:
    """A box relative [0, 1] to `extent` (x1, y1, x2, y2 in original pixels) in original pixels."""
    x1, y1, x2, y2 = extent
    w, h = x2 - x1, y2 - y1
    return x1 + box[0] * w, y1 + box[1] * h, x1 + box[2] * w, y1 + box[3] * h


def to_image_box(box: Sequence[float], size: tuple[int, int]) -> Box:
    """`box` (original pixels, floats) rounded outwards and checked against the image: a box that is empty or
    overshoots by more than `EDGE_TOLERANCE` of a side raises `SkipRow("box_outside_image")`; a smaller overshoot is
    cut to the image."""
    width, height = size
    x1, y1, x2, y2 = box
    slack_x, slack_y = EDGE_TOLERANCE * width, EDGE_TOLERANCE * height
    if x1 < -slack_x or y1 < -slack_y or x2 > width + slack_x or y2 > height + slack_y:
        raise SkipRow("box_outside_image", f"{[round(v, 1) for v in box]} in a {width}x{height} image")
    # Rounded to 1e-6 first: a composition's float noise (114.00000000000001) must not add a pixel.
    x1, y1, x2, y2 = (round(v, 6) for v in (x1, y1, x2, y2))
    x1, y1 = max(0, math.floor(x1)), max(0, math.floor(y1))
    x2, y2 = min(width, math.ceil(x2)), min(height, math.ceil(y2))
    if x2 <= x1 or y2 <= y1:
        raise SkipRow("box_outside_image", f"empty box {[round(v, 1) for v in box]}")
    return x1, y1, x2, y2


def numbers(value: Any, count: int = 4) -> list[float]:
    """`value` as `count` finite numbers, or `SkipRow("malformed_call")`."""
    if not isinstance(value, list | tuple) or len(value) != count:
        raise SkipRow("malformed_call", f"expected {count} numbers, got {brief(value)}")
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise SkipRow("malformed_call", f"expected numbers, got {brief(value)}") from None
    except OverflowError:  # an integer of 400 digits: no box in any image
        raise SkipRow("malformed_call", f"a number too large for a float in {brief(value)}") from None
    if any(not math.isfinite(v) for v in out):
        raise SkipRow("malformed_call", f"non-finite number in {brief(value)}")
    return out


# ------------------------------------------------------------------------------------------ text, records, parts
_THINK_TAG = re.compile(r"</?think>")
IMAGE_TAG = "<image>"
# The kinds a content part can be, by the key that holds its value (Qwen's message format: `{"type": "image",
# "image": ...}`; OpenAI's `image_url`); a part without `type` is of the one kind whose key it has.
PART_KINDS = {"text": "text", "image": "image", "image_url": "image", "video": "video"}


def thought_of(text: str) -> str:
    """The thought of an assistant turn (or of a stretch of one): its `<think>` text, else its text before the first
    call, code or answer tag, with no stray `<think>` or `</think>` left (Thyme's code sits inside one `<think>`)."""
    thoughts = tag_contents(text, "<think>", "</think>")
    text = thoughts[0] if thoughts else re.split(r"<tool_call>|<grounding>|<code>|<answer>", text, maxsplit=1)[0]
    return _THINK_TAG.sub("", text).strip()


def tool_calls(text: str) -> list[str]:
    """The payload of each `<tool_call>...</tool_call>` of `text`, in order (`tag_contents`)."""
    return tag_contents(text, "<tool_call>", "</tool_call>")


def without_nulls(value: Any) -> Any:
    """`value` with every null-valued key dropped, at any depth: a release that passed through `datasets` gives every
    record, message and content part every key of its column's schema, most of them null."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def part_value(part: Any) -> tuple[str, Any] | None:
    """A content part as (kind, value), its kind "text", "image" or "video", read from its `type` and that key's
    non-null value (a part without `type`, from the one key it has); None, ignored, for any other part."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    for key in [kind] if kind is not None else PART_KINDS:
        if key in PART_KINDS and part.get(key) is not None:
            return PART_KINDS[key], part[key]
    return None


def content_parts(content: Any) -> list[tuple[str, Any]]:
    """A message's content as (kind, value) pairs (`part_value`): a string is one text part, None is none."""
    if isinstance(content, str):
        return [("text", content)]
    parts = [part_value(part) for part in content] if isinstance(content, list) else []
    return [part for part in parts if part is not None]


def content_text(content: Any) -> str:
    return "".join(str(value) for kind, value in content_parts(content) if kind == "text")


def content_images(content: Any) -> int:
    """How many images a message's content shows: its image parts, and the `<image>` tags of its text (sharegpt's
    placeholders for the row's `images`, in order)."""
    parts = content_parts(content)
    return sum(kind == "image" for kind, _ in parts) + sum(
        str(value).count(IMAGE_TAG) for kind, value in parts if kind == "text"
    )


def json_call(text: str) -> dict:
    """The JSON object inside a call tag, or `SkipRow("malformed_call")`."""
    try:
        value = json.loads(text.strip())
    except json.JSONDecodeError as err:
        raise SkipRow("malformed_call", f"{err}: {text.strip()[:80]!r}") from None
    except RecursionError:
        raise SkipRow("malformed_call", f"nested too deep to parse: {text.strip()[:80]!r}") from None
    except ValueError as err:  # an integer past Python's 4,300 digits
        raise SkipRow("malformed_call", f"{err}: {text.strip()[:80]!r}") from None
    if not isinstance(value, dict):
        raise SkipRow("malformed_call", f"not an object: {text.strip()[:80]!r}")
    return value


# --------------------------------------------------------------------------------------------------------- files
# A JSON string, bracket or comma (`_array_items` splits a list on these alone), or a lone `"`: a string left open,
# after which `_json_tokens` looks for the marks alone; a `\ud800`-`\udfff` escape, the only way text that is valid
# UTF-8 can still hold a lone surrogate, which no dataset can store.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]|"', re.DOTALL)
_JSON_MARK = re.compile(r"[\[\]{},]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_END = object()


def _json_tokens(text: str, position: int) -> Iterator[re.Match]:
    """The JSON strings, brackets and commas of `text` from `position`, as `finditer` found them with `_JSON_TOKEN`
    less its lone quote (its pattern until issue 59), in linear time. That pattern tried a string again at every
    quote after one left open, each try reading to the end (quadratic on a flood of escaped quotes), though none can
    close: a try from a later quote reads on from it as the first try did, which took that quote as escaped."""
    for token in _JSON_TOKEN.finditer(text, position):
        if token.group() == '"':
            yield from _JSON_MARK.finditer(text, token.end())
            return
        yield token


def inside(root: Path, path: Path) -> bool:
    """Whether `path` stays in `root`, as written (no `..` out of it, no absolute path elsewhere) and with every link
    followed, decided before anything outside is opened."""
    root_abs = os.path.abspath(root)
    if os.path.commonpath([root_abs, os.path.abspath(path)]) != root_abs:
        return False
    return path.resolve().is_relative_to(root.resolve())  # a link loop or a NUL in the name raises


def _confined(root: Path, file: Path) -> None:
    """A record file or archive of `root` that leads out of it (a link) is no file of the release: `LayoutError`."""
    try:
        within = inside(root, file)
    except (OSError, RuntimeError, ValueError) as err:
        raise LayoutError(f"{file}: its links cannot be followed ({err})") from None
    if not within:
        raise LayoutError(f"{file} links to {os.path.realpath(file)}, outside --input {root}: nothing outside it is "
                          "read (copy the file in)")  # fmt: skip


def _json_text(data: bytes) -> tuple[str, bool]:
    """A JSON file's text in the encoding JSON allows it (UTF-8; UTF-16 and -32 by RFC 7159, told apart by
    `json.detect_encoding`), and whether a record of it may hold text that is not UTF-8: its invalid bytes (a latin-1
    file) are kept as lone surrogates (`surrogateescape`) for `_undecodable` to find in their rows, not lose the file.
    A UTF-16 or -32 file that does not decode raises `UnicodeDecodeError`: the file is unreadable."""
    encoding = json.detect_encoding(data)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        if not encoding.startswith("utf-8"):
            raise
        return data.decode(encoding, "surrogateescape"), True
    return text, _SURROGATE_ESCAPE.search(text) is not None


def _undecodable(record: Any) -> SkipRow | None:
    """A skip for a record holding text that is not UTF-8 (a lone surrogate: an invalid byte kept by `_json_text`, or
    an escape), else None."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(err.object[err.start])
        found = f"the byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"the lone surrogate {code:#x}"
        return SkipRow("malformed_row", f"text that is not UTF-8: {found} (a latin-1 file?)")
    except (RecursionError, ValueError) as err:
        return SkipRow("malformed_row", f"{type(err).__name__}: {err}")
    return None


def _parsed(text: str, where: str, path: Path, what: str) -> Any:
    """`text` parsed as JSON; text the parser cannot read for its limits (nested past its depth, an integer past
    Python's 4,300 digits) is a `SkipRow` in the record's place; text that is not JSON fails naming the file."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise LayoutError(f"{path}: {where} is not JSON ({err}); {what}") from None
    except RecursionError:
        return SkipRow("malformed_row", f"{where}: nested too deep to parse")
    except ValueError as err:
        return SkipRow("malformed_row", f"{where}: {err}")


def _array_items(text: str, path: Path, what: str) -> Iterator[Any]:
    """The records of the JSON list `text`, each parsed alone, the list split on its strings, brackets and commas: a
    record the parser cannot read (`_parsed`) is skipped in its place rather than the whole file lost."""
    first = len(text) - len(text.lstrip())
    if not text.startswith("[", first):
        raise LayoutError(f"{path}: expected a JSON list of records; {what}")
    depth, start, count = 0, first + 1, 0
    for token in _json_tokens(text, first):
        mark = token.group()
        if mark[0] == '"':
            continue
        if mark in "[{":
            depth += 1
        elif mark in "]}":
            depth -= 1
            if depth == 0:
                if text[start : token.start()].strip() or count:
                    yield _parsed(text[start : token.start()], f"record {count}", path, what)
                if text[token.end() :].strip():
                    raise LayoutError(f"{path}: not a JSON file (text after its list); {what}")
                return
        elif depth == 1:  # a comma between records
            yield _parsed(text[start : token.start()], f"record {count}", path, what)
            start, count = token.end(), count + 1
    raise LayoutError(f"{path}: not a JSON file (it ends inside its list); {what}")


def _json_list(path: Path, what: str) -> Iterator[Any] | None:
    """The records of a `.json` file holding a JSON list, or None for JSON Lines under that name (what `datasets`'
    `to_json` writes)."""
    text, suspect = _json_text(path.read_bytes())
    try:
        records = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and text.lstrip().startswith("{"):
            return None
        raise LayoutError(f"{path}: not a JSON file ({err}); {what}") from None
    except (RecursionError, ValueError):  # one record past the parser's limits: the others are read one by one
        if text.lstrip().startswith("{"):
            return None
        records = _array_items(text, path, what)
    else:
        if not isinstance(records, list):
            raise LayoutError(f"{path}: expected a JSON list of records, found a {type(records).__name__}; {what}")
    if not suspect:
        return iter(records)
    return (record if isinstance(record, SkipRow) else _undecodable(record) or record for record in records)


def _json_lines(path: Path, what: str) -> Iterator[Any]:
    """The records of a JSON Lines file, in UTF-8 line by line (a line that is not is skipped), or UTF-16 or -32 as a
    stream (a byte that does not decode raises: the file is unreadable from there)."""
    with path.open("rb") as stream:
        encoding = json.detect_encoding(stream.read(4))
        stream.seek(0)
        lines: Iterable[bytes | str] = stream
        if not encoding.startswith("utf-8"):
            lines = io.TextIOWrapper(stream, encoding=encoding)
        for number, line in enumerate(lines, start=1):
            if isinstance(line, bytes):
                try:
                    line = line.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as err:
                    found = f"the byte {line[err.start]:#04x}"
                    yield SkipRow("malformed_row", f"line {number}: text that is not UTF-8: {found} (a latin-1 file?)")
                    continue
            if line.strip():
                record = _parsed(line, f"line {number}", path, what)
                if _SURROGATE_ESCAPE.search(line) and not isinstance(record, SkipRow):
                    record = _undecodable(record) or record
                yield record


def _table_records(path: Path, what: str) -> Iterator[Any]:
    """The records of a parquet shard, a JSON list, or JSON Lines (`.jsonl`, or a `.json` file `datasets`' `to_json`
    wrote); a record whose text cannot be read (not UTF-8, past the parser's limits) comes as a `SkipRow` in its
    place; a file or line that is not JSON fails naming it."""
    if path.suffix == ".parquet":
        yield from parquet_records(path)
        return
    records = _json_list(path, what) if path.suffix == ".json" else None
    yield from records if records is not None else _json_lines(path, what)


def read_release(
    root: Path,
    fmt: str,
    patterns: Sequence[str],
    expected: Sequence[str],
    what: str,
    read_row: Callable[[dict, int, Path], Trajectory],
) -> Iterator[Trajectory | SkipRow]:
    """`read_row(record, index, file)` over the records of every file of `root` matching `patterns`, each record with
    its null keys dropped, a skip naming the file and row. A record that is not an object, or on whose content the
    reader fails (`ROW_ERRORS`), is skipped as `malformed_row`; a file that cannot be read from a row on (a truncated
    parquet shard) is one `unreadable_file` skip naming it and that row, and the other files are read. No file, a
    file leading outside `root`, one whose records are none of them objects, or a first object without the format's
    `expected` fields, is not that layout: `LayoutError`."""
    files = sorted({p for pattern in patterns for p in root.glob(pattern)})
    if not files:
        listing = sorted(p.name for p in root.iterdir())[:20] if root.is_dir() else "not a folder"
        raise LayoutError(f"--format {fmt}: no {' or '.join(patterns)} under {root} (found: {listing})")
    for file in files:
        _confined(root, file)
        records, checked, other = _table_records(file, what), False, None
        for index in itertools.count():
            where = f"{file.name} row {index}"
            try:
                record = next(records, _END)
            except (OSError, pa.ArrowException, UnicodeError) as err:  # a record file cut short, or not one
                yield SkipRow("unreadable_file", f"the file cannot be read from here on: {type(err).__name__}: "
                              f"{err}").at(where)  # fmt: skip
                break
            if record is _END:
                break
            if isinstance(record, SkipRow):
                yield record.at(where)
                continue
            if not isinstance(record, dict):
                other = other or type(record).__name__
                yield SkipRow("malformed_row", f"of type {type(record).__name__}, not a record").at(where)
                continue
            if not checked:  # the layout is the keys of the first record, null or not
                missing = [k for k in expected if k not in record]
                if missing:
                    raise LayoutError(f"{fmt} {file.name} record {index}: expected fields {list(expected)}, found "
                                      f"{sorted(record)} (missing {missing})")  # fmt: skip
                checked = True
            try:
                item = read_row(without_nulls(record), index, file)
            except SkipRow as skip:
                item = skip.at(where)
            except LayoutError:
                raise
            except ROW_ERRORS as err:
                item = SkipRow("malformed_row", f"{type(err).__name__}: {err}").at(where)
            yield item
        if other and not checked:
            raise LayoutError(f"--format {fmt}: {file} holds {other}s, not records")


# -------------------------------------------------------------------------------------------------------- images
class ImageStore:
    """A release's image cells opened as RGB images: `{bytes, path}` structs, raw bytes, base64 strings (Thyme) and
    paths, found as written (relative to the dataset's folder), under its `images/` folder (LLaMA-Factory's
    `dataset_dir`), or inside a `*.zip` of the folder (a path matches a member with or without the zip's top folder).
    Nothing outside the folder is read: a path that leads out of it (absolute elsewhere, `file://`, `../`, through a
    symlink) is `SkipRow("outside_input")`, naming it; a file over `MAX_IMAGE_FILE_BYTES` (a zip member by its
    declared size) is skipped before it is read."""

    def __init__(self, root: Path):
        self.root = root
        self._members: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] | None = None

    def _zip_members(self) -> dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]]:
        if self._members is None:  # the archives stay open: a release's zip holds every row's images
            self._members = {}
            for archive in sorted(self.root.glob("*.zip")):
                _confined(self.root, archive)
                try:
                    opened = zipfile.ZipFile(archive)
                except (OSError, zipfile.BadZipFile) as err:
                    raise LayoutError(f"{archive}: not a zip that can be read ({err})") from None
                for info in opened.infolist():
                    if info.is_dir():
                        continue
                    for key in (info.filename, info.filename.partition("/")[2]):  # "images/a.jpg" also as "a.jpg"
                        if key:
                            self._members.setdefault(key, (opened, info))
        return self._members

    def _path_bytes(self, value: str, what: str) -> bytes | None:
        written = value.removeprefix("file://")
        relative = written.removeprefix("./")
        candidates = (
            [Path(written)] if Path(written).is_absolute() else [self.root / relative, self.root / "images" / relative]
        )
        for path in candidates:
            try:
                within = inside(self.root, path)
                if within and path.is_file():
                    return _capped(path.stat().st_size, f"{what}: {value[:200]!r}", path.read_bytes)
            except (OSError, RuntimeError, ValueError):  # a link loop, a name the file system cannot hold: no file
                continue
            if not within:
                raise SkipRow("outside_input", f"{what}: {value[:200]!r} leads outside --input {self.root} (to "
                              f"{os.path.realpath(path)}): not read")  # fmt: skip
        members = self._zip_members()
        for key in (relative, f"images/{relative}", relative.partition("/")[2]):
            if key in members:
                opened, info = members[key]
                named = f"{what}: {info.filename} in {Path(str(opened.filename)).name}"
                try:  # zipfile reads no more than the declared size, which `_capped` checks first
                    return _capped(info.file_size, f"{named}, uncompressed,", functools.partial(opened.read, info))
                except (OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error) as err:
                    raise SkipRow("missing_image", f"{named}: {err}") from None
        return None

    def open(self, value: Any, what: str) -> Image.Image:
        """The image `value` holds, RGB; a missing or unreadable one raises `SkipRow("missing_image")` naming `what`
        (the field)."""
        data = self.encoded(value, what)
        try:
            with Image.open(io.BytesIO(data)) as image:
                return image.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise SkipRow("missing_image", f"{what}: {err}") from None

    def encoded(self, value: Any, what: str) -> bytes:
        """The file bytes of the image `value` holds, as the release ships them (JPEG, PNG...), undecoded; a missing
        one raises `SkipRow("missing_image")` naming `what`, one leading outside the folder `SkipRow("outside_input")`."""
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path") or value.get("image")
        data = None
        if isinstance(value, bytes | bytearray):
            data = _capped(len(value), what, lambda: bytes(value))
        elif isinstance(value, str) and value:
            # A path is short; a long string, or a data URL, is an image written in base64 (Thyme's `image` cells).
            if len(value) < 1024 and not value.startswith("data:"):
                data = self._path_bytes(value, what)
            if data is None and (len(value) >= 1024 or value.startswith("data:")):
                encoded = value.split(",", 1)[-1]
                try:
                    decode = functools.partial(base64.b64decode, encoded, validate=True)
                    data = _capped(len(encoded) // 4 * 3, f"{what}: the base64 image", decode)
                except (binascii.Error, ValueError):
                    raise SkipRow("missing_image", f"{what}: neither a file nor base64") from None
        if data is None:
            raise SkipRow("missing_image", f"{what}: {brief(value)} not found under {self.root}")
        return data


def _capped(size: int, named: str, read: Callable[[], bytes]) -> bytes:
    """`read()`, once `size` (the bytes it would give) is known to be within `MAX_IMAGE_FILE_BYTES`."""
    if size > MAX_IMAGE_FILE_BYTES:
        raise SkipRow("missing_image", f"{named} is {size} bytes, over the {MAX_IMAGE_FILE_BYTES}-byte cap on an "
                      "image file: not read")  # fmt: skip
    return read()
