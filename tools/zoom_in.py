"""The zoom-in tool, pure (PIL in, PIL out; `tools.env.ZoomInEnv` wraps it for TRL): crop geometry, label rules, the
observation returned to the model.

DeepEyes' interface (`image_zoom_in_tool`, `bbox_2d = [x1, y1, x2, y2]` in the model's frame, `label`: what the model
expects there, MAPO's "talk", scored against the crop by CLIP), but: the box is mapped from the frame the model saw
(`box_frame`: pixels of the resized image, or Qwen3-VL's 0-1000 grid) back to the full-resolution original before
cropping (DeepEyes crops the original unmapped, its issue #141); a box under `min_side` is expanded about its centre
inside the image (DeepEyes' expansion is unreachable behind its `> 30 px` check); `label` is required and
length-limited (the paper's guard against reward hacking); the response never repeats the label, which would hand the
model a text crutch against "walk the talk".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from tools.calls import CALL_FORMATS as CALL_FORMATS  # re-exported: a call written by hand (`tools.calls`)
from tools.calls import TOOL_NAME as TOOL_NAME
from tools.calls import tool_call_text as tool_call_text
from tools.config import BOX_CONVENTIONS, PixelBudget
from tools.registry import Tool, register_tool

RELATIVE_GRID = 1000  # `relative_1000`: (0, 0) is the image's top-left corner, (1000, 1000) its bottom-right


def box_frame(seen: tuple[int, int], box_convention: str) -> tuple[int, int]:
    """(width, height) of the frame `bbox_2d` is written in: `seen` (the resized image the model sees) for `pixels`,
    the `RELATIVE_GRID` square for `relative_1000` (the same region of the seen image and of the original)."""
    if box_convention == "pixels":
        return seen
    if box_convention == "relative_1000":
        return RELATIVE_GRID, RELATIVE_GRID
    raise ValueError(f"box_convention must be one of {BOX_CONVENTIONS}; got {box_convention!r}")


class ToolError(ValueError):
    """A rejected tool call. The message is shown to the model, so it says what to change."""


def validate_label(label: object, max_words: int, max_chars: int) -> str:
    """The label with its whitespace collapsed; `ToolError` if it is not a string, empty or longer than `max_words`
    words / `max_chars` characters (MAPO section 3.3 limits labels against reward hacking)."""
    if not isinstance(label, str):
        raise ToolError(f"label must be a short text naming what you expect to see; got {type(label).__name__}.")
    label = " ".join(label.split())
    if not label:
        raise ToolError("label is empty: name what you expect to see in the box, e.g. 'the star'.")
    words = len(label.split())
    if words > max_words or len(label) > max_chars:
        raise ToolError(
            f"label is too long ({words} words, {len(label)} characters); "
            f"use at most {max_words} words and {max_chars} characters."
        )
    return label


def _parse_box(bbox_2d: object) -> tuple[float, float, float, float]:
    if not isinstance(bbox_2d, list | tuple):
        raise ToolError(f"bbox_2d must be a list of 4 numbers [x1, y1, x2, y2]; got {type(bbox_2d).__name__}.")
    if len(bbox_2d) != 4:
        raise ToolError(f"bbox_2d must have 4 numbers [x1, y1, x2, y2]; got {len(bbox_2d)}.")
    if not all(isinstance(v, Real) and not isinstance(v, bool) for v in bbox_2d):
        raise ToolError("bbox_2d must contain only numbers [x1, y1, x2, y2].")
    try:
        x1, y1, x2, y2 = (float(v) for v in bbox_2d)
    except OverflowError:  # an integer too large for a float (JSON allows any number of digits)
        raise ToolError("bbox_2d must contain pixel coordinates, not numbers too large to represent.") from None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise ToolError("bbox_2d must contain finite numbers (no NaN or infinity).")
    return x1, y1, x2, y2


def _expand_span(lo: float, hi: float, min_len: float, limit: float) -> tuple[float, float]:
    """Grow [lo, hi] about its centre to at least `min_len`, then shift it to lie inside [0, limit]."""
    if hi - lo >= min_len:
        return lo, hi
    min_len = min(min_len, limit)
    centre = (lo + hi) / 2
    lo, hi = centre - min_len / 2, centre + min_len / 2
    shift = max(0.0, -lo) - max(0.0, hi - limit)
    return lo + shift, hi + shift


def crop_box(
    image_size: tuple[int, int],
    bbox_2d: object,
    *,
    seen_size: tuple[int, int] | None = None,
    min_side: int,
    max_aspect: float,
) -> tuple[int, int, int, int]:
    """The integer box (left, top, right, bottom) of the `image_size` original that `bbox_2d` names in the frame
    `seen_size` (`box_frame`; None: the original's pixels). A side shorter than `min_side` original pixels is expanded
    about its centre inside the image. `ToolError`: the box is malformed, empty once clamped to the image, or more
    elongated than `max_aspect`."""
    width, height = image_size
    seen_w, seen_h = seen_size or image_size
    x1, y1, x2, y2 = _parse_box(bbox_2d)
    # Clamp in the frame the model used, so error messages speak its coordinates.
    cx1, cx2 = min(max(x1, 0.0), seen_w), min(max(x2, 0.0), seen_w)
    cy1, cy2 = min(max(y1, 0.0), seen_h), min(max(y2, 0.0), seen_h)
    if cx2 <= cx1 or cy2 <= cy1:
        raise ToolError(
            f"bbox_2d {list(bbox_2d)} is empty inside the image ({seen_w}x{seen_h}): "
            "need x1 < x2 and y1 < y2 within the image."
        )
    # Multiplied, then divided once: exact for whole numbers, so a box on the 1000-grid (2240 / 1000 = 2.24 is no
    # binary fraction: 700 * 2.24 = 1568.0000000000002) is not widened by a pixel at its floor or ceiling.
    left, right = _expand_span(cx1 * width / seen_w, cx2 * width / seen_w, min_side, width)
    top, bottom = _expand_span(cy1 * height / seen_h, cy2 * height / seen_h, min_side, height)
    box = (math.floor(left), math.floor(top), math.ceil(right), math.ceil(bottom))
    box = (max(box[0], 0), max(box[1], 0), min(box[2], width), min(box[3], height))
    w, h = box[2] - box[0], box[3] - box[1]
    if max(w, h) / min(w, h) > max_aspect:
        raise ToolError(f"bbox_2d is too elongated (aspect ratio {max(w, h) / min(w, h):.0f} > {max_aspect:g}).")
    return box


def boxes_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether boxes `a` and `b` (x1, y1, x2, y2, exclusive ends) share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def box_contains(outer: Sequence[float], inner: Sequence[float]) -> bool:
    """Whether box `outer` holds all of box `inner`."""
    return outer[0] <= inner[0] and outer[1] <= inner[1] and outer[2] >= inner[2] and outer[3] >= inner[3]


def crop(
    image: Image.Image,
    bbox_2d: object,
    *,
    seen_size: tuple[int, int] | None = None,
    min_side: int,
    max_aspect: float,
) -> Image.Image:
    """Cut `bbox_2d` (in the model's frame `seen_size`) out of the full-resolution `image`; the rules: `crop_box`."""
    return image.crop(crop_box(image.size, bbox_2d, seen_size=seen_size, min_side=min_side, max_aspect=max_aspect))


def seen_size(image_size: tuple[int, int], budget: PixelBudget) -> tuple[int, int]:
    """(width, height) of `image_size` after Qwen2-VL's `smart_resize` under `budget`: the image the model sees."""
    width, height = image_size
    h, w = smart_resize(
        height, width, factor=budget.factor, min_pixels=budget.min_pixels, max_pixels=budget.max_pixels
    )
    return w, h


def crop_size(crop: tuple[int, int], budget: PixelBudget) -> tuple[int, int]:
    """(width, height) a crop is shown at under a crop budget (`ToolConfig.crop_budget`): `seen_size`, whose upscale
    to the floor (`crop_min_pixels`) rounds both sides up and so can pass a ceiling near it, then brought back under
    the ceiling. The result is one the processor leaves as it is: sides multiples of the factor, within its budget."""
    width, height = seen_size(crop, budget)
    while width * height > budget.max_pixels:  # each pass shrinks a side by at least one factor
        height, width = smart_resize(height, width, factor=budget.factor, min_pixels=0, max_pixels=budget.max_pixels)
    return width, height


def resize_to_budget(image: Image.Image, budget: PixelBudget) -> Image.Image:
    """A crop resized to its budget now (`crop_size`), so crops kept in memory and logs are what the model is fed,
    and small crops are upscaled to the floor (bicubic), as Mini-o3 upscales its observations (NEAREST there)."""
    size = crop_size(image.size, budget)
    return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)


def observation(crop_image: Image.Image | None, text: str) -> list[dict]:
    """A tool response as TRL forwards it to the model: the crop (if any), then text."""
    parts = [{"type": "image", "image": crop_image}] if crop_image is not None else []
    return parts + [{"type": "text", "text": text}]


# ------------------------------------------------------------------------------------------------ the tool's record
# Where the system prompt says in which frame `bbox_2d` is written, by `ToolConfig.box_convention`.
BOX_WORDS = {
    "pixels": "in pixels of the image you see",
    "relative_1000": "on a 0-1000 grid over the image you see ((0, 0) its top-left, (1000, 1000) its bottom-right "
    "corner)",
}


def prompt(box_convention: str) -> str:
    """The zoom-in tool's sentences of the system prompt (`data.task.system_prompt`)."""
    return (
        f"To look closer, call {TOOL_NAME} with bbox_2d = [x1, y1, x2, y2] {BOX_WORDS[box_convention]}, and label = "
        "a few words naming what you expect to see in that box. You may zoom several times."
    )


# The tiny kit's tokenizer learns this schema (`tiny.kit.tokenizer_corpus`): a change retrains the kit's tokenizer.
KIT_SCHEMA = (
    '{"type": "function", "function": {"name": "image_zoom_in_tool", "description": "Zoom in on a region of '
    'the image.", "parameters": {"type": "object", "properties": {"bbox_2d": {"type": "array", "items": '
    '{"type": "integer"}, "description": "Box [x1, y1, x2, y2] in pixels."}, "label": {"type": "string", '
    '"description": "What the box shows."}}, "required": ["bbox_2d", "label"]}}}'
)

# The environment class defines the method itself (`tools.env.ZoomInEnv`: its description depends on the box
# convention and `accept_img_idx`). Worst case of the token budget: the whole image, whose crop is the largest.
ZOOM_IN = register_tool(
    Tool(
        name="zoom_in",
        function=TOOL_NAME,
        prompt=prompt,
        budget_arguments=lambda env: {"bbox_2d": [0, 0, *env.box_frame], "label": "the object"},
        short_arguments={"bbox_2d": [10, 20, 100, 200], "label": "the object"},
        metric="tools/zoom_calls_per_rollout",
        kit_schema=KIT_SCHEMA,
    )
)
