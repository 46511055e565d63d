"""Thyme SFT (HF `Kwai-Keye/Thyme-SFT`): parquet shards (`data/<split>-*.parquet`), or the JSON/JSONL Thyme's README
converts them to; records `image` (base64 strings or paths: the original, then each processed image), `question`,
`response`. The code runs on the original at `image_path` after the sandbox's rewrites (`ThymeSandboxRewrites`):
read with `CodeReader`."""

from __future__ import annotations

import ast
import bisect
import functools
import math
import re
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

from data.converters.code_reader import OPAQUE, CodeReader, Module, OriginalPath, parse_or_skip, shown_calls
from data.converters.common import IMAGE_TAG, ImageStore, SkipRow, read_release, thought_of
from data.converters.replay import Replay, question_images
from data.questions import dataset_question
from data.rows import Trajectory
from tools import ToolConfig

# Thyme's user turn (Thyme's eval/VLMEvalKit/vlmeval/vlm/thyme/utils.py, `generate_prompt_final_qa`): the question,
# then the sandbox's "### User Image Path/Size" lines and its output-format block; cut from the first.
THYME_CUT = ("### User Image Path", "### User Image Size", "### **Output Format")
THYME_INSTRUCTIONS = ("Please select the correct answer from the options above",)
_THYME_PATH = re.compile(r'User Image Path:\**\s*"([^"]*)"')
# Each <code> block, a fence optional: Thyme's model.py `code_regex`,
# r"<code>\s*(?:```\s*)?(?:python\s*)?([\s\S]*?)\s*(?:```\s*)?</code>" (IGNORECASE), read by `thyme_code_blocks`
# without it: on `<code>` and 2,000 spaces it backtracked for 69 s, on 40,000 `<code>` with no `</code>` for minutes.
_CODE_OPEN, _CODE_CLOSE = re.compile("<code>", re.IGNORECASE), re.compile("</code>", re.IGNORECASE)
_CODE_HEAD = re.compile(r"\s*(?:```\s*)?(?:python\s*)?", re.IGNORECASE)  # the regex's greedy head, never backtracked
_SPACE = re.compile(r"\s*")
# A block's output, right after it (only whitespace between): r"\s*<sandbox_output>(.*?)</sandbox_output>".
OUTPUT_OPEN, OUTPUT_CLOSE = "<sandbox_output>", "</sandbox_output>"


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


def _fenced_code(block: str) -> str:
    """What `code_regex`'s lazy group takes of `block` (the text between `<code>` and `</code>`): its head (`\\s*`,
    a fence, `python`) matches greedily, as the regex tries it first and the group can always take the rest; the group
    then ends where the shortest tail matching `\\s*(?:```\\s*)?` begins: the whitespace before a closing fence
    and the fence, when the fence lies past the head, else the trailing whitespace."""
    head = _CODE_HEAD.match(block).end()
    end = len(block.rstrip())  # `str.isspace` and re's `\\s` agree on every code point
    fence = end - 3
    if block.endswith("```", 0, end) and fence >= head:
        end = max(head, len(block[:fence].rstrip()))
    return block[head : max(head, end)]


def thyme_code_blocks(response: str) -> tuple[list[tuple[str, str, int]], int]:
    """The code blocks of a Thyme response as Thyme's `code_regex` finds them (`re.finditer`), each as (the text
    between the previous block, or its output, and it; its code; the `<image>` tags of its `<sandbox_output>`), and
    where the text after the last block starts. Linear time: the tags are found with `str.find`-like scans that
    never go back, a block's output's close is the first `</sandbox_output>` after it (one forward scan serves every
    block: outputs left open share the first close after them), and its images are counted from the tags' positions
    (`<image>` cannot overlap itself, so `str.count` on the output is the tags lying inside it)."""
    blocks, position, search = [], 0, 0
    next_close = 0  # the first `</sandbox_output>` at or after the last output's start; -1: none after it
    images: list[int] | None = None
    while (opened := _CODE_OPEN.search(response, search)) is not None:
        closed = _CODE_CLOSE.search(response, opened.end())
        if closed is None:  # no later `<code>` has a close either
            break
        code, end, shown = _fenced_code(response[opened.end() : closed.start()]), closed.end(), 0
        start = _SPACE.match(response, closed.end()).end()
        if response.startswith(OUTPUT_OPEN, start):
            start += len(OUTPUT_OPEN)
            if next_close != -1 and next_close < start:
                next_close = response.find(OUTPUT_CLOSE, start)
            if next_close != -1:
                if images is None:
                    images = [m.start() for m in re.finditer(re.escape(IMAGE_TAG), response)]
                last = next_close - len(IMAGE_TAG)  # the last start of a tag that ends inside the output
                shown = bisect.bisect_right(images, last) - bisect.bisect_left(images, start)
                end = next_close + len(OUTPUT_CLOSE)
        blocks.append((response[position : opened.start()], code, shown))
        position, search = end, closed.end()
    return blocks, position


