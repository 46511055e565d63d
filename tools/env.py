"""`ZoomInEnv`: the zoom-in tool as a stateful environment for TRL's `environment_factory`, which makes one per
rollout, calls `reset(**row)`, exposes its public methods as tools (schema from signature and docstring) and hands it
to the reward functions. Training (R_sem) and evaluation both read a rollout's calls through `executed_calls`, so both
count and score exactly the same calls.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from numbers import Real
from typing import Any

from PIL import Image

from tools.config import PixelBudget, ToolConfig
from tools.registry import Tool
from tools.rotate import turned, unturn_box
from tools.zoom_in import (
    TOOL_NAME,
    ToolError,
    box_frame,
    crop_box,
    observation,
    resize_to_budget,
    seen_size,
    validate_label,
)


@dataclass
class ZoomCall:
    """One tool call of a rollout, as the model made it and as the tool answered: MAPO's (y_t, I_t) pair when `ok`;
    the one record of a call, for training (R_sem) and evaluation alike."""

    turn: int  # t: 1-based index among this rollout's tool calls
    arguments: Any  # what the model passed (the parsed JSON arguments); None when TRL rejected the call first
    label: str | None  # the validated label, or the raw value when the label itself was rejected
    box: tuple[int, int, int, int] | None  # cropped region in original pixels (None when rejected)
    crop: Image.Image | None  # the crop as shown to the model (resized to the crop budget)
    error: str | None = None
    name: str = TOOL_NAME

    @property
    def ok(self) -> bool:
        return self.error is None


class ZoomInEnv:
    """`image_zoom_in_tool` over the row's image, boxes in absolute pixels of the image the model sees
    (`box_convention` "pixels"; `RelativeZoomInEnv` reads Qwen3-VL's 0-1000 grid).

    Built by `tools.make_environment_factory(config, image_budget)`, with the processor's budget, so the model's frame
    is the one the processor really produced. One class per convention (and per `accept_img_idx`) because TRL renders
    the tool's schema, the description of `bbox_2d` included, from the method's signature and docstring.
    """

    box_convention = "pixels"
    accept_img_idx = False

    def __init__(self, config: ToolConfig, image_budget: PixelBudget):
        if (config.box_convention, config.accept_img_idx) != (self.box_convention, self.accept_img_idx):
            raise ValueError(
                f"{type(self).__name__} reads boxes in {self.box_convention!r} with accept_img_idx="
                f"{self.accept_img_idx}, but the config sets {config.box_convention!r}, {config.accept_img_idx}: build "
                "it with tools.make_environment_factory(config, image_budget), which picks the environment of both."
            )
        self.config, self.image_budget = config, image_budget
        self.crop_budget = config.crop_budget(image_budget)
        self.image: Image.Image | None = None
        self.seen_size: tuple[int, int] | None = None  # the resized image the model sees, in pixels
        self.box_frame: tuple[int, int] | None = None  # the frame its bbox_2d is written in (`tools.box_frame`)
        self.calls: list[ZoomCall] = []
        # Every image shown (the original, then each crop or turned image), as (its region of the original, its box
        # frame): `img_idx`; and the quarter turns counter-clockwise each is shown at (`tools.rotate`).
        self.shown: list[tuple[tuple[int, int, int, int], tuple[int, int]]] = []
        self.turns: list[int] = []
        self.last_error: str | None = None  # the last tool call's error, or None (`replay_call`)

    def reset(self, **row) -> None:
        """Start a rollout on `row["image"]` (or the first of `row["images"]`); returns no extra observation."""
        image = row.get("image")
        if image is None and row.get("images"):
            image = row["images"][0]
        if not isinstance(image, Image.Image):
            raise TypeError(f"ZoomInEnv.reset needs a PIL image in the row's 'image' column; got {type(image)}.")
        self.image = image.convert("RGB") if image.mode != "RGB" else image
        self.seen_size = seen_size(self.image.size, self.image_budget)
        self.box_frame = box_frame(self.seen_size, self.box_convention)
        self.calls = []
        self.shown = [((0, 0, *self.image.size), self.box_frame)]
        self.turns = [0]
        self.last_error = None

    def image_zoom_in_tool(self, bbox_2d: list[float], label: str) -> list[dict]:
        """Zoom in on a region of the image by cropping it with a bounding box, to see small details clearly.

        Args:
            bbox_2d: The region to zoom in on, as [x1, y1, x2, y2] in pixels of the image you see, where (x1, y1) is
                the top-left corner and (x2, y2) the bottom-right corner.
            label: A few words naming what you expect to see in the box, e.g. "the star" or "the small sign".
        """
        return self._zoom(bbox_2d, label)

    def _zoom(self, bbox_2d: list[float], label: str, img_idx: Any = None) -> list[dict]:
        """The tool's work: `bbox_2d` read in the frame of the image `img_idx` names (`self.shown`; None or 0: the
        original), as the model saw it (turned, `tools.rotate`), composed into the original's pixels."""
        config, turn = self.config, len(self.calls) + 1
        arguments = {"bbox_2d": bbox_2d, "label": label} | ({} if img_idx is None else {"img_idx": img_idx})
        try:
            clean_label = validate_label(label, config.max_label_words, config.max_label_chars)
            index = self._image_index(img_idx)
            (x1, y1, x2, y2), frame = self.shown[index]
            turns = self.turns[index]
            size = (x2 - x1, y2 - y1)
            seen = size if turns % 2 == 0 else size[::-1]  # the region as the model saw it
            box = crop_box(seen, bbox_2d, seen_size=frame, min_side=config.min_side, max_aspect=config.max_aspect)
            left, top, right, bottom = unturn_box(box, size, turns)
            box = (x1 + left, y1 + top, x1 + right, y1 + bottom)
        except ToolError as err:
            raw_label = label if isinstance(label, str) else None
            self.calls.append(ZoomCall(turn, arguments, raw_label, None, None, str(err)))
            self.last_error = str(err)
            return observation(None, f"Error: {err} Fix the call, or answer if you can.")
        crop = resize_to_budget(turned(self.image.crop(box), turns), self.crop_budget)
        self.calls.append(ZoomCall(turn, arguments, clean_label, box, crop))
        self.shown.append((box, box_frame(crop.size, self.box_convention)))
        self.turns.append(turns)
        self.last_error = None
        return observation(crop, f"Zoomed in on {list(bbox_2d)}.")

    def _image_index(self, img_idx: Any) -> int:
        """`img_idx` as an index into `self.shown`, or a `ToolError` saying which values it takes. A negative one
        counts from the last image shown, as Qwen-Agent's `images[img_idx]` reads it (-1: the last)."""
        if img_idx is None:
            return 0
        valid = (
            f"0 (the original image) to {len(self.shown) - 1} (the image the last zoom returned), or -1 for the last"
        )
        # Python's JSON reads NaN and Infinity, which `int` refuses with an error of its own: refused here first (an
        # int is finite however long, and `math.isfinite` overflows on a long one).
        number = isinstance(img_idx, Real) and not isinstance(img_idx, bool)
        if not number or not (isinstance(img_idx, int) or math.isfinite(img_idx)) or img_idx != int(img_idx):
            raise ToolError(f"img_idx must be a whole number, {valid}; got {img_idx!r}.")
        if not -len(self.shown) <= int(img_idx) < len(self.shown):
            raise ToolError(f"img_idx {int(img_idx)} names no image shown: use {valid}.")
        return int(img_idx) % len(self.shown)


