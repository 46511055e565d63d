"""The rotate tool, `image_rotate_tool(angle, img_idx)`: turns an image the model has seen (the original, or an
earlier observation by `img_idx`) counter-clockwise by a multiple of 90 degrees and returns it as a new image.

The source: DeepEyes' visual toolbox (Visual-Agent/DeepEyes, verl/workers/agent/envs/mm_process_engine/
visual_toolbox_v2.py) offers `image_rotate_tool` beside the zoom, its schema `angle: number, "Rotation angle in
degrees. Positive values rotate counter-clockwise."`, and runs PIL's `img.rotate(angle)` on the original image: any
angle, the canvas kept, so corners are cut off and filled black. Relax's DeepEyes recipe ports it (`int(angle)`,
the original image). Thyme writes the rotation as code. The choice here: multiples of 90 degrees only (the angle
counter-clockwise, as PIL's and DeepEyes'), the canvas turned with the image, so no pixel is lost and every box of a
later zoom on the turned image maps exactly, axis-aligned, back onto the original (`unturn_box`); `img_idx` names
which image, as Qwen-Agent's zoom does. Another angle is refused with a message saying which it takes.

The turned image is shown under the crop budget (`ToolConfig.crop_budget`), as a crop is, and becomes a new image
`img_idx` can name; a later zoom on it reads `bbox_2d` in its frame (`tools.env.ZoomInEnv._zoom`). Rotate calls
carry no label: MAPO gives them no z_t (`tools.env.executed_calls` leaves them out).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from PIL import Image

from tools.registry import Tool, register_tool
from tools.zoom_in import ToolError, box_frame, observation, resize_to_budget

FUNCTION = "image_rotate_tool"
TURNS = {1: Image.Transpose.ROTATE_90, 2: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_270}  # CCW


def quarter_turns(angle: Any) -> int:
    """`angle` (degrees counter-clockwise, a multiple of 90) as quarter turns 0-3, or a `ToolError` for the model."""
    if not isinstance(angle, Real) or isinstance(angle, bool):
        raise ToolError(f"angle must be a number of degrees, 90, 180 or 270; got {type(angle).__name__}.")
    if isinstance(angle, float) and not math.isfinite(angle):
        raise ToolError("angle must be a finite number of degrees: 90, 180 or 270.")
    if angle != int(angle) or int(angle) % 90:
        shown = f"{angle!r}" if abs(angle) < 1e6 else "a number that is no multiple of 90"
        raise ToolError(f"angle must be a multiple of 90 degrees (90, 180 or 270); got {shown}.")
    return int(angle) // 90 % 4


def turned(image: Image.Image, turns: int) -> Image.Image:
    """`image` turned `turns` quarter turns counter-clockwise, its canvas with it."""
    return image if turns % 4 == 0 else image.transpose(TURNS[turns % 4])


def unturn_box(box: tuple[int, int, int, int], size: tuple[int, int], turns: int) -> tuple[int, int, int, int]:
    """A box on `size` (width, height) turned `turns` quarter turns counter-clockwise, in the unturned image's
    pixels. One quarter turn takes the point (x, y) of a W-wide image to (y, W - x)."""
    for k in range(turns % 4, 0, -1):  # undo the turns one by one, last first
        width = size[0] if (k - 1) % 2 == 0 else size[1]  # the width of the image turned k - 1 times
        left, top, right, bottom = box
        box = (width - bottom, left, width - top, right)
    return box


def rotate(env: Any, angle: Any, img_idx: Any = 0) -> list[dict]:
    """The tool's work on a `tools.env.ZoomInEnv`: image `img_idx` of `env.shown` turned `angle` degrees; a bad call
    is an observation saying what to change (`env.last_error` set), never an exception."""
    try:
        turns = quarter_turns(angle)
        index = env._image_index(img_idx)
    except ToolError as err:
        env.last_error = str(err)
        return observation(None, f"Error: {err} Fix the call, or answer if you can.")
    region, _ = env.shown[index]
    total = (env.turns[index] + turns) % 4
    image = resize_to_budget(turned(env.image.crop(region), total), env.crop_budget)
    env.shown.append((region, box_frame(image.size, env.box_convention)))
    env.turns.append(total)
    env.last_error = None
    return observation(image, f"Rotated image {index} by {turns * 90} degrees; it is image {len(env.shown) - 1}.")


def image_rotate_tool(self, angle: int, img_idx: int = 0) -> list[dict]:
    """Rotate an image counter-clockwise by a multiple of 90 degrees, to see it upright.

    Args:
        angle: Degrees to turn the image counter-clockwise: 90, 180 or 270.
        img_idx: Which image to rotate: 0 (the default) is the original image, and i the image the i-th successful
            zoom or rotation returned.
    """
    return rotate(self, angle, img_idx)


def prompt(box_convention: str) -> str:
    """The rotate tool's sentence of the system prompt."""
    return (
        f"To turn an image upright, call {FUNCTION} with angle = 90, 180 or 270 (degrees counter-clockwise) and "
        "img_idx = the image to turn (0 the original); a later zoom on the turned image reads bbox_2d in its frame."
    )


ROTATE = register_tool(
    Tool(
        name="rotate",
        function=FUNCTION,
        prompt=prompt,
        method=lambda config: image_rotate_tool,
        budget_arguments=lambda env: {"angle": 90, "img_idx": 0},  # the whole image, at the crop budget
        short_arguments={"angle": 90, "img_idx": 0},
        metric="tools/rotate_calls_per_rollout",
        kit_schema=(
            '{"type": "function", "function": {"name": "image_rotate_tool", "description": "Rotate an image.", '
            '"parameters": {"type": "object", "properties": {"angle": {"type": "integer"}, "img_idx": {"type": '
            '"integer"}}, "required": ["angle"]}}}'
        ),
    )
)
