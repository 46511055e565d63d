"""Readers for the public zoom-trajectory SFT sets, each turning the rows of a release, as published, into `Trajectory`
records: the original image, the question and its options, the answer, and per zoom-in call its thought, its box in
the **original image's pixels** and a label. `python -m data.convert` writes them as a dataset `sft.py` trains on
(`data.trajectories` replays the calls through the real tool, mapping each box into the frame the model sees, as it
does for the synthetic gold calls).

Every dataset writes its boxes in its own frame (read from each project's own loading and conversion code, listed in
docs/data.md, "Sources"); the readers compose them into the original's pixels:

| format | call | box as written | composed as |
|---|---|---|---|
| `mini_o3_coldstart` | `<grounding>{"bbox_2d", "source"}</grounding>` | relative [0, 1] of `source`: the original or observation i (the i-th crop the release shows) | relative x the source's extent |
| `cof_sft` | `<tool_call>` of `image_zoom_in_tool` with a `label` | absolute pixels of the first image | as is |
| `pixel_reasoner_sft` | `<tool_call>` of `crop_image_normalized{bbox_2d, target_image}` | normalised [0, 1] of `target_image` (1-based over the images the conversation shows) when all four values are < 1, else pixels of that image as shown; their tool pads 0.1 of the target image per side | the padded box (the crop the next thought saw) x the target's extent |
| `deepeyes_v2_sft` | Python on `image_1` (PIL), read with `ast` (`CodeReader`) | absolute pixels of the original, PIL order | evaluated: crops of crops and of enhanced images composed |
| `thyme_sft` | Python on the image at `image_path` (cv2/numpy or PIL), read with `ast` | absolute pixels of the original, numpy order; literal boxes widened to 64 px by their sandbox | evaluated after the sandbox's rewrites (`ThymeSandboxRewrites`) |

**Images are indexed by what the release shows**, not by the calls: a call after which the release shows no image
failed upstream (their tools add no image then), so it adds nothing, and is dropped from the trajectory and counted
(`Trajectory.failed_calls`). A turn after which the release shows images the reader read no call for is skipped
(`unread_code` for code, `image_count_mismatch` otherwise): a crop the converter did not read never becomes a no-zoom
row. **Every crop is checked against the crop the release ships** (`crop_disagreement`): a row whose replayed crop
disagrees is skipped as `crop_mismatch`, the check that catches a wrong convention on data no test anticipated.

Records are read with their null keys dropped and content parts by type (`without_nulls`, `part_value`): a copy
re-saved by `datasets` reads as the release. A row that cannot be converted is skipped and counted by reason (`SKIP_REASONS`), never given an invented box or
label. Labels: the dataset's own where it has one (CoF), else `derive_label`'s short noun phrase from the thought
before the call, else from the question; each call records its `label_source`; every label is held to the tool's
limits (`ToolConfig.max_label_words`, `max_label_chars`). The answer is the last assistant turn's, read by
`data.task.extract_answer`, the rule the rewards and evaluation read a completion's answer with. The question is the
dataset's own text less its format and tool instructions, its options split off (`data.benchmarks.dataset_question`,
shared with the RL readers of the same datasets).
"""

from __future__ import annotations

import ast
import base64
import binascii
import contextlib
import functools
import io
import json
import math
import re
import textwrap
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from data.benchmarks import cof_question, dataset_question, mini_o3_question
from data.task import extract_answer
from tools import ToolConfig, ToolError, validate_label

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in the original image's pixels
Extent = tuple[float, float, float, float]  # the region of the original an image shows, in original pixels

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
    "image_count_mismatch": "the release shows a different number of images than the calls read (or than it ships)",
    "crop_mismatch": "a replayed crop disagrees with the crop the release ships (aspect ratio or content)",
    "empty_answer": "the row has no final answer",
    "empty_question": "the row has no question",
    "no_label": "no label could be derived for a call, and the dataset has none",
    "label_too_long": "the dataset's label is over the tool's limits",
}
LABEL_SOURCES = ("dataset", "thought", "question")
# A box may overshoot the image by this fraction of its side (rounding in the dataset's own code); more, and its
# coordinates are not in the frame the format says: skipped, not clamped into a wrong crop.
EDGE_TOLERANCE = 0.01
PIXEL_REASONER_PAD = 0.1  # their crop_image_normalized(padding=0.1), in units of the target image
MAX_DERIVED_WORDS = 6
# The crop check (`crop_disagreement`). Aspect ratios may differ by this fraction, plus the rounding of a pixel per side
# and, where a release resizes its crops to multiples of a patch (`resize_step`), half a step per side.
ASPECT_TOLERANCE = 0.1
# Content: both crops downscaled to at most CONTENT_GRID x CONTENT_GRID cells of grey, their correlation at least
# MIN_CORRELATION. On the tests' textured scenes a box off by 3 px still correlates 0.81-0.94 with the true crop, one
# 1.5x too large 0.02-0.64, one with x and y swapped below 0.4. Crops under MIN_CONTENT_SIDE px a side are checked by
# aspect alone; flat crops (grey std under FLAT_STD) by their mean grey, within FLAT_MEAN_DIFF.
CONTENT_GRID = 16
MIN_CORRELATION = 0.75
MIN_CONTENT_SIDE = 8
FLAT_STD, FLAT_MEAN_DIFF = 2.0, 20.0


class SkipRow(Exception):
    """A row the converter leaves out; `reason` is a key of `SKIP_REASONS`, `where` names the file and row."""

    def __init__(self, reason: str, detail: str = "", where: str = ""):
        assert reason in SKIP_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail, self.where = reason, detail, where
        self.statement = ""  # for `unsupported_code`: the statement of the code the reader could not read

    def at(self, where: str) -> SkipRow:
        """This skip, naming the file and row it came from (for the log and `stats.json`'s examples)."""
        self.where = where
        return self


class LayoutError(ValueError):
    """The input is not in the layout `--format` names: raised at once, naming what was expected and found."""


@dataclass
class TrajectoryCall:
    """One zoom-in call of a converted trajectory."""

    box: Box  # original pixels
    thought: str  # the dataset's own text before the call
    label: str
    label_source: str  # one of LABEL_SOURCES


@dataclass
class Trajectory:
    """One converted row: what `python -m data.convert` saves and `data.trajectories` replays."""

    id: str
    source: str
    image: Image.Image
    question: str
    answer: str
    calls: list[TrajectoryCall] = field(default_factory=list)
    final_thought: str = ""
    options: list[str] = field(default_factory=list)
    crops_checked: int = 0  # calls whose crop was checked against the release's own (all of them)
    content_checked: int = 0  # of those, the ones large enough to compare by content, not by aspect alone
    failed_calls: int = 0  # calls (or code turns that raised) after which the release shows no image: dropped


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


# ------------------------------------------------------------------------------------------------------- labels
_ARTICLE = r"(?:the|a|an|this|that|these|those)"
_LOOK = (
    r"(?:zoom(?:ing)?\s+in(?:to)?(?:\s+on)?|zoom(?:ing)?\s+on|look(?:ing)?\s+(?:more\s+|closely\s+|more\s+closely\s+)?"
    r"at|focus(?:ing)?\s+on|examin(?:e|ing)|inspect(?:ing)?|check(?:ing)?|crop(?:ping)?|locat(?:e|ing)|find(?:ing)?|"
    r"identify(?:ing)?|read(?:ing)?)"
)
_PHRASE = rf"({_ARTICLE}\s+[^.,;:!?()\[\]{{}}\n\"]+)"
_FROM_THOUGHT = re.compile(rf"\b{_LOOK}\s+{_PHRASE}", re.IGNORECASE)
_FROM_QUESTION = re.compile(rf"\b(?={_PHRASE})", re.IGNORECASE)  # a lookahead: phrases inside phrases are tried too
_DO_QUESTION = re.compile(r"^\s*(?:what|which|where|who|how)\s+(?:does|do|did)\b", re.IGNORECASE)
_HOW_MANY = re.compile(r"\bhow\s+many\s+([^.,;:!?()\[\]{}\n\"]+)", re.IGNORECASE)  # counted things: "the apples"
# A noun phrase ends before one of these: what follows places or qualifies it, and the label names the thing.
_STOP_WORDS = frozenset(
    "to for in on at of so and or but which that who where when because with from near by is are was were be "
    "if as than then it its there here into onto under above below behind between closely carefully again more "
    "further now first say says show shows read reads look looks mean means contain contains have has do does did "
    "can could will would should".split()
)
# Phrases that name the picture, not a thing in it...
_GENERIC_HEADS = frozenset(
    "image picture photo photograph figure region area view crop question answer options option following "
    "correct details detail part top bottom left right center centre middle side corner colour color shape size "
    "number name text word words brand type kind time price title letter material position".split()
)  # ...or an attribute asked about ("the colour of the umbrella": the umbrella is what to look at)


