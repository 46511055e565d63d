"""The zoom-in tool the agent calls: its geometry (`zoom_in`), its TRL environment and call record (`env`), and its
settings (`config`). It is the only tool: R_sem, the zoom metrics and the token-budget check read every tool
response as a zoom-in's."""

from __future__ import annotations

import functools

from tools.config import (
    CLIP_RESIZE,
    RECORD_NAME,
    PixelBudget,
    ToolConfig,
    ToolConfigRecorder,
    read_record,
    record_mismatches,
    warn_on_mismatch,
    write_record,
)
from tools.env import ZoomCall, ZoomInEnv, environment_tools, executed_calls
from tools.zoom_in import (
    TOOL_NAME,
    ToolError,
    box_contains,
    boxes_overlap,
    crop,
    crop_box,
    resize_to_budget,
    seen_size,
    tool_call_text,
    validate_label,
)


def make_environment_factory(config: ToolConfig, image_budget: PixelBudget) -> functools.partial:
    """A zero-argument factory for TRL's `environment_factory`: a `ZoomInEnv` in the processor's frame
    (`utils.models.pixel_budget(processor)`)."""
    return functools.partial(ZoomInEnv, config, image_budget)


__all__ = [
    "CLIP_RESIZE",
    "RECORD_NAME",
    "TOOL_NAME",
    "PixelBudget",
    "ToolConfig",
    "ToolConfigRecorder",
    "ToolError",
    "ZoomCall",
    "ZoomInEnv",
    "box_contains",
    "boxes_overlap",
    "crop",
    "crop_box",
    "environment_tools",
    "executed_calls",
    "make_environment_factory",
    "read_record",
    "record_mismatches",
    "resize_to_budget",
    "seen_size",
    "tool_call_text",
    "validate_label",
    "warn_on_mismatch",
    "write_record",
]
