"""Chain-of-Focus SFT (HF `xintongzhang/CoF-SFT-Data-5.4k`): `cof_sft_data*.json` in LLaMA-Factory's sharegpt,
images relative to the folder or its `images/` (or in `images.zip`); `image_zoom_in_tool` calls in absolute pixels of
the first image, with labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from data.converters.common import TOOL_CALL, ImageStore, SkipRow, json_call, numbers, read_release, thought_of
from data.converters.replay import ReadCall, sharegpt_row
from data.questions import cof_question
from data.rows import Trajectory
from tools import ToolConfig


def _turn(text: str, replay) -> tuple:
    def read() -> list[ReadCall]:
        calls = []
        for payload in TOOL_CALL.findall(text):
            call = json_call(payload)
            if call.get("name", "image_zoom_in_tool") != "image_zoom_in_tool":
                raise SkipRow("unsupported_tool", f"tool {call.get('name')!r}")
            arguments = call.get("arguments")
            if not isinstance(arguments, dict):
                raise SkipRow("malformed_call", f"no arguments in {payload.strip()[:80]!r}")
            calls.append(ReadCall(numbers(arguments.get("bbox_2d")), arguments.get("label")))
        return calls

    return thought_of(text), read, False


def read_cof_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)

    def row(record: dict, index: int, file: Path) -> Trajectory:
        # CoF's crops are resized by Qwen's smart_resize (zoomin_vision_tool.py `do_crop`): sides in steps of 28
        return sharegpt_row(record, record.get("id", f"{file.stem}-{index}"), "cof_sft", store, tool, cof_question,
                            _turn, resize_step=28)  # fmt: skip

    patterns = ("cof_sft_data*.json", "cof_sft_data*.jsonl", "cof_sft_data*.parquet")
    yield from read_release(root, "cof_sft", patterns, ("messages", "images"),
                            "cof_sft: a JSON list of {messages, images}", row)  # fmt: skip
