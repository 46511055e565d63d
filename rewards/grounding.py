"""Where the policy looked, scored against the row's annotated target box (`target_bbox`, original pixels): the
grounding reward a recipe names as `target_in_view`, for data whose rows say where the answer is (the synthetic
world's do). Its noise-free verdict logs what the tiny world's RL is judged on (`make demo`, docs/demo.md), and the
simulated reader the demo trains on (`rewards.simulated_reader`) is built on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rewards.outcome import format_reward
from tools import ZoomCall, box_contains, executed_calls
from utils.registry import reads_columns

MAX_ZOOM_AREA = 0.25  # a box over a quarter of the image is no zoom: the target stays as small as in the prompt


def is_zoom(box: Sequence[int] | None, image_size: tuple[int, int]) -> bool:
    """Whether a crop `box` (original pixels; None: no crop) is a zoom: it covers at most `MAX_ZOOM_AREA` of the
    image."""
    if box is None:
        return False
    x1, y1, x2, y2 = box
    return (x2 - x1) * (y2 - y1) <= MAX_ZOOM_AREA * image_size[0] * image_size[1]


def frames_target(box: Sequence[int] | None, target_bbox: Sequence[int], image_size: tuple[int, int]) -> bool:
    """Whether a crop `box` (original pixels; None: no crop) frames the target: it holds the whole `target_bbox` and
    is a zoom (`is_zoom`), so zooming out to the whole image does not count."""
    return is_zoom(box, image_size) and box_contains(box, target_bbox)


def target_in_view(call: ZoomCall, target_bbox: Sequence[int], image_size: tuple[int, int]) -> bool:
    """Whether a call returned a crop that `frames_target`."""
    return call.ok and frames_target(call.box, target_bbox, image_size)


def target_seen(completions: list, environments: list, target_bbox: list) -> list[bool]:
    """Per rollout, whether one of its calls `target_in_view` (False for a row without a target box)."""
    return [
        target is not None and any(target_in_view(call, target, env.image.size) for call in executed_calls(env, c))
        for c, env, target in zip(completions, environments, target_bbox)
    ]


@reads_columns("target_bbox")
def target_in_view_reward(completions: list, environments: list, target_bbox: list, **kwargs) -> list[float | None]:
    """1.0 when every turn is well formed (`format_reward`) and a valid zoom-in call framed the row's target
    (`target_in_view`), else 0.0; None (not scored, advantage 0) for a row whose `target_bbox` is None."""
    seen = target_seen(completions, environments, target_bbox)
    return [
        None if target is None else ok * float(hit)
        for ok, hit, target in zip(format_reward(completions), seen, target_bbox)
    ]