def calls_per_tool(completion: list[dict] | str, tools: list[Tool]) -> dict[str, float]:
    """How many times a trained `completion` called each of `tools` but zoom-in (whose count is `executed_calls`'),
    by `Tool.metric_name`: every tool message of its name, failed calls included."""
    names = [] if isinstance(completion, str) else [m.get("name") for m in completion if m.get("role") == "tool"]
    return {tool.metric_name: float(names.count(tool.function)) for tool in tools if tool.function != TOOL_NAME}


def environment_tools(environment: object) -> list[Callable]:
    """The tools TRL exposes for an `environment_factory` instance: its public methods but `reset` and `get_reward`,
    in name order (the order their schemas are rendered in)."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]


def executed_calls(env: ZoomInEnv, completion: list[dict] | str) -> list[ZoomCall]:
    """The zoom-in calls of a trained `completion`, in order: MAPO's t = 1..T.

    TRL 1.16 runs a tool, then drops its response if appending it would overflow `max_completion_length`
    (grpo_trainer.py, `_tool_call_loop`), so `env.calls` can hold calls the policy is never trained on; they are left
    out here. Every call that reaches `image_zoom_in_tool` returns a list of parts, which TRL keeps as a list-valued
    tool message, and a rollback only removes a suffix; so the k-th list-valued zoom-in message is `env.calls[k]`. A
    call TRL rejects before the method runs (unknown tool name, missing or extra argument) comes back as a string
    message; it is kept as a failed call, so that leaving out the label cannot dodge the semantic score. The replies of
    the environment's other tools are no zoom-in calls: left out, neither failed nor scored.
    """
    if isinstance(completion, str):
        return []
    other_tools = {tool.__name__ for tool in environment_tools(env)} - {TOOL_NAME}
    recorded = iter(env.calls)
    requested: list[dict] = []  # the calls of the last assistant turn, which TRL answers in order
    calls = []
    for message in completion:
        if message.get("role") == "assistant":
            requested = [call.get("function", call) for call in message.get("tool_calls") or []]
            continue
        if message.get("role") != "tool":
            continue
        content = message.get("content")
        asked = requested.pop(0) if requested else {}
        if message.get("name") in other_tools:
            continue
        if message.get("name") == TOOL_NAME and isinstance(content, list):
            call = next(recorded, None)
            if call is None:
                raise RuntimeError("completion holds more zoom-in responses than the environment recorded calls")
        else:
            name = message.get("name") or "unknown"
            call = ZoomCall(0, asked.get("arguments"), None, None, None, error=str(content), name=name)
        calls.append(replace(call, turn=len(calls) + 1))
    return calls
