"""The experiment world's outcome rewards, named by import path in its recipes
(`reward_funcs: [research.rewards:simulated_reader_reward]`): a simulated reader whose success depends only on where
the policy looked, and its noise-free twin for positive controls. Both read the rows' `target_bbox`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from rewards.outcome import format_reward
from tools import ZoomCall, box_contains, executed_calls
from utils.registry import reads_columns

# The simulated reader: how often it reads the answer right, from a crop that frames the target and from anything else.
READER_HIT_P = 0.7
READER_MISS_P = 0.1
READER_MAX_AREA = 0.25  # a box over a quarter of the image is no zoom: the target stays as small as in the prompt


def is_zoom(box: Sequence[int] | None, image_size: tuple[int, int]) -> bool:
    """Whether a crop `box` (original pixels; None: no crop) is a zoom: it covers at most `READER_MAX_AREA` of the
    image."""
    if box is None:
        return False
    x1, y1, x2, y2 = box
    return (x2 - x1) * (y2 - y1) <= READER_MAX_AREA * image_size[0] * image_size[1]


def frames_target(box: Sequence[int] | None, target_bbox: Sequence[int], image_size: tuple[int, int]) -> bool:
    """Whether a crop `box` (original pixels; None: no crop) frames the target: it holds the whole `target_bbox` and
    is a zoom (`is_zoom`), so zooming out to the whole image does not count."""
    return is_zoom(box, image_size) and box_contains(box, target_bbox)


def target_in_view(call: ZoomCall, target_bbox: Sequence[int], image_size: tuple[int, int]) -> bool:
    """Whether a call returned a crop that `frames_target`."""
    return call.ok and frames_target(call.box, target_bbox, image_size)


def reader_draw(row_id: str, step: int, rollout: int) -> float:
    """The reader's uniform draw for one rollout, seeded by (row, training step, rollout index in the batch): the same
    rollout position at the same step of a rerun reads alike, and different rows, steps and rollouts independently."""
    seed = [zlib.crc32(str(row_id).encode()), int(step), int(rollout)]
    return float(np.random.default_rng(seed).random())


def target_seen(completions: list, environments: list, target_bbox: list) -> list[bool]:
    """Per rollout, whether one of its calls `target_in_view`."""
    return [
        any(target_in_view(call, target, env.image.size) for call in executed_calls(env, completion))
        for completion, env, target in zip(completions, environments, target_bbox)
    ]


def reader_outcome(
    well_formed: Sequence[float],
    seen: Sequence[bool],
    draws: Sequence[float],
    hit_p: float = READER_HIT_P,
    miss_p: float = READER_MISS_P,
) -> list[float]:
    """The simulated reader's outcome per rollout: 1.0 when the rollout is well formed and its uniform draw falls
    under `hit_p` (a valid call framed the target: `seen`) or `miss_p` (it did not), else 0.0. The same draws at other
    `hit_p` give the same rollouts read by a more or less reliable reader (common random numbers)."""
    return [
        float(ok) * float(u < (hit_p if hit else miss_p)) for ok, hit, u in zip(well_formed, seen, draws, strict=True)
    ]


@reads_columns("target_bbox", "id")
def simulated_reader_reward(
    completions: list, environments: list, target_bbox: list, id: list, trainer_state=None, **kwargs
) -> list[float]:
    """A noisy outcome for experiments: a stand-in for a reader that answers right with probability `READER_HIT_P`
    when a valid zoom-in call framed the target (`target_in_view`) and `READER_MISS_P` otherwise, and only when every
    turn is well formed (`format_reward`). It never reads the answer: success is sparse and noisy the way a weak
    policy's is on a real benchmark, and depends only on where the policy looked. Needs the rows' `target_bbox` and
    `id` (the synthetic data has both). The draw is `reader_draw(id, global_step, position in the batch)`."""
    step = trainer_state.global_step if trainer_state is not None else 0
    draws = [reader_draw(row_id, step, i) for i, row_id in enumerate(id)]
    return reader_outcome(format_reward(completions), target_seen(completions, environments, target_bbox), draws)


@reads_columns("target_bbox")
def target_in_view_reward(completions: list, environments: list, target_bbox: list, **kwargs) -> list[float]:
    """The simulated reader without its noise, for positive controls: 1.0 when every turn is well formed and a valid
    zoom-in call framed the target (`target_in_view`), else 0.0."""
    seen = target_seen(completions, environments, target_bbox)
    return [ok * float(hit) for ok, hit in zip(format_reward(completions), seen)]
