"""Readers for the public zoom-trajectory SFT sets, each turning its rows into `Trajectory` records: the original
image, the question, the answer, and per zoom-in call its thought, its box in the **original image's pixels** and a
label. `python -m data.convert` writes them as a dataset `sft.py` trains on (`data.trajectories` replays the calls
through the real tool, mapping each box into the frame the model sees, as it does for the synthetic gold calls).

Every dataset writes its boxes in its own frame (read from each project's own loading and conversion code, listed in
docs/data.md, "Sources"); the readers compose them into the original's pixels:

| format | call | box as written | composed as |
|---|---|---|---|
| `mini_o3_coldstart` | `<grounding>{"bbox_2d", "source"}</grounding>` | relative [0, 1] of `source`: the original or observation i (the crop of action i-1) | relative x the source's extent |
| `cof_sft` | `<tool_call>` of `image_zoom_in_tool` with a `label` | absolute pixels of the first image | as is |
| `pixel_reasoner_sft` | `<tool_call>` of `crop_image_normalized{bbox_2d, target_image}` | normalised [0, 1] of `target_image` (1-based: 1 the original, k the crop of call k-1) when all four values are < 1, else pixels of it; their tool pads 0.1 of the target image per side | the padded box (the crop the next thought saw) x the target's extent |
| `deepeyes_v2_sft` | Python `image_1.crop((x1, y1, x2, y2))` | absolute pixels of the original, PIL order | as is |
| `thyme_sft` | Python `image[y1:y2, x1:x2]` | absolute pixels of the original, numpy order | reordered to x1, y1, x2, y2 |

A row that cannot be converted is skipped and counted by reason (`SKIP_REASONS`), never given an invented box or
label. Labels: the dataset's own where it has one (CoF), else `derive_label`'s short noun phrase from the thought
before the call, else from the question; each call records its `label_source`; every label is held to the tool's
limits (`ToolConfig.max_label_words`, `max_label_chars`). The answer is the last assistant turn's, read by
`data.task.extract_answer`, the rule the rewards and evaluation read a completion's answer with.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from PIL import Image

from data.task import extract_answer
from tools import ToolConfig, ToolError, validate_label

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in the original image's pixels

# Why a row was skipped; the converter's stats count every one.
SKIP_REASONS = {
    "malformed_call": "a call's JSON or code literal could not be read",
    "missing_image": "the row's original image is missing or unreadable",
    "box_outside_image": "a call's box, composed into the original, is empty or leaves the image",
    "bad_source": "a call zooms on an image the trajectory has not produced yet",
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


class SkipRow(Exception):
    """A row the converter leaves out; `reason` is a key of `SKIP_REASONS`."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in SKIP_REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


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
    if any(v != v or v in (float("inf"), float("-inf")) for v in out):
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
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_GROUNDING = re.compile(r"<grounding>(.*?)</grounding>", re.DOTALL)
_PIL_CROP = re.compile(r"image_1\.crop\(\s*\(([^()]*)\)\s*\)")
_NUMPY_CROP = re.compile(r"\bimage\s*\[\s*([^\[\]:,]+):([^\[\]:,]+)\s*,\s*([^\[\]:,]+):([^\[\]:,]+)\]")
_IMAGE_TAG = re.compile(r"<image>")


def thought_of(text: str) -> str:
    """The `<think>` text of an assistant turn, else its text before the first call or answer tag."""
    match = _THINK.search(text)
    if match:
        return match.group(1).strip()
    return re.split(r"<tool_call>|<grounding>|<code>|<answer>", text, maxsplit=1)[0].strip()


def question_of(text: str) -> str:
    """A user turn's question: `<image>` tags and a leading "Question:" removed."""
    text = _IMAGE_TAG.sub("", text).strip()
    return re.sub(r"^question:\s*", "", text, flags=re.IGNORECASE).strip()


def json_call(text: str) -> dict:
    """The JSON object inside a call tag, or `SkipRow("malformed_call")`."""
    try:
        value = json.loads(text.strip())
    except json.JSONDecodeError as err:
        raise SkipRow("malformed_call", f"{err}: {text.strip()[:80]!r}") from None
    if not isinstance(value, dict):
        raise SkipRow("malformed_call", f"not an object: {text.strip()[:80]!r}")
    return value


