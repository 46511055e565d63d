"""DeepEyesV2 SFT (HF `honglyhly/DeepEyesV2_SFT`): `json/sft_part_*.json` in LLaMA-Factory's sharegpt, images
relative to the folder `images.zip` unzips to (or inside it); the zoom is Python on `image_1`, the un-resized
original, run in a Jupyter kernel (`deepeyesv2.py`): read with `CodeReader`. Searches (`<tool_call>`) are another
tool."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from data.converters.code_reader import CodeReader, shown_calls
from data.converters.common import TOOL_CALL, ImageStore, SkipRow, read_release, thought_of
from data.converters.replay import sharegpt_row
from data.questions import dataset_question
from data.rows import Trajectory
from tools import ToolConfig

# DeepEyesV2's user turn (evaluation/inference_demo/inference_demo.py, USER_PROMPT): the question, then its format
# and tool instructions from "You must put your answer inside".
DEEPEYES_V2_INSTRUCTIONS = ("You must put your answer inside",)
# It runs the last <code> block of a turn, and in it the last ```python fenced block (`extract_python_code`).
_CODE_BLOCK = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_PYTHON_FENCE = re.compile(r"```python\s*\n(.*?)\n```", re.DOTALL)


def read_deepeyes_v2_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)

    def question_of(text: str) -> tuple[str, list[str]]:
        return dataset_question(text, cut_from=DEEPEYES_V2_INSTRUCTIONS)

    def row(record: dict, index: int, file: Path) -> Trajectory:
        reader: list[CodeReader] = []  # one kernel per row, made once the original's size is known

        def turn_of(text, replay):
            if not reader:
                reader.append(CodeReader(replay.original.size, {}, "display", original_as="image_1"))
            blocks = _CODE_BLOCK.findall(text)
            if not blocks and TOOL_CALL.search(text):
                raise SkipRow("unsupported_tool", "a search call (<tool_call>)")
            fences = _PYTHON_FENCE.findall(blocks[-1]) if blocks else []

            def read():
                return shown_calls(reader[0].run(fences[-1])) if fences else []

            return thought_of(text), read, bool(blocks)

        return sharegpt_row(record, record.get("id", f"{file.stem}-{index}"), "deepeyes_v2_sft", store, tool,
                            question_of, turn_of)  # fmt: skip

    patterns = [f"{folder}sft_part_*.{suffix}" for folder in ("json/", "") for suffix in ("json", "jsonl", "parquet")]
    yield from read_release(root, "deepeyes_v2_sft", patterns, ("messages", "images"),
                            "deepeyes_v2_sft: a JSON list of {messages, images}", row)  # fmt: skip