def _noun_phrase(text: str) -> str | None:
    words = text.split()
    kept = [words[0].lower()]
    for word in words[1:]:
        if word.lower() in _STOP_WORDS:
            break
        kept.append(word)
    if kept[0] in ("this", "that", "these", "those"):
        kept[0] = "the"
    if not 2 <= len(kept) <= MAX_DERIVED_WORDS or {kept[1].lower(), kept[-1].lower()} & _GENERIC_HEADS:
        return None
    return " ".join(kept)


def derive_label(thought: str, question: str) -> tuple[str, str] | None:
    """The label of a call without one, and where it came from (`label_source`), or None.

    Rule, first match wins: (1) in the thought before the call, the noun phrase after a looking verb ("zoom in on",
    "look at", "focus on", "examine", "check", "crop", "locate", "find", "identify", "read"); (2) in the question,
    what "how many" counts ("the apples"), else its first noun phrase. A noun phrase starts with an article or
    demonstrative ("this" and "that" become "the") and ends before a word of `_STOP_WORDS` (a preposition,
    conjunction, adverb or common verb); it has 2 to `MAX_DERIVED_WORDS` words and names neither the picture itself
    ("the image", "the top left") nor an attribute ("the colour"). A heuristic: check a conversion's preview.
    """
    rules = (("thought", thought, _FROM_THOUGHT, ""), ("question", question, _HOW_MANY, "the "),
             ("question", question, _FROM_QUESTION, ""))  # fmt: skip
    for source, text, pattern, article in rules:
        for match in pattern.finditer(text or ""):
            candidate = article + match.group(1)
            if source == "question" and _DO_QUESTION.match(text) and not text[match.end(1) :].strip(" ?"):
                candidate = candidate.rsplit(maxsplit=1)[0]  # "What does the man hold?": the last word is the verb
            phrase = _noun_phrase(candidate)
            if phrase:
                return phrase, source
    return None


def call_label(label: Any, thought: str, question: str, tool: ToolConfig) -> tuple[str, str]:
    """The call's label and `label_source`: the dataset's `label` when it has one (within the tool's limits, else
    `SkipRow("label_too_long")`), else `derive_label`'s (else, or over the limits, `SkipRow("no_label")`). The limits
    are `tool`'s, checked by the tool's own `validate_label`, so no label the tool would reject on replay is kept."""
    if isinstance(label, str) and label.strip():
        try:
            return validate_label(label, tool.max_label_words, tool.max_label_chars), "dataset"
        except ToolError:
            raise SkipRow("label_too_long", label) from None
    derived = derive_label(thought, question)
    if derived is not None:
        try:
            return validate_label(derived[0], tool.max_label_words, tool.max_label_chars), derived[1]
        except ToolError:
            pass
    raise SkipRow("no_label", f"thought {thought[:60]!r}, question {question[:60]!r}")


# ------------------------------------------------------------------------------------------------ text helpers
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_THINK_TAG = re.compile(r"</?think>")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_GROUNDING = re.compile(r"<grounding>(.*?)</grounding>", re.DOTALL)
_IMAGE_TAG = "<image>"


def thought_of(text: str) -> str:
    """The thought of an assistant turn (or of a stretch of one): its `<think>` text, else its text before the first
    call, code or answer tag, with no stray `<think>` or `</think>` left (Thyme's code sits inside one `<think>`, so a
    stretch may hold only its opening or its closing tag; SFT wraps the thought in its own)."""
    match = _THINK.search(text)
    text = match.group(1) if match else re.split(r"<tool_call>|<grounding>|<code>|<answer>", text, maxsplit=1)[0]
    return _THINK_TAG.sub("", text).strip()


# ------------------------------------------------------------------------------------------------ records, parts
def without_nulls(value: Any) -> Any:
    """`value` with every null-valued key dropped, at any depth. A release that has passed through `datasets` (the
    Hub's parquet conversion, `load_dataset(...).to_json`, `save_to_disk`) gives every record, message and content
    part every key of its column's schema, most of them null (`{"type": "text", "text": "...", "image": null}`); the
    readers take a null key for the missing key it stands for. Applied to every record a reader reads (`_rows`)."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


# The kinds a content part can be, by the key that holds its value (Qwen's message format: `{"type": "image",
# "image": ...}`; OpenAI's `image_url`); a part without `type` is of the one kind whose key it has.
PART_KINDS = {"text": "text", "image": "image", "image_url": "image", "video": "video"}


def part_value(part: Any) -> tuple[str, Any] | None:
    """A content part as (kind, value), its kind "text", "image" or "video": read from its `type` and that key's
    non-null value (a part without `type`, from the one key it has). A part of no known kind, or whose value is
    missing, is None: ignored."""
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
    """The text of a message's content, its text parts joined."""
    return "".join(str(value) for kind, value in content_parts(content) if kind == "text")