def parse_thyme_code(code: str) -> ast.Module:
    """A code block as Thyme's sandbox reads it: stripped (model.py, `code_match.group(1).strip()`), its first line
    given the second's indentation (sandbox.py `align_first_line_to_second`: the strip took the first line's), then
    dedented and stripped (`_sandboxed_execution_target`). So a block indented inside its fence runs as written. The
    sandbox then reformats with autopep8, not repeated here: code that still does not parse is `malformed_call`."""
    lines = code.strip().splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if len(filled) >= 2:
        first, second = lines[filled[0]], lines[filled[1]]
        indent = second[: len(second) - len(second.lstrip(" "))]
        if first[: len(first) - len(first.lstrip(" "))] != indent:
            lines[filled[0]] = indent + first.lstrip(" ")
    return parse_or_skip(textwrap.dedent("\n".join(lines)).strip())


class ThymeSandboxRewrites(ast.NodeTransformer):
    """What Thyme's sandbox does to a code block before running it (sandbox.py), on the parsed code: a string bound to
    `image_path` becomes the original's path (`ImagePathTransformer`); four literal numbers unpacked into names of
    which one is in `THYME_COORD_NAMES`, or bound to one of `THYME_BOX_NAMES`, are clamped by `thyme_clamp`
    (`CropCoordinateTransformer`'s cases 1 and 2; its case 3 tests for `ast.Index`, which Python 3.9+ never produces);
    `THYME_CV_NAMES` read as `cv2` (`OpenCVNamespaceTransformer`)."""

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
            # an infinite literal (1e999) fails the sandbox's `int(round(...))`, which then runs the code unclamped
            finite = all(isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)) for v in literals)
            if (unpacked or (isinstance(target, ast.Name) and target.id in THYME_BOX_NAMES)) and finite:
                clamped = [int(round(v)) for v in thyme_clamp(literals, self.size)]
                if clamped != [int(round(v)) for v in literals]:
                    value.elts = [ast.copy_location(ast.Constant(v), old) for v, old in zip(clamped, value.elts)]
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        if isinstance(node.value, ast.Name) and node.value.id in THYME_CV_NAMES:
            node.value = ast.copy_location(ast.Name("cv2", ast.Load()), node.value)
        return self.generic_visit(node)


def read_thyme_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)
    patterns = ("*.parquet", "data/*.parquet", "*.json", "*.jsonl", "data/*.json", "data/*.jsonl")
    row = functools.partial(_row, store=store, tool=tool)
    yield from read_release(root, "thyme_sft", patterns, ("image", "question", "response"),
                            "Thyme's SFT records {image, question, response}", row)  # fmt: skip


def _row(record: dict, index: int, file: Path, *, store: ImageStore, tool: ToolConfig) -> Trajectory:
    images = record.get("image") or []
    images = [images] if isinstance(images, str) else list(images)
    if not images:
        raise SkipRow("missing_image", "no images")
    text = str(record.get("question") or "")
    response = str(record.get("response") or "")
    found, position = thyme_code_blocks(response)
    blocks = [(thought_of(before), code, shown) for before, code, shown in found]
    counts = [("user", text.count(IMAGE_TAG))] + [
        turn for *_, shown in found for turn in (("assistant", 0), ("user", shown))
    ]
    question_images(counts, len(images))
    original = store.open(images[0], "image[0]")
    question, options = dataset_question(text, THYME_INSTRUCTIONS, cut_from=THYME_CUT)
    path = _THYME_PATH.search(text)
    original_path = OriginalPath(path.group(1) if path else "")
    # the sandbox's globals and preset locals (sandbox.py `sandbox_globals`, `sandbox_locals`)
    names = {"cv2": Module("cv2"), "np": Module("numpy"), "numpy": Module("numpy"), "Image": Module("PIL.Image"),
             "os": Module("os"), "math": Module("math"), "json": Module("json"), "re": Module("re"),
             "random": Module("random"), "string": Module("string"),
             "image_path": original_path, "temp_output_dir": OPAQUE}  # fmt: skip
    rewrite = ThymeSandboxRewrites(original.size, original_path).visit
    reader = CodeReader(original.size, names, "save", rewrite=rewrite, parse=parse_thyme_code)
    replay = Replay(original, images, store, question, tool)
    for thought, code, shown in blocks:
        replay.turn(thought, lambda code=code: shown_calls(reader.run(code)), shown, code=True)
    final = response[position:]
    return replay.finish(f"{file.stem}-{index}", "thyme", options, response, thought_of(final))