def literal_numbers(text: str, count: int = 4) -> list[float]:
    """Comma-separated number literals from code (`1250, 1030, 1360, 1070`), or `SkipRow("malformed_call")`."""
    try:
        return numbers([ast.literal_eval(part.strip()) for part in text.split(",")], count)
    except (ValueError, SyntaxError):
        raise SkipRow("malformed_call", f"not number literals: {text!r}") from None


def open_image(value: Any, root: Path) -> Image.Image:
    """An RGB image from a path (relative to `root`), a `{bytes, path}` cell, raw bytes or a base64 string; a
    missing or unreadable one raises `SkipRow("missing_image")`."""
    try:
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path") or value.get("image")
        if isinstance(value, bytes | bytearray):
            image = Image.open(io.BytesIO(value))
        elif isinstance(value, str) and (root / value).is_file():
            image = Image.open(root / value)
        elif isinstance(value, str) and len(value) > 256:  # not a path: Thyme's base64 images
            image = Image.open(io.BytesIO(base64.b64decode(value.split(",", 1)[-1])))
        else:
            raise SkipRow("missing_image", repr(value)[:120])
        return image.convert("RGB")
    except (OSError, ValueError) as err:
        raise SkipRow("missing_image", str(err)) from None


# ----------------------------------------------------------------------------------------------------- readers
def _finish(row_id, source, image, question, final_text, calls, final_thought) -> Trajectory:
    """The row as a `Trajectory`, its answer read from `final_text` (the last assistant turn) by the repo's one rule,
    `data.task.extract_answer`; a row without a question or an answer is a `SkipRow`."""
    if not question:
        raise SkipRow("empty_question")
    answer = extract_answer(final_text)
    if not answer:
        raise SkipRow("empty_answer")
    return Trajectory(str(row_id), source, image, question, answer, calls, final_thought)


def _records(path: Path, what: str) -> list[dict]:
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise LayoutError(f"{path}: not a JSON file ({err}); {what}") from None
    if not isinstance(records, list) or (records and not isinstance(records[0], dict)):
        raise LayoutError(f"{path}: expected a JSON list of objects; {what}")
    return records


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