def content_images(content: Any) -> int:
    """How many images a message's content shows: its image parts, and the `<image>` tags of its text (sharegpt's
    placeholders for the row's `images`, in order)."""
    parts = content_parts(content)
    return sum(kind == "image" for kind, _ in parts) + sum(
        str(value).count(_IMAGE_TAG) for kind, value in parts if kind == "text"
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


# ------------------------------------------------------------------------------------------------------- images
class ImageStore:
    """A release's image cells opened as RGB images: `{bytes, path}` structs, raw bytes, base64 strings (Thyme) and
    paths, found as written (relative to the dataset's folder), under its `images/` folder (LLaMA-Factory's
    `dataset_dir`: CoF, DeepEyesV2 after `unzip images.zip`), or inside a `*.zip` of the folder not unzipped (a path
    matches a member with or without the zip's top folder)."""

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
                    # the member as named, and without its top folder ("images/a.jpg" also as "a.jpg")
                    for key in (name, name.partition("/")[2]):
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
        try:
            with Image.open(io.BytesIO(data)) as image:
                return image.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise SkipRow("missing_image", f"{what}: {err}") from None


# --------------------------------------------------------------------------------------------------- crop check
def _trim_margins(image: Image.Image, light: int = 245) -> Image.Image:
    """A matplotlib figure less its light margins (DeepEyesV2 shows crops through `plt.imshow`; with the axes off the
    figure is the crop on white)."""
    grey = np.asarray(image.convert("L"))
    rows, cols = np.flatnonzero((grey < light).any(axis=1)), np.flatnonzero((grey < light).any(axis=0))
    if not len(rows) or not len(cols):
        return image
    return image.crop((int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1))


def _grey_cells(image: Image.Image, grid: int) -> np.ndarray:
    return np.asarray(image.convert("L").resize((grid, grid), Image.Resampling.BOX), dtype=np.float64).ravel()


def crop_disagreement(
    original: Image.Image, box: Box, shipped: Image.Image, *, resize_step: int = 1, figure: bool = False
) -> tuple[str | None, bool]:
    """Whether the crop of `original` at `box` (what the converted call will show) is the crop the release ships:
    (why not, or None; whether content was compared).

    Aspect ratios must agree within `ASPECT_TOLERANCE`, plus a pixel per side of rounding and half of `resize_step`
    per side where the release resized its crops to multiples of a patch; where both crops have `MIN_CONTENT_SIDE`
    px a side, their downscaled grey must correlate (`MIN_CORRELATION`), or, both flat, match in mean. `figure`: the
    release shows a matplotlib figure of the crop; its light margins are trimmed first.
    """
    ours = original.crop(box)
    theirs = _trim_margins(shipped) if figure else shipped
    (w, h), (sw, sh) = ours.size, theirs.size
    slack = ASPECT_TOLERANCE + 1 / w + 1 / h + (resize_step / 2 + 1) * (1 / sw + 1 / sh)
    ratio = (w / h) / (sw / sh)
    if abs(ratio - 1) > slack:
        return f"aspect {w}x{h} vs the release's {sw}x{sh} crop", False
    if min(w, h, sw, sh) < MIN_CONTENT_SIDE:
        return None, False
    grid = min(CONTENT_GRID, w, h, sw, sh)
    a, b = _grey_cells(ours, grid), _grey_cells(theirs, grid)
    if a.std() < FLAT_STD or b.std() < FLAT_STD:
        differ = abs(a.mean() - b.mean()) > FLAT_MEAN_DIFF
        return (f"flat crops of mean grey {a.mean():.0f} vs {b.mean():.0f}" if differ else None), True
    correlation = float(np.corrcoef(a, b)[0, 1])
    if correlation < MIN_CORRELATION:
        return f"content correlation {correlation:.2f} < {MIN_CORRELATION} with the release's {sw}x{sh} crop", True
    return None, True


# ------------------------------------------------------------------------------------------------- code reading
@dataclass(frozen=True)
class Picture:
    """An image value of code under reading: the region of the original it shows (`extent`, original pixels; None for
    an image made by an operation that is not a crop, resize or enhancement, e.g. a rotation: `made_by`), its size in
    its own pixels, and whether it is a numpy array (indexed [y, x]) or a PIL image."""

    extent: Extent | None
    size: tuple[int, int]  # width, height
    array: bool
    made_by: str = "the original"
    cropped: bool = False


@dataclass(frozen=True)
class Shown:
    """An image the code showed the model: `via` display (Jupyter's `display`, `.show()`, a cell's last value), figure
    (a matplotlib figure of it) or save (Thyme's sandbox returns the images the code writes)."""

    picture: Picture
    via: str


class _Opaque:
    """A value the reader does not follow (a string it built, a file handle): fine until a crop needs it."""

    def __repr__(self):
        return "<not evaluated>"


OPAQUE = _Opaque()


@dataclass(frozen=True)
class _Module:
    name: str  # "cv2", "PIL.Image", "matplotlib.pyplot", or a function in one: "cv2.resize"


@dataclass(frozen=True)
class _Bound:
    """A method of a value: `picture.crop`, `enhancer.enhance`."""

    owner: Any
    name: str


@dataclass(frozen=True)
class _Enhancer:
    """`ImageEnhance.Contrast(picture)` or `cv2.createCLAHE()`: an object whose `enhance` / `apply` changes colours."""

    picture: Picture | None


class OriginalPath(str):
    """The path of the original image as the code sees it (Thyme's `image_path`)."""


_MODULES = {"cv2", "numpy", "np", "PIL", "matplotlib", "math", "os", "json", "re", "random", "string", "base64", "io"}
_ALIASES = {"np": "numpy", "plt": "matplotlib.pyplot"}
# Operations that change an image's colours, not its geometry: a crop of their result is a crop of the original.
_ENHANCE = {
    "cv2.cvtColor", "cv2.GaussianBlur", "cv2.medianBlur", "cv2.blur", "cv2.bilateralFilter", "cv2.convertScaleAbs",
    "cv2.equalizeHist", "cv2.filter2D", "cv2.detailEnhance", "cv2.addWeighted", "cv2.normalize", "cv2.bitwise_not",
    "numpy.clip", "numpy.uint8", "numpy.array", "numpy.asarray", "numpy.ascontiguousarray", "numpy.copy",
    "PIL.ImageOps.autocontrast", "PIL.ImageOps.equalize", "PIL.ImageOps.grayscale", "PIL.ImageOps.invert",
    "PIL.ImageOps.posterize", "PIL.ImageOps.solarize", "PIL.Image.fromarray",
}  # fmt: skip
_PICTURE_ENHANCE = {"convert", "copy", "filter", "astype", "point", "__array__"}
_GEOMETRY = {"rotate", "transpose", "transform", "thumbnail", "reduce", "expand", "flip", "warpAffine", "rot90"}
_NUMBER_FUNCS: dict[str, Callable] = {
    "int": int, "float": float, "round": round, "abs": abs, "min": min, "max": max, "len": len, "sum": sum,
    "tuple": tuple, "list": list, "math.floor": math.floor, "math.ceil": math.ceil, "math.sqrt": math.sqrt,
    "numpy.floor": math.floor, "numpy.ceil": math.ceil, "numpy.round": round, "numpy.int32": int, "numpy.int64": int,
}  # fmt: skip
_BINOPS: dict[type, Callable] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}  # fmt: skip
_COMPARE: dict[type, Callable] = {
    ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
}  # fmt: skip


def _unsupported(node: ast.AST | None, what: str) -> SkipRow:
    line = f"line {node.lineno}: " if node is not None and hasattr(node, "lineno") else ""
    return SkipRow("unsupported_code", f"{line}{what}")


QUOTE_CHARS = 160  # of the statement an `unsupported_code` skip quotes


