"""`tool_config.json`, the record of a run's `ToolConfig` that every checkpoint carries, read by the next stage.

Each checkpoint records the settings it was trained with, pixel budgets resolved from the processor (and, for RL, the
rollout budget). A run from a checkpoint takes those values unless the recipe or command line says otherwise, and
then warns with both values: a policy evaluated with another pixel budget sees its coordinates in another frame,
silently. A different `box_convention` is an error instead (`refuse_mismatch`): every box would be read in a frame it
was not written in.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tools.config import ToolConfig

RECORD_NAME = "tool_config.json"


def write_record(output_dir: str | os.PathLike, tool: dict[str, Any], **rollout: Any) -> Path:
    """Write `tool_config.json` into `output_dir`: the tool settings (`ToolConfig.as_record`) and RL's rollout budget
    (`max_completion_length`, `max_tool_calling_iterations`), which evaluation replays."""
    path = Path(output_dir) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tool": tool, "rollout": rollout}, indent=2) + "\n", encoding="utf-8")
    return path


# Settings earlier checkpoints recorded that no longer exist, ignored when read (`environment`: the zoom-in tool).
RETIRED_SETTINGS = ("environment",)
# Settings earlier checkpoints did not record, read as what they were trained with: boxes in pixels, no `img_idx`.
UNRECORDED_SETTINGS = {"box_convention": "pixels", "accept_img_idx": False}
# Recorded settings a run may not change: boxes read in another frame than they were trained in crop the wrong region
# on every call, silently (a pixel budget changed only rescales the frame, which a warning covers).
MUST_MATCH = ("box_convention",)


def read_record(checkpoint: str | os.PathLike | None) -> dict[str, dict[str, Any]] | None:
    """The record of a local checkpoint folder, or None (no record, or a hub name: nothing is downloaded for it)."""
    if checkpoint is None:
        return None
    path = Path(checkpoint) / RECORD_NAME
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    tool = UNRECORDED_SETTINGS | {k: v for k, v in record.get("tool", {}).items() if k not in RETIRED_SETTINGS}
    if "crop_min_pixels" not in tool and "min_pixels" in tool:  # recorded before it existed: floored at min_pixels
        tool["crop_min_pixels"] = tool["min_pixels"]
    known = {f.name for f in fields(ToolConfig)}
    if unknown := set(tool) - known:
        raise ValueError(f"{path}: unknown tool setting(s) {sorted(unknown)}; known: {sorted(known)}")
    return {"tool": tool, "rollout": record.get("rollout", {})}


def record_mismatches(record: dict[str, dict[str, Any]], values: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{name: (recorded, used)}` for every recorded setting that `values` sets to something else."""
    recorded = {**record["tool"], **record["rollout"]}
    return {k: (recorded[k], values[k]) for k in recorded if k in values and values[k] != recorded[k]}


def refuse_mismatch(checkpoint: str | os.PathLike, mismatches: dict[str, tuple[Any, Any]]) -> None:
    """Raise, naming both values, when a setting of `MUST_MATCH` differs from what `checkpoint` was trained with."""
    if refused := {name: mismatches[name] for name in MUST_MATCH if name in mismatches}:
        lines = "; ".join(
            f"{name}: trained with {old!r}, the recipe or command line sets {new!r}"
            for name, (old, new) in refused.items()
        )
        raise ValueError(
            f"{checkpoint} was trained with other tool settings than this run's ({RECORD_NAME}): {lines}. The policy "
            "writes its boxes in the convention it was trained with; leave the setting out (the record's is taken) "
            "or start from a checkpoint trained with the one you set."
        )


def warn_on_mismatch(checkpoint: str | os.PathLike, mismatches: dict[str, tuple[Any, Any]]) -> None:
    """One warning naming every setting that differs from what `checkpoint` was trained with, and both values."""
    if mismatches:
        lines = "; ".join(
            f"{name}: trained with {old!r}, now {new!r}" for name, (old, new) in sorted(mismatches.items())
        )
        warnings.warn(f"{checkpoint} was trained with other tool settings ({RECORD_NAME}): {lines}", stacklevel=2)


class ToolConfigRecorder(TrainerCallback):
    """Writes the tool record into every checkpoint folder the trainer saves (`checkpoint-<step>/`)."""

    def __init__(self, tool: dict[str, Any], **rollout: Any):
        self.tool, self.rollout = tool, rollout

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_record(Path(args.output_dir) / f"checkpoint-{state.global_step}", self.tool, **self.rollout)