def read_mini_o3_coldstart(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """Mini-o3's cold start: parquet shards whose `conversations` is a JSON sharegpt string and `images` the
    original then the observations; a call's box is relative to its `source` image."""
    for file in _files(root, ("*.parquet", "data/*.parquet"), "mini_o3_coldstart"):
        table = pq.read_table(file)
        _check_keys(dict.fromkeys(table.column_names), ("conversations", "images"), str(file))
        for index, record in enumerate(table.to_pylist()):
            row_id = f"{file.stem}-{record.get('sample_index', index)}-{record.get('rollout_index', 0)}"
            try:
                yield _mini_o3_row(record, row_id, root, tool)
            except SkipRow as skip:
                yield skip


def _mini_o3_row(record: dict, row_id: str, root: Path, tool: ToolConfig) -> Trajectory:
    try:
        turns = json.loads(record["conversations"])
    except (json.JSONDecodeError, TypeError):
        try:  # their own preprocessing eval()s it; literal_eval reads the same Python literals safely
            turns = ast.literal_eval(record["conversations"])
        except (ValueError, SyntaxError):
            raise SkipRow("malformed_call", "conversations is neither JSON nor a Python literal") from None
    images = record.get("images") or []
    if not images:
        raise SkipRow("missing_image", "no images")
    image = open_image(images[0], root)
    humans = [t.get("value", "") for t in turns if t.get("from") == "human"]
    question = question_of(humans[0]) if humans else ""
    extents = [(0, 0, *image.size)]  # observation i's extent in the original; 0 is the original itself
    calls, final = [], ""
    for turn in turns:
        if turn.get("from") != "gpt":
            continue
        text = turn.get("value", "")
        thought = thought_of(text)
        for payload in _GROUNDING.findall(text):
            call = json_call(payload)
            box, source = numbers(call.get("bbox_2d")), call.get("source", "original_image")
            match = re.fullmatch(r"observation_(\d+)", str(source))
            index = int(match.group(1)) if match else 0 if source == "original_image" else -1
            if not 0 <= index < len(extents):
                raise SkipRow("bad_source", f"source {source!r} before it exists ({len(extents) - 1} observations)")
            composed = to_image_box(relative_to_pixels(box, extents[index]), image.size)
            extents.append(composed)
            calls.append(TrajectoryCall(composed, thought, *call_label(call.get("label"), thought, question, tool)))
        final = text
    return _finish(row_id, f"mini_o3/{record.get('data_source', '')}", image, question, final, calls,
                   thought_of(final) if extract_answer(final) is not None else "")  # fmt: skip


def _sharegpt_messages(
    file: Path, root: Path, fmt: str, row_call: Callable[[str, dict, Image.Image, str], list]
) -> Iterator[Trajectory | SkipRow]:
    """Readers of `{messages: [{role, content}], images: [paths]}` lists (CoF, DeepEyesV2): `row_call(text, record,
    image, question)` reads one assistant turn's calls. A row's id is its own, else `<file stem>-<index>`, so rows of
    several part files never share one."""
    records = _records(file, f"{fmt}: a JSON list of {{messages, images}}")
    for index, record in enumerate(records):
        if index == 0:
            _check_keys(record, ("messages", "images"), f"{fmt} record 0")
        try:
            images = record.get("images") or []
            if not images:
                raise SkipRow("missing_image", "no images")
            image = open_image(images[0], root)
            users = [m.get("content", "") for m in record["messages"] if m.get("role") == "user"]
            question = question_of(users[0]) if users else ""
            calls, final = [], ""
            for message in record["messages"]:
                if message.get("role") == "assistant":
                    calls += row_call(message.get("content", ""), record, image, question)
                    final = message.get("content", "")
            yield _finish(record.get("id", f"{file.stem}-{index}"), fmt.removesuffix("_sft"), image, question, final,
                          calls, thought_of(final))  # fmt: skip
        except SkipRow as skip:
            yield skip


def read_cof_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """Chain-of-Focus SFT: `cof_sft_data.json`, DeepEyes-style `image_zoom_in_tool` calls in absolute pixels of the
    first image, with labels."""
    (file,) = _files(root, ("cof_sft_data.json",), "cof_sft")

    def calls(text, record, image, question):
        out = []
        for payload in _TOOL_CALL.findall(text):
            arguments = json_call(payload).get("arguments")
            if not isinstance(arguments, dict):
                raise SkipRow("malformed_call", f"no arguments in {payload.strip()[:80]!r}")
            box = to_image_box(numbers(arguments.get("bbox_2d")), image.size)
            thought = thought_of(text)
            out.append(TrajectoryCall(box, thought, *call_label(arguments.get("label"), thought, question, tool)))
        return out

    yield from _sharegpt_messages(file, root, "cof_sft", calls)


def read_deepeyes_v2_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """DeepEyesV2 SFT: `json/sft_part_*.json`; the zoom is Python, `image_1.crop((x1, y1, x2, y2))` in pixels of the
    original, un-resized image."""

    def calls(text, record, image, question):
        thought = thought_of(text)
        out = []
        for literal in _PIL_CROP.findall(text):
            box = to_image_box(literal_numbers(literal), image.size)
            out.append(TrajectoryCall(box, thought, *call_label(None, thought, question, tool)))
        return out

    for file in _files(root, ("json/sft_part_*.json", "sft_part_*.json"), "deepeyes_v2_sft"):
        yield from _sharegpt_messages(file, root, "deepeyes_v2_sft", calls)


def read_thyme_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """Thyme SFT: records with `image` (base64: the original first), `question`, `response`; the crop is cv2 code,
    `image[y1:y2, x1:x2]` in pixels of the original (numpy order)."""
    for file in _files(root, ("*.json", "*.jsonl", "data/*.json", "data/*.jsonl"), "thyme_sft"):
        text = file.read_text(encoding="utf-8")
        records = [json.loads(line) for line in text.splitlines() if line.strip()] if file.suffix == ".jsonl" else (
            _records(file, "Thyme's SFT json"))  # fmt: skip
        for index, record in enumerate(records):
            if index == 0:
                _check_keys(record, ("image", "question", "response"), f"thyme_sft {file.name} record 0")
            try:
                yield _thyme_row(record, f"{file.stem}-{index}", root, tool)
            except SkipRow as skip:
                yield skip


_CODE = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_SANDBOX = re.compile(r"<sandbox_output>.*?</sandbox_output>", re.DOTALL)


def _thyme_row(record: dict, row_id: str, root: Path, tool: ToolConfig) -> Trajectory:
    images = record.get("image") or []
    images = [images] if isinstance(images, str) else images
    if not images:
        raise SkipRow("missing_image", "no images")
    image = open_image(images[0], root)
    # The question carries the sandbox's "### User Image Path/Size" lines; the question proper is the rest.
    lines = question_of(record.get("question") or "").splitlines()
    question = "\n".join(line for line in lines if not line.lstrip().startswith("###")).strip()
    response = _SANDBOX.sub("", record.get("response") or "")
    calls, start = [], 0
    for code in _CODE.finditer(response):
        thought = thought_of(response[start : code.start()])  # the text since the previous code block
        start = code.end()
        for y1, y2, x1, x2 in _NUMPY_CROP.findall(code.group(1)):
            (top, bottom), (left, right) = literal_numbers(f"{y1},{y2}", 2), literal_numbers(f"{x1},{x2}", 2)
            box = to_image_box((left, top, right, bottom), image.size)
            calls.append(TrajectoryCall(box, thought, *call_label(None, thought, question, tool)))
    return _finish(row_id, "thyme", image, question, response, calls, thought_of(response[start:]))


def read_pixel_reasoner_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    """PixelReasoner SFT: records `{qid, message_list}` in Qwen's message format; `crop_image_normalized` calls on a
    1-based `target_image`."""
    for file in _files(root, ("*.json",), "pixel_reasoner_sft"):
        for index, record in enumerate(_records(file, "PixelReasoner's SFT json")):
            if index == 0:
                _check_keys(record, ("message_list",), f"pixel_reasoner_sft {file.name} record 0")
            try:
                yield _pixel_reasoner_row(record, record.get("qid", f"{file.stem}-{index}"), root, tool)
            except SkipRow as skip:
                yield skip


def _parts(message: dict) -> list[dict]:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def _pixel_reasoner_row(record: dict, row_id: str, root: Path, tool: ToolConfig) -> Trajectory:
    messages = record["message_list"]
    user_images = [p.get("image") for m in messages if m.get("role") == "user" for p in _parts(m) if "image" in p]
    if not user_images:
        raise SkipRow("missing_image", "no image part")
    image = open_image(user_images[0], root)
    users = [m for m in messages if m.get("role") == "user"]
    question = question_of("".join(p.get("text") or "" for p in _parts(users[0]))) if users else ""
    extents = [(0, 0, *image.size)]  # target_image k is extents[k - 1]
    calls, final = [], ""
    for message in messages:
        if message.get("role") != "assistant":
            continue
        text = "".join(p.get("text") or "" for p in _parts(message))
        thought = thought_of(text)
        for payload in _TOOL_CALL.findall(text):
            arguments = json_call(payload).get("arguments") or {}
            box = numbers(arguments.get("bbox_2d"))
            target = arguments.get("target_image", 1)
            if not isinstance(target, int) or not 1 <= target <= len(extents):
                raise SkipRow("bad_source", f"target_image {target!r} with {len(extents)} images so far")
            extent = extents[target - 1]
            width, height = extent[2] - extent[0], extent[3] - extent[1]
            if not all(v < 1 for v in box):  # their rule: pixels of the target image unless all four are < 1
                box = [box[0] / width, box[1] / height, box[2] / width, box[3] / height]
            pad = PIXEL_REASONER_PAD
            padded = [min(max(v, 0.0), 1.0) for v in (box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad)]
            composed = to_image_box(relative_to_pixels(padded, extent), image.size)
            extents.append(composed)
            calls.append(TrajectoryCall(composed, thought, *call_label(None, thought, question, tool)))
        final = text
    return _finish(row_id, "pixel_reasoner", image, question, final, calls, thought_of(final))


# The readers by `--format` name. Each names the files and fields it expects in its own `LayoutError`s.
FORMATS: dict[str, Callable[[Path, ToolConfig], Iterator[Trajectory | SkipRow]]] = {
    "mini_o3_coldstart": read_mini_o3_coldstart,
    "cof_sft": read_cof_sft,
    "pixel_reasoner_sft": read_pixel_reasoner_sft,
    "deepeyes_v2_sft": read_deepeyes_v2_sft,
    "thyme_sft": read_thyme_sft,
}