@contextlib.contextmanager
def _quoting(node: ast.stmt) -> Iterator[None]:
    """An `unsupported_code` skip raised inside `node` quotes it (the innermost statement: a compound one, its header),
    so the stats and the preview show the form the reader could not read."""
    try:
        yield
    except SkipRow as skip:
        if skip.reason != "unsupported_code" or skip.statement:
            raise
        header = {ast.If: "if {}:", ast.While: "while {}:"}.get(type(node))
        text = header.format(ast.unparse(node.test)) if header else ast.unparse(node).splitlines()[0]
        text = text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 3] + "..."
        quoted = SkipRow("unsupported_code", f"{skip.detail} in `{text}`")
        quoted.statement = text
        raise quoted from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class CodeReader:
    """Reads a trajectory's Python the way its sandbox ran it, without running it: `ast` statements are evaluated
    over the values crops depend on, so `image_1.crop((int(w * 0.6), ...))` with `w, h = image_1.size`, unpacked
    coordinates, crops of crops, crops of enhanced images and numpy slices (`img[y1:y2, x1:x2, :]`) become boxes on the
    original. Names persist from one code turn to the next (a Jupyter kernel, Thyme's saved context).

    `run(code)` returns what the code showed (`Shown`); anything it cannot evaluate faithfully (a loop, a function
    definition, a coordinate it cannot compute, an undecidable `if`) raises `SkipRow("unsupported_code")`. `shows`:
    "display" (DeepEyesV2's Jupyter: `display`, `.show()`, `plt.show()`, a cell's last value, and figures left open
    at the end of a cell) or "save" (Thyme: the images the code writes, `cv2.imwrite` / `.save` / `plt.savefig`).
    """

    def __init__(
        self,
        size: tuple[int, int],
        names: dict[str, Any],
        shows: str,
        original_as: str | None = None,
        rewrite: Callable[[ast.Module], ast.Module] | None = None,
    ):
        assert shows in ("display", "save"), shows
        self.rewrite = rewrite  # what the sandbox does to the code before it runs it (Thyme's: `ThymeSandboxRewrites`)
        self.original = Picture((0.0, 0.0, float(size[0]), float(size[1])), size, array=False)
        self.env: dict[str, Any] = dict(names)
        if original_as is not None:  # DeepEyesV2's kernel holds the original as `image_1`
            self.env[original_as] = self.original
        self.shows = shows
        self.shown: list[Shown] = []
        self.figure: Picture | None = None

    # ------------------------------------------------------------------------------------------------ statements
    def run(self, code: str) -> list[Shown]:
        self.shown, self.figure = [], None
        tree = _parse(code)
        if self.rewrite is not None:
            tree = self.rewrite(tree)
        for i, statement in enumerate(tree.body):
            last = i == len(tree.body) - 1
            if last and self.shows == "display" and isinstance(statement, ast.Expr):
                with _quoting(statement):
                    value = self.eval(statement.value)
                if isinstance(value, Picture):  # Jupyter displays a cell's last value
                    self._show(value, "display")
            else:
                self.statement(statement)
        if self.figure is not None and self.shows == "display":  # the inline backend shows open figures at the end
            self._show(self.figure, "figure")
        return self.shown

    def statements(self, body: Sequence[ast.stmt]) -> None:
        for statement in body:
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        with _quoting(node):
            self._statement(node)

    def _statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            self._import(node)
        elif isinstance(node, ast.Assign):
            value = self.eval(node.value)
            for target in node.targets:
                self.assign(target, value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.assign(node.target, self.eval(node.value))
        elif isinstance(node, ast.AugAssign):
            self.assign(node.target, self._binop(node.op, self.eval(node.target), self.eval(node.value), node))
        elif isinstance(node, ast.Expr):
            self.eval(node.value)
        elif isinstance(node, ast.If):
            test = self.eval(node.test)
            if not isinstance(test, bool | int | float) or isinstance(test, _Opaque):
                raise _unsupported(node, "an `if` whose test the reader cannot decide")
            self.statements(node.body if test else node.orelse)
        elif isinstance(node, ast.Try):
            # The sandbox ran the body; had it raised, the release would show no image after the turn (checked).
            self.statements(node.body)
            self.statements(node.orelse)
            self.statements(node.finalbody)
        elif isinstance(node, ast.With):
            for item in node.items:
                value = self.eval(item.context_expr)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value)
            self.statements(node.body)
        elif isinstance(node, ast.Pass | ast.Assert | ast.Delete | ast.Global | ast.Nonlocal):
            pass
        else:
            raise _unsupported(node, f"a `{type(node).__name__}` statement")

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                full = alias.name
                bound = alias.asname or full.split(".")[0]
                self.env[bound] = _Module(full if alias.asname else full.split(".")[0])
            else:
                self.env[alias.asname or alias.name] = _Module(f"{node.module}.{alias.name}")

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, _Opaque):  # `name, ext = os.path.splitext(...)`: nothing a crop reads
                for element in target.elts:
                    self.assign(element, OPAQUE)
                return
            if not isinstance(value, tuple | list) or len(value) != len(target.elts):
                raise _unsupported(target, f"unpacking {value!r} into {len(target.elts)} names")
            for element, item in zip(target.elts, value):
                self.assign(element, item)
        elif isinstance(target, ast.Subscript):
            owner = self.eval(target.value)
            if isinstance(owner, Picture):  # drawing into an array: same geometry, other colours
                self.assign(target.value, replace(owner, made_by=f"{owner.made_by}, edited"))
        elif isinstance(target, ast.Attribute):
            pass  # an attribute of an object the reader does not follow
        else:
            raise _unsupported(target, f"assignment to a `{type(target).__name__}`")

    # ----------------------------------------------------------------------------------------------- expressions
    def eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in _NUMBER_FUNCS or node.id in ("print", "display", "str", "isinstance", "type", "range"):
                return _Module(node.id)
            raise _unsupported(node, f"the name {node.id!r}, not defined before")
        if isinstance(node, ast.Tuple | ast.List):
            values = [self.eval(e) for e in node.elts]
            return tuple(values) if isinstance(node, ast.Tuple) else values
        if isinstance(node, ast.JoinedStr | ast.Dict | ast.Set | ast.Lambda | ast.ListComp | ast.GeneratorExp):
            return OPAQUE
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return OPAQUE if isinstance(operand, _Opaque) else not operand
            if _is_number(operand):
                return -operand if isinstance(node.op, ast.USub) else +operand
            return OPAQUE
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self.eval(node.left), self.eval(node.right), node)
        if isinstance(node, ast.BoolOp):
            values = [self.eval(v) for v in node.values]
            if any(isinstance(v, _Opaque) for v in values):
                return OPAQUE
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.IfExp):
            test = self.eval(node.test)
            if isinstance(test, _Opaque):
                raise _unsupported(node, "a conditional expression whose test the reader cannot decide")
            return self.eval(node.body if test else node.orelse)
        if isinstance(node, ast.Attribute):
            return self._attribute(self.eval(node.value), node.attr, node)
        if isinstance(node, ast.Subscript):
            return self._subscript(self.eval(node.value), node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Starred):
            raise _unsupported(node, "a starred expression")
        raise _unsupported(node, f"a `{type(node).__name__}` expression")

    def _binop(self, op: ast.operator, left: Any, right: Any, node: ast.AST) -> Any:
        if _is_number(left) and _is_number(right) and type(op) in _BINOPS:
            try:
                return _BINOPS[type(op)](left, right)
            except (ZeroDivisionError, OverflowError):
                raise _unsupported(node, "arithmetic that fails") from None
        picture = left if isinstance(left, Picture) else right if isinstance(right, Picture) else None
        if picture is not None and picture.array:  # array arithmetic: brightness or contrast, same geometry
            return replace(picture, made_by=f"{picture.made_by}, enhanced")
        if isinstance(left, tuple | list) and isinstance(right, tuple | list) and isinstance(op, ast.Add):
            return type(left)([*left, *right])
        return OPAQUE

    def _compare(self, node: ast.Compare) -> Any:
        left = self.eval(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.eval(comparator)
            if isinstance(op, ast.Is | ast.IsNot):  # `img is None`: the guard after cv2.imread
                if isinstance(left, _Opaque) or isinstance(right, _Opaque) or (left is not None and right is not None):
                    return OPAQUE
                result = (left is right) if isinstance(op, ast.Is) else (left is not right)
            elif type(op) in _COMPARE and _is_number(left) and _is_number(right):
                result = _COMPARE[type(op)](left, right)
            else:
                return OPAQUE
            if not result:
                return False
            left = right
        return True

    def _attribute(self, owner: Any, name: str, node: ast.AST) -> Any:
        if isinstance(owner, _Module):
            return _Module(f"{owner.name}.{name}")
        if isinstance(owner, Picture):
            width, height = owner.size
            if name == "size":
                return (width, height) if not owner.array else width * height * 3
            if name == "shape" and owner.array:
                return (height, width, 3)
            if name in ("width", "height") and not owner.array:
                return width if name == "width" else height
            if name in ("mode", "dtype", "format", "info", "ndim"):
                return OPAQUE
            return _Bound(owner, name)
        if isinstance(owner, _Enhancer | str | _Opaque):
            return _Bound(owner, name)
        raise _unsupported(node, f"the attribute .{name} of {owner!r}")

    def _subscript(self, owner: Any, node: ast.Subscript) -> Any:
        if isinstance(owner, Picture):
            if not owner.array:
                raise _unsupported(node, "indexing a PIL image")
            return self._slice_array(owner, node.slice)
        if isinstance(owner, tuple | list):
            index = node.slice
            if isinstance(index, ast.Slice):
                bounds = [self.eval(b) if b is not None else None for b in (index.lower, index.upper, index.step)]
                if all(b is None or isinstance(b, int) for b in bounds):
                    return owner[slice(*bounds)]
                raise _unsupported(node, "a slice with bounds the reader cannot compute")
            key = self.eval(index)
            if isinstance(key, int) and -len(owner) <= key < len(owner):
                return owner[key]
            raise _unsupported(node, f"index {key!r} of a {len(owner)}-tuple")
        return OPAQUE

    def _slice_array(self, picture: Picture, index: ast.expr) -> Picture:
        """numpy's basic slicing of an (H, W[, C]) array: rows, then columns, then channels (any channel selection
        keeps the region); bounds clipped to the array as numpy does, negative ones counted from the end."""
        parts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
        width, height = picture.size
        spans = []
        for axis, length in ((0, height), (1, width)):
            if axis >= len(parts):
                spans.append((0, length))
                continue
            part = parts[axis]
            if not isinstance(part, ast.Slice):
                raise _unsupported(index, "an integer index into an image's rows or columns")
            lower, upper, step = (self.eval(b) if b is not None else None for b in (part.lower, part.upper, part.step))
            if step not in (None, 1):
                raise _unsupported(index, f"a slice with step {step!r}")
            if not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in (lower, upper)):
                raise _unsupported(index, f"slice bounds {lower!r}:{upper!r} that are not integers")
            start, stop, _ = slice(lower, upper).indices(length)
            spans.append((start, max(start, stop)))
        (top, bottom), (left, right) = spans
        return self._crop(picture, (left, top, right, bottom), index)

    def _crop(self, picture: Picture, box: Sequence[Any], node: ast.AST) -> Picture:
        """`picture` cropped at `box` (its own pixels, x1, y1, x2, y2), its region composed into the original."""
        if picture.extent is None:
            raise _unsupported(node, f"a crop of an image made by {picture.made_by}")
        if not (isinstance(box, tuple | list) and len(box) == 4 and all(_is_number(v) for v in box)):
            raise _unsupported(node, f"a crop box the reader cannot compute: {box!r}")
        x1, y1, x2, y2 = (float(v) for v in box)
        if not picture.array:  # PIL rounds a float box to whole pixels
            x1, y1, x2, y2 = (float(round(v)) for v in (x1, y1, x2, y2))
        width, height = picture.size
        ex1, ey1, ex2, ey2 = picture.extent
        sx, sy = (ex2 - ex1) / width, (ey2 - ey1) / height
        extent = (ex1 + x1 * sx, ey1 + y1 * sy, ex1 + x2 * sx, ey1 + y2 * sy)
        size = (max(0, int(x2 - x1)), max(0, int(y2 - y1)))
        return Picture(extent, size, picture.array, made_by="a crop", cropped=True)

    # ------------------------------------------------------------------------------------------------------ calls
    def _call(self, node: ast.Call) -> Any:
        function = self.eval(node.func)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg is not None}
        if isinstance(function, _Bound):
            return self._method(function.owner, function.name, args, kwargs, node)
        if not isinstance(function, _Module):
            return OPAQUE
        name = function.name
        for alias, full in _ALIASES.items():
            if name == alias or name.startswith(f"{alias}."):
                name = full + name[len(alias) :]
        pictures = [a for a in [*args, *kwargs.values()] if isinstance(a, Picture)]
        if name in ("print", "str", "isinstance", "type", "range") or name.startswith(("os.", "json.", "re.")):
            return OPAQUE
        if name in _NUMBER_FUNCS:
            try:
                return _NUMBER_FUNCS[name](*args)
            except (TypeError, ValueError, OverflowError):
                if pictures and name == "len":
                    return pictures[0].size[1]
                return OPAQUE
        if name == "display":
            for picture in pictures:
                self._show(picture, "display")
            return None
        if name in ("cv2.imread", "PIL.Image.open"):
            if args and self._is_original_path(args[0]):
                return replace(self.original, array=name == "cv2.imread")
            raise _unsupported(node, f"{name} of a file other than the original: {args[:1]!r}")
        if name == "cv2.imwrite":
            if self.shows == "save" and len(args) >= 2 and isinstance(args[1], Picture):
                self._show(args[1], "save")
            return True
        if name == "cv2.resize":
            return self._resize(args, kwargs, node)
        if name == "cv2.createCLAHE" or name.startswith("PIL.ImageEnhance."):
            return _Enhancer(pictures[0] if pictures else None)
        if name in _ENHANCE:
            if not pictures:
                return OPAQUE
            picture = pictures[0]
            return replace(picture, array=not name.startswith("PIL."), made_by=f"{picture.made_by}, enhanced")
        if name.startswith("matplotlib.pyplot."):
            return self._pyplot(name.rsplit(".", 1)[1], pictures, node)
        if pictures:  # any other operation on an image: not a crop (a rotation, a warp, a drawing library)
            return Picture(None, pictures[0].size, pictures[0].array, made_by=name, cropped=pictures[0].cropped)
        return OPAQUE

    def _method(self, owner: Any, name: str, args: list, kwargs: dict, node: ast.AST) -> Any:
        if isinstance(owner, _Enhancer):
            if name in ("enhance", "apply"):
                picture = owner.picture or next((a for a in args if isinstance(a, Picture)), None)
                return replace(picture, made_by=f"{picture.made_by}, enhanced") if picture else OPAQUE
            return OPAQUE
        if not isinstance(owner, Picture):
            return OPAQUE
        if name == "crop":
            box = args[0] if args else kwargs.get("box")
            return self._crop(owner, box, node)
        if name == "resize":
            size = args[0] if args else kwargs.get("size")
            if not (isinstance(size, tuple | list) and len(size) == 2 and all(_is_number(v) for v in size)):
                raise _unsupported(node, f"a resize to a size the reader cannot compute: {size!r}")
            return replace(owner, size=(int(size[0]), int(size[1])), made_by=f"{owner.made_by}, resized")
        if name in _PICTURE_ENHANCE:
            return replace(owner, made_by=f"{owner.made_by}, enhanced")
        if name == "show":
            if self.shows == "display":
                self._show(owner, "display")
            return None
        if name == "save":
            if self.shows == "save":
                self._show(owner, "save")
            return None
        if name in ("tobytes", "getpixel", "getdata", "mean", "std", "sum", "max", "min", "tolist", "histogram"):
            return OPAQUE
        if name in _GEOMETRY:
            return Picture(None, owner.size, owner.array, made_by=f".{name}", cropped=owner.cropped)
        raise _unsupported(node, f"the image method .{name}")

    def _resize(self, args: list, kwargs: dict, node: ast.AST) -> Picture:
        """`cv2.resize(src, dsize)` or `cv2.resize(src, None / (0, 0), fx=, fy=)`: the same region at another size."""
        picture = args[0] if args else kwargs.get("src")
        if not isinstance(picture, Picture):
            raise _unsupported(node, "cv2.resize of something that is not an image")
        size = args[1] if len(args) > 1 else kwargs.get("dsize")
        fx = args[3] if len(args) > 3 else kwargs.get("fx", 0)
        fy = args[4] if len(args) > 4 else kwargs.get("fy", 0)
        width, height = picture.size
        if isinstance(size, tuple | list) and len(size) == 2 and all(_is_number(v) and v > 0 for v in size):
            new = (int(size[0]), int(size[1]))
        elif _is_number(fx) and _is_number(fy) and fx > 0 and fy > 0:
            new = (round(width * fx), round(height * fy))
        else:
            raise _unsupported(node, f"cv2.resize to a size the reader cannot compute: {size!r}, fx={fx!r}")
        return replace(picture, size=new, made_by=f"{picture.made_by}, resized")

    def _pyplot(self, name: str, pictures: list[Picture], node: ast.AST) -> Any:
        """matplotlib's pyplot: one image per figure (`imshow`), shown by `show` (or at the end of a Jupyter cell),
        written by `savefig` (Thyme); several images in one figure are not one crop."""
        if name == "imshow" and pictures:
            if self.figure is not None:
                raise _unsupported(node, "several images drawn into one figure")
            self.figure = pictures[0]
        elif name in ("subplots", "subplot", "subplot2grid", "add_subplot"):
            raise _unsupported(node, f"plt.{name}: a figure of several panels")
        elif name == "figure":
            if self.figure is not None:
                raise _unsupported(node, "a new figure while one with an image is open")
        elif name in ("show", "savefig") and self.figure is not None:
            if (name == "show") == (self.shows == "display"):
                self._show(self.figure, "figure")
            self.figure = None
        elif name == "close":
            self.figure = None
        return OPAQUE

    def _show(self, picture: Picture, via: str) -> None:
        self.shown.append(Shown(picture, via))

    def _is_original_path(self, value: Any) -> bool:
        return isinstance(value, OriginalPath) or (
            isinstance(value, str) and any(isinstance(v, OriginalPath) and v == value for v in self.env.values())
        )


