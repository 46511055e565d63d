"""MAPO's math (Walk the Talk, section 3), pure and model-free: R_sem (eq. 2), the group-normalised advantage of
R_out + beta * R_sem (eq. 3), and the scale of z_t. The derivation and where this departs from the paper:
`docs/method.md`. `MAPOTrainer` trains with eq. 3 through TRL's own reward aggregation of its `reward_columns`;
`reference_advantages` states it on its own, the reference the tests hold the trainer to (and its
`mapo/advantage_std` metric).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from trl.trainer.utils import nanstd

SEMANTIC_SCORES = ("cosine", "clipscore", "contrastive")


def semantic_reward(scores: Sequence[float], lam: float, empty: float = 0.0) -> float:
    """R_sem of one rollout, eq. 2: (1/T) * sum_{t=1..T} lam^(T-t) * z_t.

    Later calls weigh more (the last one has weight 1), and the 1/T factor discounts long trajectories. A NaN score
    counts as 0 (an unscorable call earns nothing). `empty` is returned when there are no calls (T = 0).
    """
    T = len(scores)
    if T == 0:
        return float(empty)
    return sum(lam ** (T - t) * (0.0 if math.isnan(z) else z) for t, z in enumerate(scores, start=1)) / T


def reference_advantages(
    outcome: torch.Tensor,
    semantic: torch.Tensor,
    num_generations: int,
    beta: float,
    scale_rewards: str = "group",
) -> torch.Tensor:
    """MAPO's group-normalised advantage (eq. 3) of the composite R_out + beta * R_sem, stated on its own: a reference
    nothing trains with (`MAPOTrainer.reward_columns` is what trains).

    Rows are ordered group by group (G = `num_generations` consecutive rows per prompt), as TRL orders them.
    Normalisation follows TRL's GRPO exactly, so that beta = 0 gives GRPO's advantages bit for bit: minus the group
    mean, then divided by (group std + 1e-4) for "group", by (batch std + 1e-4) for "batch", by nothing for "none".
    NaN rows (unscorable outcome) are left out of the statistics and get advantage 0.
    """
    rewards = outcome + beta * semantic
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations) if num_generations > 1 else None
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else None
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none'; got {scale_rewards!r}")
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / ((std if std is not None else torch.zeros_like(rewards)) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def groups_outcome_all_equal(outcome: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(groups,) bool: the group's scorable outcomes are all equal, so only R_sem can tell its rollouts apart.

    NaN rows (unscorable) are left out, as the advantage leaves them out: a group [1, NaN, 1] is all equal, and a
    group with no scorable row is too (it has no outcome signal at all).
    """
    grouped = outcome.view(-1, num_generations)
    unscored = torch.isnan(grouped)
    low = grouped.masked_fill(unscored, math.inf).amin(dim=1)
    high = grouped.masked_fill(unscored, -math.inf).amax(dim=1)
    return ~(high > low)


def scale_similarity(cosine: torch.Tensor, how: str, whole: torch.Tensor | None = None) -> torch.Tensor:
    """z_t from a verifier's score of each label against its crop (`cosine`).

    - "cosine" keeps it (in [-1, 1] for CLIP);
    - "clipscore" is 2.5 * max(cos, 0) (Hessel et al., 2021), which stretches CLIP's narrow cosine band (about
      0.15-0.35 for real CLIP) towards [0, 1] and ignores negatives;
    - "contrastive" is cos(label, crop) - cos(label, whole image), `whole` being the same verifier's score of each
      label against its rollout's whole image. Not in the paper: a guard against label hacking. A label that fits
      every crop as well as the image it came from ("the object") earns nothing; only what the crop shows *more*
      than the whole image counts, which is what zooming in is for.
    """
    if how == "cosine":
        return cosine
    if how == "clipscore":
        return 2.5 * cosine.clamp(min=0)
    if how == "contrastive":
        if whole is None or whole.shape != cosine.shape:
            raise ValueError("semantic_score 'contrastive' needs each label's score against its whole image")
        return cosine - whole
    raise ValueError(f"semantic_score must be one of {SEMANTIC_SCORES}; got {how!r}")
