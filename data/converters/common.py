"""What every release reader shares: the skip reasons, box geometry, reading records and their content parts (a copy
re-saved by `datasets` reads as the release: `without_nulls`, `part_value`), the record files, and the image cells."""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from data.rows import Trajectory, parquet_records

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in the original image's pixels

# Why a row was skipped; the converter's stats count every one.
SKIP_REASONS = {
    "malformed_call": "a call's JSON or code could not be parsed",
    "missing_image": "the row's original image, or a crop it ships, is missing or unreadable",
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
}
# A box may overshoot the image by this fraction of its side (rounding in the dataset's own code); more, and its
# coordinates are not in the frame the format says: skipped, not clamped into a wrong crop.
EDGE_TOLERANCE = 0.01


class SkipRow(Exception):
    """A row the converter leaves out; `reason` is a key of `SKIP_REASONS`, `where` names the file and row."""

    def __init__(self, reason: str, detail: str = "", where: str = ""):
        assert reason in SKIP_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail, self.where = reason, detail, where
        self.statement = ""  # for `unsupported_code`: the statement of the code the reader could not read

    def at(self, where: str) -> SkipRow:
        self.where = where
        return self


class LayoutError(ValueError):
    """The input is not in the layout `--format` names: raised at once, naming what was expected and found."""


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
        raise SkipRow("malformed_call", f"expected {count} numbers, got {value!r}")
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise SkipRow("malformed_call", f"expected numbers, got {value!r}") from None
    if any(not math.isfinite(v) for v in out):
        raise SkipRow("malformed_call", f"non-finite number in {value!r}")
    return out


# ------------------------------------------------------------------------------------------ text, records, parts
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_THINK_TAG = re.compile(r"</?think>")
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
IMAGE_TAG = "<image>"
# The kinds a content part can be, by the key that holds its value (Qwen's message format: `{"type": "image",
# "image": ...}`; OpenAI's `image_url`); a part without `type` is of the one kind whose key it has.
PART_KINDS = {"text": "text", "image": "image", "image_url": "image", "video": "video"}


def thought_of(text: str) -> str:
    """The thought of an assistant turn (or of a stretch of one): its `<think>` text, else its text before the first
    call, code or answer tag, with no stray `<think>` or `</think>` left (Thyme's code sits inside one `<think>`)."""
    match = _THINK.search(text)
    text = match.group(1) if match else re.split(r"<tool_call>|<grounding>|<code>|<answer>", text, maxsplit=1)[0]
    return _THINK_TAG.sub("", text).strip()


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
    if not isinstance(value, dict):
        raise SkipRow("malformed_call", f"not an object: {text.strip()[:80]!r}")
    return value


# --------------------------------------------------------------------------------------------------------- files
def _table_records(path: Path, what: str) -> Iterator[dict]:
    """The records of a parquet shard, a JSON list, or JSON Lines (`.jsonl`, or a `.json` file `datasets`' `to_json`
    wrote); a file or line that is not JSON fails naming it."""
    if path.suffix == ".parquet":
        yield from parquet_records(path)
        return
    if path.suffix == ".json":
        text = path.read_text(encoding="utf-8")
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            if not (err.msg == "Extra data" and text.lstrip().startswith("{")):
                raise LayoutError(f"{path}: not a JSON file ({err}); {what}") from None
        else:
            if not isinstance(records, list):
                raise LayoutError(f"{path}: expected a JSON list of records, found a {type(records).__name__}; {what}")
            yield from records
            return
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise LayoutError(f"{path}: line {number} is not JSON ({err}); {what}") from None


def read_release(
    root: Path,
    fmt: str,
    patterns: Sequence[str],
    expected: Sequence[str],
    what: str,
    read_row: Callable[[dict, int, Path], Trajectory],
) -> Iterator[Trajectory | SkipRow]:
    """`read_row(record, index, file)` over the records of every file of `root` matching `patterns`, each record with
    its null keys dropped, a skip naming the file and row. No file, or a first record without the format's
    `expected` fields, is not that layout: `LayoutError`."""
    files = sorted({p for pattern in patterns for p in root.glob(pattern)})
    if not files:
        listing = sorted(p.name for p in root.iterdir())[:20] if root.is_dir() else "not a folder"
        raise LayoutError(f"--format {fmt}: no {' or '.join(patterns)} under {root} (found: {listing})")
    for file in files:
        for index, record in enumerate(_table_records(file, what)):
            if index == 0:  # the layout is the keys, null or not
                if not isinstance(record, dict):
                    raise LayoutError(f"--format {fmt}: {file} holds {type(record).__name__}s, not records")
                missing = [k for k in expected if k not in record]
                if missing:
                    raise LayoutError(f"{fmt} {file.name} record 0: expected fields {list(expected)}, found "
                                      f"{sorted(record)} (missing {missing})")  # fmt: skip
            try:
                yield read_row(without_nulls(record), index, file)
            except SkipRow as skip:
                yield skip.at(f"{file.name} row {index}")


# -------------------------------------------------------------------------------------------------------- images
class ImageStore:
    """A release's image cells opened as RGB images: `{bytes, path}` structs, raw bytes, base64 strings (Thyme) and
    paths, found as written (relative to the dataset's folder), under its `images/` folder (LLaMA-Factory's
    `dataset_dir`), or inside a `*.zip` of the folder (a path matches a member with or without the zip's top folder)."""

    def __init__(self, root: Path):
        self.root = root
        self._members: dict[str, tuple[zipfile.ZipFile, str]] | None = None

    def _zip_members(self) -> dict[str, tuple[zipfile.ZipFile, str]]:
        if self._members is None:  # the archives stay open: a release's zip holds every row's images
            self._members = {}
            for archive in sorted(self.root.glob("*.zip")):
                opened = zipfile.ZipFile(archive)
                for name in opened.namelist():
                    if name.endswith("/"):
                        continue
                    for key in (name, name.partition("/")[2]):  # "images/a.jpg" also as "a.jpg"
                        if key:
                            self._members.setdefault(key, (opened, name))
        return self._members

    def _path_bytes(self, value: str) -> bytes | None:
        relative = value.removeprefix("file://")
        candidates = [Path(relative)] if Path(relative).is_absolute() else []
        relative = relative.removeprefix("./")
        candidates += [self.root / relative, self.root / "images" / relative]
        for path in candidates:
            try:
                if path.is_file():
                    return path.read_bytes()
            except OSError:  # a name the file system cannot hold is no file of the release
                continue
        members = self._zip_members()
        for key in (relative, f"images/{relative}", relative.partition("/")[2]):
            if key in members:
                opened, name = members[key]
                return opened.read(name)
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
        one raises `SkipRow("missing_image")` naming `what`."""
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path") or value.get("image")
        data = None
        if isinstance(value, bytes | bytearray):
            data = bytes(value)
        elif isinstance(value, str) and value:
            # A path is short; a long string, or a data URL, is an image written in base64 (Thyme's `image` cells).
            if len(value) < 1024 and not value.startswith("data:"):
                data = self._path_bytes(value)
            if data is None and (len(value) >= 1024 or value.startswith("data:")):
                try:
                    data = base64.b64decode(value.split(",", 1)[-1], validate=True)
                except (binascii.Error, ValueError):
                    raise SkipRow("missing_image", f"{what}: neither a file nor base64") from None
        if data is None:
            raise SkipRow("missing_image", f"{what}: {str(value)[:120]!r} not found under {self.root}")
        return data