def _parse(code: str) -> ast.Module:
    """The code as its sandbox would run it: dedented, else with DeepEyesV2's indentation repair (each line stripped,
    re-indented after a line ending in ":"), `deepeyesv2.py` `fix_python_indentation`. Unparseable code raises
    `SkipRow("malformed_call")`."""
    try:
        return ast.parse(textwrap.dedent(code))
    except SyntaxError:
        pass
    lines, fixed, indent = [line.strip() for line in code.splitlines() if line.strip()], [], 0
    for line in lines:
        if line.startswith(("except", "elif", "else", "finally")):
            indent = max(0, indent - 1)
        fixed.append("    " * indent + line)
        indent += line.endswith(":")
    try:
        return ast.parse("\n".join(fixed))
    except SyntaxError as err:
        raise SkipRow("malformed_call", f"code does not parse: {err}") from None


# DeepEyesV2 runs the last <code> block of a turn, and in it the last ```python fenced block (deepeyesv2.py,
# `extract_python_code`); Thyme reads each <code> block, a fence optional (Thyme's model.py, `code_regex`).
_CODE_BLOCK = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_PYTHON_FENCE = re.compile(r"```python\s*\n(.*?)\n```", re.DOTALL)
_THYME_CODE = re.compile(r"<code>\s*(?:```\s*)?(?:python\s*)?([\s\S]*?)\s*(?:```\s*)?</code>", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------------- readers
@dataclass
class _Call:
    """A call as read from a turn: the region of the original it crops, the dataset's label, and whether the release
    shows it as a matplotlib figure."""

    extent: Sequence[float]
    label: Any = None
    figure: bool = False


class _Replay:
    """One row's calls in conversation order, paired with the images the release shows after each turn.

    `images` holds every image the conversation has shown (the original first): its box in the original and its size
    as shown, what Mini-o3's `observation_i` and PixelReasoner's `target_image` index. A turn after which the release
    shows no image failed upstream: its calls are dropped (counted) and add no image. Otherwise the calls read must
    match the images shown one for one, and each crop must agree with the one the release ships."""

    def __init__(self, original, shipped, store, question, tool, resize_step=1):
        self.original, self.shipped, self.store = original, list(shipped), store
        self.question, self.tool, self.resize_step = question, tool, resize_step
        self.images: list[tuple[Box, tuple[int, int]]] = [((0, 0, *original.size), original.size)]
        self.calls: list[TrajectoryCall] = []
        self.failed = self.checked = self.content = 0

    def turn(self, thought: str, read: Callable[[], list[_Call]], shown: int, code: bool = False) -> None:
        try:
            calls, error = read(), None
        except SkipRow as skip:
            calls, error = [], skip
        if shown == 0:  # the tool failed (or the code showed nothing): upstream added no image, nor do we
            self.failed += len(calls) or error is not None  # code that only computed is no failed call
            return
        if error is not None:
            raise error
        if not calls:
            what = "a code turn from which no crop was read" if code else "a turn with no call read"
            raise SkipRow("unread_code" if code else "image_count_mismatch", f"the release shows {shown} image(s) "
                          f"after {what}")  # fmt: skip
        if len(calls) != shown:
            raise SkipRow("image_count_mismatch", f"{len(calls)} crop(s) read, {shown} image(s) shown")
        for call in calls:
            box = to_image_box(call.extent, self.original.size)
            index = len(self.images)
            if index >= len(self.shipped):
                raise SkipRow("image_count_mismatch", f"image {index} shown but not shipped")
            shipped = self.store.open(self.shipped[index], f"image {index} (the crop of call {len(self.calls) + 1})")
            why, content = crop_disagreement(
                self.original, box, shipped, resize_step=self.resize_step, figure=call.figure
            )
            if why is not None:
                raise SkipRow("crop_mismatch", f"call {len(self.calls) + 1}, box {list(box)}: {why}")
            self.checked, self.content = self.checked + 1, self.content + content
            self.images.append((box, shipped.size))
            label = call_label(call.label, thought, self.question, self.tool)
            self.calls.append(TrajectoryCall(box, thought, *label))

    def finish(self, row_id, source, question, options, final_text, final_thought) -> Trajectory:
        """The row as a `Trajectory`, its answer read from `final_text` (the last assistant turn) by the repo's one
        rule, `data.task.extract_answer`; a row without a question or an answer is a `SkipRow`."""
        if not question:
            raise SkipRow("empty_question")
        answer = extract_answer(final_text)
        if not answer:
            raise SkipRow("empty_answer")
        return Trajectory(str(row_id), source, self.original, question, answer, self.calls, final_thought,
                          list(options), self.checked, self.content, self.failed)  # fmt: skip


def _table_records(path: Path, what: str) -> Iterator[dict]:
    """The records of a parquet shard (a batch at a time: Thyme's rows embed their images), a JSON list, or JSON Lines
    (`.jsonl`, or a `.json` file `datasets`' `to_json` wrote, whose default is one record per line); a file or line
    that is not JSON fails naming it."""
    if path.suffix == ".parquet":
        for batch in pq.ParquetFile(path).iter_batches(batch_size=64):
            yield from batch.to_pylist()
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


def _check_keys(record: dict, expected: Sequence[str], where: str) -> None:
    missing = [k for k in expected if k not in record]
    if missing:
        raise LayoutError(f"{where}: expected fields {list(expected)}, found {sorted(record)} (missing {missing})")


def _files(root: Path, patterns: Sequence[str], fmt: str) -> list[Path]:
    found = sorted({p for pattern in patterns for p in root.glob(pattern)})
    if not found:
        listing = sorted(p.name for p in root.iterdir())[:20] if root.is_dir() else "not a folder"
        raise LayoutError(f"--format {fmt}: no {' or '.join(patterns)} under {root} (found: {listing})")
    return found


def _rows(file: Path, records, expected, fmt, read_row) -> Iterator[Trajectory | SkipRow]:
    """`read_row(record, index)` over a file's records, a skip naming the file and row; the first record must have
    the format's fields (else the input is not in that layout: `LayoutError`)."""
    for index, record in enumerate(records):
        if index == 0:  # the layout is the keys, null or not
            if not isinstance(record, dict):
                raise LayoutError(f"--format {fmt}: {file} holds {type(record).__name__}s, not records")
            _check_keys(record, expected, f"{fmt} {file.name} record 0")
        try:
            yield read_row(without_nulls(record), index)
        except SkipRow as skip:
            yield skip.at(f"{file.name} row {index}")


def _shown_after(counts: Sequence[tuple[str, int]], position: int) -> int:
    """The images the user turns after message `position` show, up to the next assistant turn (`counts`: per message,
    its role and the images it shows)."""
    shown = 0
    for role, count in counts[position + 1 :]:
        if role == "assistant":
            break
        shown += count
    return shown


def _question_images(counts: Sequence[tuple[str, int]], shipped: int) -> None:
    """The release shows the row's one original in the question and ships one image per image shown."""
    first = next((count for role, count in counts if role == "user"), 0)
    if first > 1:
        raise SkipRow("multi_image", f"the question shows {first} images")
    if first == 0:
        raise SkipRow("missing_image", "the question shows no image")
    total = sum(count for _, count in counts)
    if total != shipped:
        raise SkipRow("image_count_mismatch", f"the conversation shows {total} images, the row ships {shipped}")


# ------------------------------------------------------------------------------------------------ Mini-o3
def read_mini_o3_coldstart(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """Mini-o3's cold start (HF `Mini-o3/Mini-o3-Coldstart-Dataset`): parquet shards whose `conversations` is a
    sharegpt list written as a string, `images` the original then every observation the conversation shows."""
    store = ImageStore(root)
    for file in _files(root, ("*.parquet", "data/*.parquet"), "mini_o3_coldstart"):
        records = _table_records(file, "Mini-o3's cold-start shards")

        def row(record, index, file=file):
            row_id = f"{file.stem}-{record.get('sample_index', index)}-{record.get('rollout_index', 0)}"
            return _mini_o3_row(record, row_id, store, tool)

        yield from _rows(file, records, ("conversations", "images"), "mini_o3_coldstart", row)


def _mini_o3_row(record: dict, row_id: str, store: ImageStore, tool: ToolConfig) -> Trajectory:
    try:
        turns = json.loads(record["conversations"])
    except (json.JSONDecodeError, TypeError):
        try:  # their own preprocessing eval()s it; literal_eval reads the same Python literals safely
            turns = ast.literal_eval(record["conversations"])
        except (ValueError, SyntaxError):
            raise SkipRow("malformed_call", "conversations is neither JSON nor a Python literal") from None
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise SkipRow("malformed_call", "conversations is not a list of turns")
    turns = without_nulls(turns)
    images = record.get("images") or []
    if not images:
        raise SkipRow("missing_image", "no images")
    original = store.open(images[0], "images[0]")
    roles = {"human": "user", "gpt": "assistant"}
    counts = [(roles.get(t.get("from"), "system"), content_images(t.get("value"))) for t in turns]
    _question_images(counts, len(images))
    humans = [content_text(t.get("value")) for t in turns if t.get("from") == "human"]
    question, options = mini_o3_question(humans[0])
    replay = _Replay(original, images, store, question, tool)
    final = ""
    for position, turn in enumerate(turns):
        if turn.get("from") != "gpt":
            continue
        text = content_text(turn.get("value"))

        def read(text=text):
            calls = []
            for payload in _GROUNDING.findall(text):
                call = json_call(payload)
                box, source = numbers(call.get("bbox_2d")), call.get("source", "original_image")
                # observation_i is the i-th image the conversation showed (function_tools.py: observations[i]);
                # a failed call showed none, so it is not counted (vllm_rollout_spmd.py appends only crops)
                match = re.fullmatch(r"observation_(\d+)", str(source))
                index = int(match.group(1)) if match else 0 if source == "original_image" else -1
                if not 0 <= index < len(replay.images):
                    raise SkipRow("bad_source", f"source {source!r}: {len(replay.images) - 1} observations so far")
                calls.append(_Call(relative_to_pixels(box, replay.images[index][0]), call.get("label")))
            return calls

        replay.turn(thought_of(text), read, _shown_after(counts, position))
        final = text
    final_thought = thought_of(final) if extract_answer(final) is not None else ""
    return replay.finish(row_id, f"mini_o3/{record.get('data_source', '')}", question, options, final, final_thought)


# ------------------------------------------------------------------------------------------- sharegpt (CoF, V2)
def _sharegpt_row(record, row_id, fmt, store, tool, question_of, turn_of, resize_step=1) -> Trajectory:
    """A `{messages: [{role, content}], images: [paths]}` row (LLaMA-Factory's sharegpt: CoF, DeepEyesV2):
    `images` the original then every image a user turn shows, in the order of the `<image>` tags.
    `turn_of(text, replay)` reads an assistant turn: (its thought, the function reading its calls, whether it is
    code)."""
    images = record.get("images") or []
    if not images:
        raise SkipRow("missing_image", "no images")
    messages = record.get("messages") or []
    counts = [(m.get("role"), content_images(m.get("content"))) for m in messages]
    _question_images(counts, len(images))
    original = store.open(images[0], "images[0]")
    users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    question, options = question_of(users[0])
    replay = _Replay(original, images, store, question, tool, resize_step)
    final = ""
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            final = content_text(message.get("content"))
            thought, read, code = turn_of(final, replay)
            replay.turn(thought, read, _shown_after(counts, position), code)
    return replay.finish(row_id, fmt.removesuffix("_sft"), question, options, final, thought_of(final))


def read_cof_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """Chain-of-Focus SFT (HF `xintongzhang/CoF-SFT-Data-5.4k`): `cof_sft_data*.json`, images relative to the
    folder or to its `images/` (LLaMA-Factory's `dataset_dir`), or in `images.zip`; DeepEyes-style
    `image_zoom_in_tool` calls in absolute pixels of the first image, with labels."""
    store = ImageStore(root)

    def turn_of(text, replay):
        thought = thought_of(text)

        def read():
            calls = []
            for payload in _TOOL_CALL.findall(text):
                call = json_call(payload)
                if call.get("name", "image_zoom_in_tool") != "image_zoom_in_tool":
                    raise SkipRow("unsupported_tool", f"tool {call.get('name')!r}")
                arguments = call.get("arguments")
                if not isinstance(arguments, dict):
                    raise SkipRow("malformed_call", f"no arguments in {payload.strip()[:80]!r}")
                calls.append(_Call(numbers(arguments.get("bbox_2d")), arguments.get("label")))
            return calls

        return thought, read, False

    for file in _files(root, ("cof_sft_data*.json", "cof_sft_data*.jsonl", "cof_sft_data*.parquet"), "cof_sft"):
        records = _table_records(file, "cof_sft: a JSON list of {messages, images}")

        def row(record, index, file=file):
            # CoF's crops are resized by Qwen's smart_resize (zoomin_vision_tool.py `do_crop`): sides in steps of 28
            return _sharegpt_row(record, record.get("id", f"{file.stem}-{index}"), "cof_sft", store, tool,
                                 cof_question, turn_of, resize_step=28)  # fmt: skip

        yield from _rows(file, records, ("messages", "images"), "cof_sft", row)


# DeepEyesV2's user turn (evaluation/inference_demo/inference_demo.py, USER_PROMPT): the question, then its format
# and tool instructions from "You must put your answer inside".
DEEPEYES_V2_INSTRUCTIONS = ("You must put your answer inside",)


def read_deepeyes_v2_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """DeepEyesV2 SFT (HF `honglyhly/DeepEyesV2_SFT`): `json/sft_part_*.json`, images relative to the folder
    `images.zip` unzips to (or inside it); the zoom is Python on `image_1`, the original, un-resized image, run in a
    Jupyter kernel (`deepeyesv2.py`): read with `CodeReader`. Search calls (`<tool_call>`) are another tool."""
    store = ImageStore(root)

    def question_of(text):
        return dataset_question(text, cut_from=DEEPEYES_V2_INSTRUCTIONS)

    patterns = [f"{folder}sft_part_*.{suffix}" for folder in ("json/", "") for suffix in ("json", "jsonl", "parquet")]
    for file in _files(root, patterns, "deepeyes_v2_sft"):
        records = _table_records(file, "deepeyes_v2_sft: a JSON list of {messages, images}")

        def row(record, index, file=file):
            reader: list[CodeReader] = []  # one kernel per row, made once the original's size is known

            def turn_of(text, replay):
                if not reader:
                    reader.append(CodeReader(replay.original.size, {}, "display", original_as="image_1"))
                blocks = _CODE_BLOCK.findall(text)
                if not blocks and _TOOL_CALL.search(text):
                    raise SkipRow("unsupported_tool", "a search call (<tool_call>)")
                fences = _PYTHON_FENCE.findall(blocks[-1]) if blocks else []

                def read():
                    return _shown_calls(reader[0].run(fences[-1])) if fences else []

                return thought_of(text), read, bool(blocks)

            return _sharegpt_row(record, record.get("id", f"{file.stem}-{index}"), "deepeyes_v2_sft", store, tool,
                                 question_of, turn_of)  # fmt: skip

        yield from _rows(file, records, ("messages", "images"), "deepeyes_v2_sft", row)


def _shown_calls(shown: Sequence[Shown]) -> list[_Call]:
    """The crops code showed, as calls; an image it showed that is not a crop of the original (the whole image, a
    rotation) is another tool's output."""
    calls = []
    for item in shown:
        picture = item.picture
        if picture.extent is None:
            raise SkipRow("unsupported_tool", f"the code shows an image made by {picture.made_by}")
        if not picture.cropped:
            raise SkipRow("unsupported_tool", f"the code shows the whole image ({picture.made_by})")
        calls.append(_Call(picture.extent, figure=item.via == "figure"))
    return calls


# ------------------------------------------------------------------------------------------------------ Thyme
# Thyme's user turn (Thyme's eval/VLMEvalKit/vlmeval/vlm/thyme/utils.py, `generate_prompt_final_qa`): the question,
# then the sandbox's "### User Image Path/Size" lines and its output-format block; cut from the first.
THYME_CUT = ("### User Image Path", "### User Image Size", "### **Output Format")
THYME_INSTRUCTIONS = ("Please select the correct answer from the options above",)
_THYME_PATH = re.compile(r'User Image Path:\**\s*"([^"]*)"')
_SANDBOX_OUTPUT = re.compile(r"\s*<sandbox_output>(.*?)</sandbox_output>", re.DOTALL)


# Thyme's sandbox rewrites the code before it runs it (Thyme's eval/VLMEvalKit/vlmeval/vlm/thyme/sandbox.py, the same in
# swift/trainers/sandbox.py; `_sandboxed_execution_target`), and the release shows the images the rewritten code made.
THYME_MIN_CROP = 64  # sandbox.py MIN_CROP_DIMENSION
THYME_COORD_NAMES = ("x1", "y1", "x2", "y2", "left", "top", "right", "bottom")
THYME_BOX_NAMES = ("crop_box", "bbox", "box", "coordinates", "coords", "crop_coords", "left_crop_coords",
                   "right_crop_coords", "top_crop_coords", "bottom_crop_coords")  # fmt: skip
THYME_CV_NAMES = ("cv", "cv4", "cv3", "CV")  # sandbox.py `OpenCVNamespaceTransformer`: read as `cv2.`


def thyme_clamp(box: Sequence[float], size: tuple[int, int]) -> list[float]:
    """The box Thyme's sandbox crops for a literal `x1, y1, x2, y2` (sandbox.py `CropCoordinateTransformer.
    _clamp_coordinates`): ordered, clamped into the original image, each side widened to `THYME_MIN_CROP` px from its
    low edge (pulled back from the far edge). The sandbox measures against the original's size whatever image the
    code crops."""
    width, height = float(size[0]), float(size[1])
    out = []
    for lo, hi, extent in ((box[0], box[2], width), (box[1], box[3], height)):
        lo, hi = min(lo, hi), max(lo, hi)
        lo, hi = min(max(0.0, lo), extent - 1.0 if extent > 0 else 0.0), min(max(0.0, hi), extent)
        if lo >= hi and extent > 0:
            lo = max(0.0, hi - 1.0)
            if hi <= lo:
                hi = min(extent, lo + 1.0)
        if extent > 0 and hi - lo < THYME_MIN_CROP:
            if extent < THYME_MIN_CROP:
                lo, hi = 0.0, extent
            else:
                hi = lo + THYME_MIN_CROP
                if hi > extent:
                    hi, lo = extent, max(0.0, extent - THYME_MIN_CROP)
        if extent > 0 and lo >= hi:
            hi = min(extent, lo + 1.0)
        out.append((lo, hi))
    (x1, x2), (y1, y2) = out
    return [x1, y1, x2, y2]


class ThymeSandboxRewrites(ast.NodeTransformer):
    """What Thyme's sandbox does to a code block before running it, on the parsed code (sandbox.py):
    - `image_path = "<a string>"` binds the original's path (`ImagePathTransformer`: a literal that is no image file
      on the sandbox's disk becomes the input image's path; the rewrite runs before `/mnt/data/temp_processed_images/`
      is replaced by the output folder, so even a path to an earlier block's output is read as the original);
    - four numbers unpacked into names of which one is x1, y1, x2, y2, left, top, right or bottom, or a tuple of four
      numbers bound to one of `THYME_BOX_NAMES`, are clamped by `thyme_clamp` and rounded, when that changes them
      (`CropCoordinateTransformer`, its cases 1 and 2; its case 3, a literal `image[y1:y2, x1:x2]`, tests for
      `ast.Index`, which Python 3.9+ no longer produces, so it never runs);
    - `cv.`, `cv3.`, `cv4.` and `CV.` become `cv2.` (`OpenCVNamespaceTransformer`).
    """

    def __init__(self, size: tuple[int, int], original_path: OriginalPath):
        self.size, self.original_path = size, original_path

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        target, value = node.targets[0], node.value
        if len(node.targets) == 1 and isinstance(target, ast.Name) and target.id == "image_path":
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.value = ast.copy_location(ast.Constant(self.original_path), value)
        elif len(node.targets) == 1 and isinstance(value, ast.Tuple) and len(value.elts) == 4:
            unpacked = (
                isinstance(target, ast.Tuple)
                and len(target.elts) == 4
                and all(isinstance(t, ast.Name) for t in target.elts)
                and any(t.id.lower() in THYME_COORD_NAMES for t in target.elts)
            )
            literals = [v.value if isinstance(v, ast.Constant) else None for v in value.elts]
            if (unpacked or (isinstance(target, ast.Name) and target.id in THYME_BOX_NAMES)) and all(
                isinstance(v, int | float) for v in literals
            ):
                clamped = [int(round(v)) for v in thyme_clamp(literals, self.size)]
                if clamped != [int(round(v)) for v in literals]:
                    value.elts = [ast.copy_location(ast.Constant(v), old) for v, old in zip(clamped, value.elts)]
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        if isinstance(node.value, ast.Name) and node.value.id in THYME_CV_NAMES:
            node.value = ast.copy_location(ast.Name("cv2", ast.Load()), node.value)
        return self.generic_visit(node)


def read_thyme_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """Thyme SFT (HF `Kwai-Keye/Thyme-SFT`): parquet shards (`data/<split>-*.parquet`, the splits
    `wo_thinking_thyme_single_round`, `2round`, `computation`), or the JSON/JSONL Thyme's README converts them to;
    records `image` (base64 strings or paths: the original, then each processed image), `question`, `response`.
    The code runs on the original at `image_path` (Thyme's sandbox.py): read with `CodeReader`."""
    store = ImageStore(root)
    patterns = ("*.parquet", "data/*.parquet", "*.json", "*.jsonl", "data/*.json", "data/*.jsonl")
    for file in _files(root, patterns, "thyme_sft"):
        records = _table_records(file, "Thyme's SFT records {image, question, response}")
        row = functools.partial(_thyme_row, store=store, tool=tool, stem=file.stem)
        yield from _rows(file, records, ("image", "question", "response"), "thyme_sft", row)


def _thyme_row(record: dict, index: int, *, store: ImageStore, tool: ToolConfig, stem: str) -> Trajectory:
    images = record.get("image") or []
    images = [images] if isinstance(images, str) else list(images)
    if not images:
        raise SkipRow("missing_image", "no images")
    text = str(record.get("question") or "")
    response = str(record.get("response") or "")
    counts = [("user", text.count(_IMAGE_TAG))]
    blocks, position = [], 0
    for code in _THYME_CODE.finditer(response):
        output = _SANDBOX_OUTPUT.match(response, code.end())
        end = output.end() if output else code.end()
        shown = output.group(1).count(_IMAGE_TAG) if output else 0
        blocks.append((thought_of(response[position : code.start()]), code.group(1), shown))
        counts += [("assistant", 0), ("user", shown)]
        position = end
    _question_images(counts, len(images))
    original = store.open(images[0], "image[0]")
    question, options = dataset_question(text, THYME_INSTRUCTIONS, cut_from=THYME_CUT)
    path = _THYME_PATH.search(text)
    original_path = OriginalPath(path.group(1) if path else "")
    # the sandbox's globals and preset locals (sandbox.py `sandbox_globals`, `sandbox_locals`)
    names = {"cv2": _Module("cv2"), "np": _Module("numpy"), "numpy": _Module("numpy"), "Image": _Module("PIL.Image"),
             "os": _Module("os"), "math": _Module("math"), "json": _Module("json"), "re": _Module("re"),
             "random": _Module("random"), "string": _Module("string"),
             "image_path": original_path, "temp_output_dir": OPAQUE}  # fmt: skip
    reader = CodeReader(original.size, names, "save", rewrite=ThymeSandboxRewrites(original.size, original_path).visit)
    replay = _Replay(original, images, store, question, tool)
    for thought, code, shown in blocks:
        replay.turn(thought, lambda code=code: _shown_calls(reader.run(code)), shown, code=True)
    final = response[position:]
    return replay.finish(f"{stem}-{index}", "thyme", question, options, response, thought_of(final))


# ------------------------------------------------------------------------------------------------ PixelReasoner
def read_pixel_reasoner_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """PixelReasoner SFT (HF `TIGER-Lab/PixelReasoner-SFT-Data`): JSON lists of `{qid, message_list}` in Qwen's
    message format, images relative to the folder (or in `images.zip`); `crop_image_normalized` calls on a 1-based
    `target_image` over the images the conversation has shown. Rows whose question shows a video are skipped."""
    store = ImageStore(root)
    for file in _files(root, ("*.json", "*.jsonl", "*.parquet"), "pixel_reasoner_sft"):
        records = _table_records(file, "PixelReasoner's SFT json")

        def row(record, index, file=file):
            return _pixel_reasoner_row(record, record.get("qid", f"{file.stem}-{index}"), store, tool)

        yield from _rows(file, records, ("message_list",), "pixel_reasoner_sft", row)


def _pixel_reasoner_row(record: dict, row_id: str, store: ImageStore, tool: ToolConfig) -> Trajectory:
    messages = record["message_list"]
    parts = [(m.get("role"), content_parts(m.get("content"))) for m in messages]
    if any(kind == "video" for _, message in parts for kind, _ in message):
        raise SkipRow("video", "a video part")  # their select_frames tool and frame indices are not the crop's
    images = [value for role, message in parts if role == "user" for kind, value in message if kind == "image"]
    counts = [(role, sum(kind == "image" for kind, _ in message)) for role, message in parts]
    _question_images(counts, len(images))
    original = store.open(images[0], "message_list image 1")
    users = [m for m in messages if m.get("role") == "user"]
    question, options = dataset_question(content_text(users[0].get("content")))
    # Their crops are resized by Qwen's smart_resize (experience_maker.py `resize_cropped`): sides in steps of 28.
    replay = _Replay(original, images, store, question, tool, resize_step=28)
    final = ""
    for position, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        text = content_text(message.get("content"))

        def read(text=text):
            payloads = _TOOL_CALL.findall(text)
            if not payloads:
                return []
            call = json_call(payloads[-1])  # their loop runs the last call of a turn (`parse_last_tool`)
            if call.get("name") != "crop_image_normalized":
                raise SkipRow("unsupported_tool", f"tool {call.get('name')!r}")
            arguments = call.get("arguments") or {}
            box, target = numbers(arguments.get("bbox_2d")), arguments.get("target_image", 1)
            if not isinstance(target, int) or isinstance(target, bool) or not 1 <= target <= len(replay.images):
                raise SkipRow("bad_source", f"target_image {target!r} with {len(replay.images)} images so far")
            extent, (width, height) = replay.images[target - 1]
            if not all(v < 1 for v in box):  # their rule: pixels of the target image as shown unless all four < 1
                box = [box[0] / width, box[1] / height, box[2] / width, box[3] / height]
            pad = PIXEL_REASONER_PAD
            padded = [min(max(v, 0.0), 1.0) for v in (box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad)]
            return [_Call(relative_to_pixels(padded, extent))]

        replay.turn(thought_of(text), read, _shown_after(counts, position))
        final = text
    return replay.finish(row_id, "pixel_reasoner", question, options, final, thought_of(final))


# The readers by `--format` name. Each names the files and fields it expects in its own `LayoutError`s.
FORMATS: dict[str, Callable[[Path, ToolConfig], Iterator[Trajectory | SkipRow]]] = {
    "mini_o3_coldstart": read_mini_o3_coldstart,
    "cof_sft": read_cof_sft,
    "pixel_reasoner_sft": read_pixel_reasoner_sft,
    "deepeyes_v2_sft": read_deepeyes_v2_sft,
    "thyme_sft": read_thyme_sft,
}
