"""Mini-o3's cold start (HF `Mini-o3/Mini-o3-Coldstart-Dataset`): parquet shards whose `conversations` is a sharegpt
list written as a string, `images` the original then every observation the conversation shows; `<grounding>` calls
relative [0, 1] to their `source`, the original or `observation_i` (the i-th image shown)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

from data.converters.common import (
    ImageStore,
    SkipRow,
    brief,
    content_images,
    content_text,
    json_call,
    listed,
    numbers,
    read_release,
    relative_to_pixels,
    thought_of,
    without_nulls,
)
from data.converters.replay import ReadCall, Replay, question_images, shown_after
from data.questions import dataset_question
from data.rows import Trajectory
from data.task import extract_answer, tag_contents
from tools import ToolConfig


def read_mini_o3_coldstart(root: Path, tool: ToolConfig) -> Iterator[Trajectory | SkipRow]:
    store = ImageStore(root)

    def row(record: dict, index: int, file: Path) -> Trajectory:
        row_id = f"{file.stem}-{record.get('sample_index', index)}-{record.get('rollout_index', 0)}"
        return _row(record, row_id, store, tool)

    patterns = ("*.parquet", "data/*.parquet")
    yield from read_release(root, "mini_o3_coldstart", patterns, ("conversations", "images"),
                            "Mini-o3's cold-start shards", row)  # fmt: skip


def _row(record: dict, row_id: str, store: ImageStore, tool: ToolConfig) -> Trajectory:
    conversations = record.get("conversations")
    if not isinstance(conversations, str):
        raise SkipRow("malformed_row", f"conversations is of type {type(conversations).__name__}, not a string")
    try:
        turns = json.loads(conversations)
    except (ValueError, RecursionError):  # not JSON, or past its parser's depth or digits
        try:  # their own preprocessing eval()s it; literal_eval reads the same Python literals safely
            turns = ast.literal_eval(conversations)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise SkipRow("malformed_call", "conversations is neither JSON nor a Python literal") from None
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise SkipRow("malformed_call", "conversations is not a list of turns")
    turns = without_nulls(turns)
    images = listed(record, "images")
    if not images:
        raise SkipRow("missing_image", "no images")
    original = store.open(images[0], "images[0]")
    roles = {"human": "user", "gpt": "assistant"}
    counts = [(roles.get(t.get("from"), "system"), content_images(t.get("value"))) for t in turns]
    question_images(counts, len(images))
    humans = [content_text(t.get("value")) for t in turns if t.get("from") == "human"]
    question, options = dataset_question(humans[0])  # the same words as Mini-o3's RL `problem` (`data.rl_sets`)
    replay = Replay(original, images, store, question, tool)
    final = ""
    for position, turn in enumerate(turns):
        if turn.get("from") != "gpt":
            continue
        text = content_text(turn.get("value"))

        def read(text=text):
            calls = []
            for payload in tag_contents(text, "<grounding>", "</grounding>"):
                call = json_call(payload)
                box, source = numbers(call.get("bbox_2d")), call.get("source", "original_image")
                # observation_i is the i-th image the conversation showed (function_tools.py: observations[i]);
                # a failed call showed none, so it is not counted (vllm_rollout_spmd.py appends only crops)
                match = re.fullmatch(r"observation_(\d+)", str(source))
                index = int(match.group(1)) if match else 0 if source == "original_image" else -1
                if not 0 <= index < len(replay.images):
                    raise SkipRow(
                        "bad_source", f"source {brief(source)}: {len(replay.images) - 1} observations so far"
                    )
                calls.append(ReadCall(relative_to_pixels(box, replay.images[index][0]), call.get("label")))
            return calls

        replay.turn(thought_of(text), read, shown_after(counts, position))
        final = text
    final_thought = thought_of(final) if extract_answer(final) is not None else ""
    return replay.finish(row_id, f"mini_o3/{record.get('data_source', '')}", options, final, final_thought)
