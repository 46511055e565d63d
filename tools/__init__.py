"""The zoom-in tool the agent calls: its geometry (`zoom_in`), its TRL environment and call record (`env`), and its
settings and their checkpoint record (`config`)."""

from __future__ import annotations

import functools

from tools.config import (
    BOX_CONVENTIONS,
    RECORD_NAME,
    PixelBudget,
    ToolConfig,
    ToolConfigRecorder,
    VerifierConfig,
    read_record,
    record_mismatches,
    refuse_mismatch,
    warn_on_mismatch,
    write_record,
)
from tools.env import ENVIRONMENTS, RelativeZoomInEnv, ZoomCall, ZoomInEnv, environment_tools, executed_calls
from tools.zoom_in import (
    TOOL_NAME,
    ToolError,
    box_contains,
    boxes_overlap,
    crop,
    crop_box,
    seen_size,
    tool_call_text,
    validate_label,
)


def make_environment_factory(config: ToolConfig, image_budget: PixelBudget) -> functools.partial:
    """A zero-argument factory for TRL's `environment_factory`: the `ZoomInEnv` of `config.box_convention` and
    `accept_img_idx` in the processor's frame (`utils.models.pixel_budget(processor)`)."""
    return functools.partial(ENVIRONMENTS[config.box_convention, config.accept_img_idx], config, image_budget)


__all__ = [
    "BOX_CONVENTIONS",
    "RECORD_NAME",
    "TOOL_NAME",
    "PixelBudget",
    "RelativeZoomInEnv",
    "ToolConfig",
    "ToolConfigRecorder",
    "ToolError",
    "VerifierConfig",
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
    "refuse_mismatch",
    "seen_size",
    "tool_call_text",
    "validate_label",
    "warn_on_mismatch",
    "write_record",
]
