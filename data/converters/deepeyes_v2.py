"""DeepEyesV2 SFT (HF `honglyhly/DeepEyesV2_SFT`): `json/sft_part_*.json` in LLaMA-Factory's sharegpt, images
relative to the folder `images.zip` unzips to (or inside it); the zoom is Python on `image_1`, the un-resized
original, run in a Jupyter kernel (`deepeyesv2.py`): read with `CodeReader`. Searches (`<tool_call>`) are another
tool."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from data.converters.code_reader import CodeReader, shown_calls
from data.converters.common import ImageStore, SkipRow, read_release, thought_of, tool_calls
from data.converters.replay import sharegpt_row
from data.questions import dataset_question
from data.rows import Trajectory
from data.task import tag_contents
from tools import ToolConfig

# DeepEyesV2's user turn (evaluation/inference_demo/inference_demo.py, USER_PROMPT): the question, then its format
# and tool instructions from "You must put your answer inside".
DEEPEYES_V2_INSTRUCTIONS = ("You must put your answer inside",)
# It runs the last <code> block of a turn, and in it the last ```python fenced block (`extract_python_code`).
# Read by `tag_contents` and `python_fences`, which find what its regexes `<code>(.*?)</code>` and
# ```python\s*\n(.*?)\n``` (both DOTALL) find in linear time: they rescanned to the end for every block left open.
_FENCE_OPEN, _FENCE_CLOSE = "```python", "\n```"
_SPACE = re.compile(r"\s*")


def python_fences(code: str) -> list[str]:
    """The code of each ```python fenced block of `code`, as `re.findall` finds them with DeepEyesV2's pattern
    ```python\\s*\\n(.*?)\\n``` (DOTALL): the code starts after the last newline of the whitespace after the opening,
    and ends at the first newline and fence after that."""
    fences, position = [], 0
    while (start := code.find(_FENCE_OPEN, position)) != -1:
        head = start + len(_FENCE_OPEN)
        space_end = _SPACE.match(code, head).end()
        newline = code.rfind("\n", head, space_end)
        if newline == -1:  # no newline to open the code: this opening is none, a later one may be
            position = head
            continue
        end = code.find(_FENCE_CLOSE, newline + 1)
        if end != -1:
            fences.append(code[newline + 1 : end])
            position = end + len(_FENCE_CLOSE)
            continue
        # The regex gives the whitespace back a newline at a time: the newline ending it may yet close the code
        # (```python\n\n``` is one empty block), opened by the newline before it.
        before = code.rfind("\n", head, newline)
        if before == -1 or newline != space_end - 1 or not code.startswith("```", space_end):
            break  # no later opening has a close either
        fences.append(code[before + 1 : newline])
        position = space_end + len("```")
    return fences


def read_deepeyes_v2_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)

    def question_of(text: str) -> tuple[str, list[str]]:
        return dataset_question(text, cut_from=DEEPEYES_V2_INSTRUCTIONS)

    def row(record: dict, index: int, file: Path) -> Trajectory:
        reader: list[CodeReader] = []  # one kernel per row, made once the original's size is known

        def turn_of(text, replay):
            if not reader:
                reader.append(CodeReader(replay.original.size, {}, "display", original_as="image_1"))
            blocks = tag_contents(text, "<code>", "</code>")
            if not blocks and tool_calls(text):
                raise SkipRow("unsupported_tool", "a search call (<tool_call>)")
            fences = python_fences(blocks[-1]) if blocks else []

            def read():
                return shown_calls(reader[0].run(fences[-1])) if fences else []

            return thought_of(text), read, bool(blocks)

        return sharegpt_row(record, record.get("id", f"{file.stem}-{index}"), "deepeyes_v2_sft", store, tool,
                            question_of, turn_of)  # fmt: skip

    patterns = [f"{folder}sft_part_*.{suffix}" for folder in ("json/", "") for suffix in ("json", "jsonl", "parquet")]
    yield from read_release(root, "deepeyes_v2_sft", patterns, ("messages", "images"),
                            "deepeyes_v2_sft: a JSON list of {messages, images}", row)  # fmt: skip
