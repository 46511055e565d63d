"""The tools the agent calls, one module each, registered by name (`registry`): the zoom-in tool
(`zoom_in`: its geometry), the rotate tool (`rotate`); their TRL environment and the call record (`env`), and their
settings and checkpoint record (`config`). Adding a tool: docs/tools.md."""

from __future__ import annotations

from tools.config import BOX_CONVENTIONS, PixelBudget, ToolConfig, VerifierConfig
from tools.env import ZoomCall, ZoomInEnv, calls_per_tool, environment_tools, executed_calls
from tools.environments import ENVIRONMENTS, RelativeZoomInEnv, make_environment_factory, replay_call
from tools.record import (
    RECORD_NAME,
    ToolConfigRecorder,
    read_record,
    record_mismatches,
    refuse_mismatch,
    warn_on_mismatch,
    write_record,
)
from tools.registry import DEFAULT_TOOLS, Tool, get_tools, register_tool
from tools.rotate import ROTATE
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

__all__ = [
    "BOX_CONVENTIONS",
    "DEFAULT_TOOLS",
    "ENVIRONMENTS",
    "ROTATE",
    "Tool",
    "calls_per_tool",
    "get_tools",
    "register_tool",
    "replay_call",
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
