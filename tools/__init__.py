"""Tools the agent can call. `ENVIRONMENTS` maps the name a recipe uses to the environment class."""

from __future__ import annotations

import functools

from tools.env import ZoomCall, ZoomInEnv, environment_tools, executed_calls
from tools.zoom_in import TOOL_NAME, LabelLimits, ToolError, crop, crop_box, resize_to_budget, seen_size

ENVIRONMENTS = {"zoom_in": ZoomInEnv}


def make_environment_factory(
    name: str, *, min_pixels: int, max_pixels: int, factor: int = 28, **limits
) -> functools.partial:
    """A zero-argument factory for TRL's `environment_factory`, bound to the processor's pixel budget."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"environment: unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}")
    return functools.partial(ENVIRONMENTS[name], min_pixels=min_pixels, max_pixels=max_pixels, factor=factor, **limits)


__all__ = [
    "ENVIRONMENTS",
    "TOOL_NAME",
    "LabelLimits",
    "ToolError",
    "ZoomCall",
    "ZoomInEnv",
    "crop",
    "crop_box",
    "environment_tools",
    "executed_calls",
    "make_environment_factory",
    "resize_to_budget",
    "seen_size",
]
