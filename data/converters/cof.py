"""Chain-of-Focus SFT (HF `xintongzhang/CoF-SFT-Data-5.4k`): `cof_sft_data*.json` in LLaMA-Factory's sharegpt,
images relative to the folder or its `images/` (or in `images.zip`); `image_zoom_in_tool` calls in absolute pixels of
the first image, with labels, cropped as written or enlarged 1.5x, whichever the release's crops show
(`COF_ENLARGEMENT`)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path

from data.converters.common import ImageStore, SkipRow, brief, json_call, numbers, read_release, thought_of, tool_calls
from data.converters.crop_check import Readings
from data.converters.replay import ReadCall, sharegpt_row
from data.questions import cof_question
from data.rows import Trajectory
from tools import ToolConfig

# The factor each box is enlarged by about its centre before the crop, by reading: CoF's RL tool and evaluation enlarge
# by 1.5 (`zoomin_vision_tool.py` `enlarge_bbox`, `vllm_inference.py`); whether its SFT release's crops were cut so is
# not published. Each row is read both ways, and the reading whose crops match the release's is kept
# (`crop_check.Readings`).
COF_ENLARGEMENT = {"as_written": 1.0, "enlarged_1.5": 1.5}


def enlarge_box(box: Sequence[float], factor: float, size: tuple[int, int]) -> list[float]:
    """`box` enlarged `factor` times about its centre, clamped to the image, truncated to whole pixels (CoF's
    `enlarge_bbox`); as written for a factor of 1."""
    if factor == 1:
        return list(box)
    (x0, y0, x1, y1), (width, height) = box, size
    cx, cy, bw, bh = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) * factor, (y1 - y0) * factor
    return [
        int(max(0, cx - bw / 2)),
        int(max(0, cy - bh / 2)),
        int(min(width, cx + bw / 2)),
        int(min(height, cy + bh / 2)),
    ]


def _turn(text: str, replay, enlarge: float = 1.0) -> tuple:
    def read() -> list[ReadCall]:
        calls = []
        for payload in tool_calls(text):
            call = json_call(payload)
            if call.get("name", "image_zoom_in_tool") != "image_zoom_in_tool":
                raise SkipRow("unsupported_tool", f"tool {brief(call.get('name'))}")
            arguments = call.get("arguments")
            if not isinstance(arguments, dict):
                raise SkipRow("malformed_call", f"no arguments in {payload.strip()[:80]!r}")
            box = enlarge_box(numbers(arguments.get("bbox_2d")), enlarge, replay.original.size)
            calls.append(ReadCall(box, arguments.get("label")))
        return calls

    return thought_of(text), read, False


def read_cof_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)
    readings = Readings(list(COF_ENLARGEMENT))

    def row(record: dict, index: int, file: Path) -> Trajectory:
        # CoF's crops are resized by Qwen's smart_resize (zoomin_vision_tool.py `do_crop`): sides in steps of 28
        def read(reading: str) -> Trajectory:
            turn = functools.partial(_turn, enlarge=COF_ENLARGEMENT[reading])
            return sharegpt_row(record, record.get("id", f"{file.stem}-{index}"), "cof_sft", store, tool,
                                cof_question, turn, resize_step=28)  # fmt: skip

        return readings.read(read)

    patterns = ("cof_sft_data*.json", "cof_sft_data*.jsonl", "cof_sft_data*.parquet")
    yield from read_release(root, "cof_sft", patterns, ("messages", "images"),
                            "cof_sft: a JSON list of {messages, images}", row)  # fmt: skip
