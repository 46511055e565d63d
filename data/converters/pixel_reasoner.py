"""PixelReasoner SFT (HF `TIGER-Lab/PixelReasoner-SFT-Data`): JSON lists of `{qid, message_list}` in Qwen's message
format, images relative to the folder (or in `images.zip`); `crop_image_normalized` calls on a 1-based `target_image`
over the images the conversation has shown, padded as their RL tool pads or not, whichever the release's crops show
(`PIXEL_REASONER_PADDING`). Rows whose question shows a video are skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from data.converters.common import (
    ImageStore,
    SkipRow,
    brief,
    content_parts,
    content_text,
    json_call,
    listed,
    numbers,
    read_release,
    relative_to_pixels,
    thought_of,
    tool_calls,
)
from data.converters.crop_check import Readings
from data.converters.replay import ReadCall, Replay, question_images, shown_after
from data.questions import dataset_question
from data.rows import Trajectory
from tools import ToolConfig

# The padding of each box per side, in units of the target image, by reading: their RL tool pads by 0.1
# (`crop_image_normalized(padding=0.1)`); whether the SFT release's crops were cut so is not published. Each row is
# read both ways, and the reading whose crops match the release's is kept (`crop_check.Readings`).
PIXEL_REASONER_PADDING = {"padded_0.1": 0.1, "unpadded": 0.0}


def read_pixel_reasoner_sft(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)
    readings = Readings(list(PIXEL_REASONER_PADDING))

    def row(record: dict, index: int, file: Path) -> Trajectory:
        row_id = record.get("qid", f"{file.stem}-{index}")
        return readings.read(lambda reading: _row(record, row_id, store, tool, PIXEL_REASONER_PADDING[reading]))

    yield from read_release(root, "pixel_reasoner_sft", ("*.json", "*.jsonl", "*.parquet"), ("message_list",),
                            "PixelReasoner's SFT json", row)  # fmt: skip


def _row(record: dict, row_id: str, store: ImageStore, tool: ToolConfig, pad: float) -> Trajectory:
    messages = listed(record, "message_list", dict)
    parts = [(m.get("role"), content_parts(m.get("content"))) for m in messages]
    if any(kind == "video" for _, message in parts for kind, _ in message):
        raise SkipRow("video", "a video part")  # their select_frames tool and frame indices are not the crop's
    images = [value for role, message in parts if role == "user" for kind, value in message if kind == "image"]
    counts = [(role, sum(kind == "image" for kind, _ in message)) for role, message in parts]
    question_images(counts, len(images))
    original = store.open(images[0], "message_list image 1")
    users = [m for m in messages if m.get("role") == "user"]
    question, options = dataset_question(content_text(users[0].get("content")))
    # Their crops are resized by Qwen's smart_resize (experience_maker.py `resize_cropped`): sides in steps of 28.
    replay = Replay(original, images, store, question, tool, resize_step=28)
    final = ""
    for position, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        text = content_text(message.get("content"))

        def read(text=text):
            payloads = tool_calls(text)
            if not payloads:
                return []
            call = json_call(payloads[-1])  # their loop runs the last call of a turn (`parse_last_tool`)
            if call.get("name") != "crop_image_normalized":
                raise SkipRow("unsupported_tool", f"tool {brief(call.get('name'))}")
            arguments = call.get("arguments") or {}
            box, target = numbers(arguments.get("bbox_2d")), arguments.get("target_image", 1)
            if not isinstance(target, int) or isinstance(target, bool) or not 1 <= target <= len(replay.images):
                raise SkipRow("bad_source", f"target_image {brief(target)} with {len(replay.images)} images so far")
            extent, (width, height) = replay.images[target - 1]
            if not all(v < 1 for v in box):  # their rule: pixels of the target image as shown unless all four < 1
                box = [box[0] / width, box[1] / height, box[2] / width, box[3] / height]
            padded = [min(max(v, 0.0), 1.0) for v in (box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad)]
            return [ReadCall(relative_to_pixels(padded, extent))]

        replay.turn(thought_of(text), read, shown_after(counts, position))
        final = text
    return replay.finish(row_id, "pixel_reasoner", options, final, thought_of(final))
