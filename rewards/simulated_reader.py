"""A simulated reader, the outcome a recipe names as `simulated_reader`: right with probability `READER_HIT_P` when a
valid zoom-in call framed the row's target (`rewards.grounding.target_seen`) and `READER_MISS_P` otherwise, never
reading the answer. The tiny policy cannot read answers (research/reports/tiny_world.md), so this stands in for a
real benchmark's outcome there: sparse and noisy the way a weak policy's is, and earned only by where the policy
looked. `make demo` trains MAPO and GRPO on it; the research package's experiments first did (`research.rewards`
re-exports it under its old import path).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from rewards.grounding import target_seen
from rewards.outcome import format_reward
from utils.registry import reads_columns

# How often the reader reads the answer right, from a crop that frames the target and from anything else.
READER_HIT_P = 0.7
READER_MISS_P = 0.1


def reader_draw(row_id: str, step: int, rollout: int) -> float:
    """The reader's uniform draw for one rollout, seeded by (row, training step, rollout index in the batch): the same
    rollout position at the same step of a rerun reads alike, and different rows, steps and rollouts independently."""
    seed = [zlib.crc32(str(row_id).encode()), int(step), int(rollout)]
    return float(np.random.default_rng(seed).random())


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
    """A noisy outcome: a stand-in for a reader that answers right with probability `READER_HIT_P` when a valid
    zoom-in call framed the target (`target_in_view`) and `READER_MISS_P` otherwise, and only when every turn is well
    formed (`format_reward`). It never reads the answer: success is sparse and noisy the way a weak policy's is on a
    real benchmark, and depends only on where the policy looked. Needs the rows' `target_bbox` and `id` (the
    synthetic data has both). The draw is `reader_draw(id, global_step, position in the batch)`, so two runs at the
    same step read the same rollout positions with the same draws."""
    step = trainer_state.global_step if trainer_state is not None else 0
    draws = [reader_draw(row_id, step, i) for i, row_id in enumerate(id)]
    return reader_outcome(format_reward(completions), target_seen(completions, environments, target_bbox), draws)
