"""HPO's step advantages, pure (section 4.3): per group, step weights against a hindsight set (online: the group's
own successful steps; offline: stored successful trajectories) or a fallback; eq. 16's batch normalisation, eq. 17's
mix, the spread over tokens. [paper] / [code] say which of the authors' texts each choice follows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hpo.transport import nonfinite_rows, potential_step_weights

ONLINE_CLIP = 1.0  # [code] compute_step_advantages: np.clip(w, -1, 1)
OFFLINE_CLIP = 5.0  # [code] compute_step_advantages_off: np.clip(w, -5, 5)
MIN_POSITIVE_STEPS = 4  # [code] eligible_uids: cnt["pos"] >= 4 and cnt["neg"] >= 4
MIN_NEGATIVE_STEPS = 4
MAX_OFF_TRAJECTORIES = 8  # [code] examples/train/train.sh: encoder.max_off_num=8 (paper A.2: 8 offline trajectories)
STD_EPS = 1e-6  # [code] inv = 1.0 / (sigma + 1e-6)
# Why a group gets no step advantage, each counted per batch as hpo/fallback/<reason> (a group can have two).
FALLBACK_REASONS = (
    "too_few_positive",  # online: fewer than min_positive steps of successful rollouts
    "too_few_negative",  # online: fewer than min_negative steps of failed rollouts
    "nonfinite_embedding",  # the text encoder gave NaN/inf for a step
    "empty_hindsight",  # offline: the prompt has no stored successful trajectory
    "no_scorable_rollout",  # every rollout's outcome reward was None (a judge that timed out)
)


@dataclass(frozen=True)
class GroupStepAdvantages:
    """One group's step weights before batch normalisation: `raw` (n,) float64, `potential_step_weights` (zeros for a
    `fallback`, which gets A_S = 0: `reasons` as `FALLBACK_REASONS` codes, `reason` in words); `step_index` (n,) each
    point's step (0 = prompt segment); `scale`, applied after normalisation (online: positive-step ratio, offline:
    n_off / max_off); `mode` "online" or "offline" (it picks the clip)."""

    raw: torch.Tensor
    step_index: torch.Tensor
    scale: float
    mode: str
    fallback: bool = False
    reason: str = ""
    reasons: tuple[str, ...] = ()
    n_policy: int = 0
    n_hindsight: int = 0
    w1: float = 0.0


def online_fallback_reason(
    n_positive: int, n_negative: int, min_positive: int = MIN_POSITIVE_STEPS, min_negative: int = MIN_NEGATIVE_STEPS
) -> dict[str, str]:
    """Why an online group gets no step advantage, `{reason code: words}`, empty when it is eligible. [code] >= 4
    steps of successful rollouts and >= 4 of failed ones, step 0 included; the paper only says they fluctuate (5.2)."""
    reasons = {}
    if n_positive < min_positive:
        reasons["too_few_positive"] = f"{n_positive} positive steps < {min_positive}"
    if n_negative < min_negative:
        reasons["too_few_negative"] = f"{n_negative} negative steps < {min_negative}"
    return reasons


def _group_inputs(policy_emb, step_index) -> tuple[torch.Tensor, torch.Tensor]:
    emb = torch.as_tensor(policy_emb).detach().to(device="cpu", dtype=torch.float64)
    if emb.dim() != 2:
        raise ValueError(f"policy_emb must be 2-D (steps, width), got shape {tuple(emb.shape)}")
    if emb.shape[0] == 0:
        raise ValueError("policy_emb is empty (0 steps)")
    steps = torch.as_tensor(step_index).detach().to(device="cpu", dtype=torch.int64)
    if steps.shape != (emb.shape[0],):
        raise ValueError(f"step_index must have shape ({emb.shape[0]},), got {tuple(steps.shape)}")
    if (steps < 0).any():
        raise ValueError("step_index must be >= 0 (0 = prompt segment)")
    return emb, steps


def _nonfinite_reason(**clouds: torch.Tensor) -> dict[str, str]:
    """{} if every cloud is finite; else the fallback reason, naming the clouds and how many rows are not finite.
    Checked before eligibility, so a broken encoder is counted even in groups that would fall back anyway."""
    counts = {name: nonfinite_rows(t) for name, t in clouds.items()}
    bad = [f"{name} has NaN/inf in {k} of {clouds[name].shape[0]} rows" for name, k in counts.items() if k]
    return {"nonfinite_embedding": "; ".join(bad)} if bad else {}


def _group_result(
    emb, hindsight, steps, scale, mode, reasons: dict[str, str], n_hindsight, solver: str
) -> GroupStepAdvantages:
    if reasons:
        raw, w1 = torch.zeros(emb.shape[0], dtype=torch.float64), 0.0
    else:
        raw, w1 = potential_step_weights(emb, hindsight, solver)
    return GroupStepAdvantages(
        raw=raw,
        step_index=steps,
        scale=scale,
        mode=mode,
        fallback=bool(reasons),
        reason="; ".join(reasons.values()),
        reasons=tuple(reasons),
        n_policy=emb.shape[0],
        n_hindsight=n_hindsight,
        w1=w1,
    )


def unscorable_group(mode: str) -> GroupStepAdvantages:
    """A group none of whose rollouts could be scored (every outcome reward None): no points, no step advantage.
    Unscorable rollouts are left out of their group's clouds and the batch std, and get advantage 0, as in GRPO."""
    reasons = {"no_scorable_rollout": "no rollout of the group could be scored"}
    empty = torch.zeros(0, 1, dtype=torch.float64)
    return _group_result(empty, empty, torch.zeros(0, dtype=torch.int64), 0.0, mode, reasons, 0, "exact")


def online_group_step_advantages(
    policy_emb,
    rollout_index,
    step_index,
    rollout_success,
    *,
    min_positive: int = MIN_POSITIVE_STEPS,
    min_negative: int = MIN_NEGATIVE_STEPS,
    solver: str = "exact",
) -> GroupStepAdvantages:
    """Online HPO for one prompt: the hindsight set is the group's own steps of successful rollouts [paper eq. 12], a
    subset of the policy cloud [code]; `scale` is the positive-step ratio n_pos / n [code].

    `policy_emb` (n, d): every step of every rollout (step 0, the prompt segment, zeroed after normalisation);
    `rollout_index` (n,) in [0, G); `step_index` (n,); `rollout_success` (G,) bool or 0/1 ([code] an outcome of
    exactly 1); `min_positive`, `min_negative`: `online_fallback_reason`; `solver`: `potential_step_weights`'.
    """
    emb, steps = _group_inputs(policy_emb, step_index)
    roll = torch.as_tensor(rollout_index).detach().to(device="cpu", dtype=torch.int64)
    success = torch.as_tensor(rollout_success).detach().to("cpu")
    if success.dtype != torch.bool:
        if not ((success == 0) | (success == 1)).all():
            raise ValueError("rollout_success must be bool or 0/1; threshold rewards before calling")
        success = success.bool()
    if success.dim() != 1:
        raise ValueError(f"rollout_success must be 1-D (rollouts,), got shape {tuple(success.shape)}")
    if roll.shape != (emb.shape[0],):
        raise ValueError(f"rollout_index must have shape ({emb.shape[0]},), got {tuple(roll.shape)}")
    if ((roll < 0) | (roll >= success.numel())).any():
        raise ValueError(f"rollout_index must lie in [0, {success.numel()})")
    positive = success[roll]
    n_pos, n = int(positive.sum()), emb.shape[0]  # n >= 1 (`_group_inputs`)
    reason = _nonfinite_reason(policy_emb=emb) or online_fallback_reason(n_pos, n - n_pos, min_positive, min_negative)
    return _group_result(emb, emb[positive], steps, n_pos / n, "online", reason, n_pos, solver)


def offline_group_step_advantages(
    policy_emb,
    step_index,
    hindsight_emb,
    n_off_trajectories: int,
    *,
    max_off_trajectories: int = MAX_OFF_TRAJECTORIES,
    solver: str = "exact",
) -> GroupStepAdvantages:
    """Offline HPO for one prompt: the hindsight set is the steps (`hindsight_emb`, (k, d)) of `n_off_trajectories`
    pre-collected successful trajectories [paper 4.2]; none makes the group a fallback, else it is used [code].

    `scale` = min(n_off, max_off) / max_off [code `max_off_num`, which assumes a capped set; here the scale is
    capped], so prompts with fewer offline successes weigh less. Other arguments: `online_group_step_advantages`.
    """
    emb, steps = _group_inputs(policy_emb, step_index)
    hind = torch.as_tensor(hindsight_emb).detach().to(device="cpu", dtype=torch.float64)
    if hind.numel() == 0:
        hind = hind.new_zeros((0, emb.shape[1]))  # [] or (0, d): no offline successes
    if hind.dim() != 2:
        raise ValueError(f"hindsight_emb must be 2-D (steps, width), got shape {tuple(hind.shape)}")
    if hind.shape[1] != emb.shape[1]:
        raise ValueError(
            f"policy_emb and hindsight_emb must have the same width, got policy_emb width {emb.shape[1]} "
            f"and hindsight_emb width {hind.shape[1]}"
        )
    if max_off_trajectories <= 0 or n_off_trajectories < 0:
        raise ValueError("need max_off_trajectories > 0 and n_off_trajectories >= 0")
    reason = _nonfinite_reason(policy_emb=emb, hindsight_emb=hind)
    if not reason and (hind.shape[0] == 0 or n_off_trajectories == 0):
        reason = {"empty_hindsight": "empty hindsight set (no offline successful steps, or n_off_trajectories = 0)"}
    scale = min(n_off_trajectories, max_off_trajectories) / max_off_trajectories
    return _group_result(emb, hind, steps, scale, "offline", reason, hind.shape[0], solver)


@dataclass(frozen=True)
class StepAdvantageBatch:
    """`values[g]` (n_g,) float64: the step advantage A_S of each policy point of group g (zeros for fallbacks)."""

    values: list[torch.Tensor]
    sigma: float
    clip: float
    fallback: list[bool]

    @property
    def n_fallback(self) -> int:
        return sum(self.fallback)


def normalize_step_advantages(groups: Sequence[GroupStepAdvantages]) -> StepAdvantageBatch:
    """The batch-level part of eq. 16, as the authors' code does it: A_S = clip(raw / (sigma + eps), -c, c) * scale,
    then 0 at step 0 and for fallback groups, where
    - sigma is the std (ddof=1) of the raw weights of all non-fallback groups together, step 0 included [code; the
      paper's std(f*) does not say over what]; raw weights have mean zero per group already [code: `all_w`];
    - c is 1 for online and 5 for offline groups [code], so a batch mixing them is refused;
    - step 0, the prompt segment, enters sigma but gets 0 [code: `step_returns[0]` stays 0];
    - if sigma = 0 (all raw weights are 0) the values are left unscaled and unclipped, i.e. 0 [code].
    """
    modes = {g.mode for g in groups}
    if len(modes) > 1:
        raise ValueError(f"groups mix modes {sorted(modes)}: one batch is online or offline")
    clip = OFFLINE_CLIP if modes == {"offline"} else ONLINE_CLIP
    used = [g.raw for g in groups if not g.fallback]
    pooled = torch.cat(used) if used else torch.zeros(0, dtype=torch.float64)
    sigma = float(pooled.std(correction=1)) if pooled.numel() > 1 else 0.0
    values = []
    for g in groups:
        if g.fallback:
            values.append(torch.zeros_like(g.raw))
            continue
        v = (g.raw / (sigma + STD_EPS)).clamp(-clip, clip) * g.scale if sigma > 0 else g.raw.clone()
        v[g.step_index == 0] = 0.0
        values.append(v)
    return StepAdvantageBatch(values=values, sigma=sigma, clip=clip, fallback=[g.fallback for g in groups])


# ---------------------------------------------------------------------------------------- final advantage
def combine_advantages(episode_adv, step_adv, omega: float, episode_only=None) -> torch.Tensor:
    """Eq. 17: (A_E + omega * A_S) / (1 + omega) [paper; code `compute_otgrpo_outcome_advantage`], omega >= 0.

    `episode_adv` A_E is (B,) or the shape of `step_adv` A_S ((B, S) per step, (B, T) per token, or (B,)). Where the
    optional bool `episode_only` ((B,) or A_S's shape) is True the result is A_E itself: the authors' code has no such
    switch (a fallback's A_S = 0 gives A_E / (1 + omega)).
    """
    ea = torch.as_tensor(episode_adv)
    sa = torch.as_tensor(step_adv)
    if not math.isfinite(omega) or omega < 0:
        raise ValueError(f"omega must be finite and >= 0, got {omega}")
    if not (torch.isfinite(ea).all() and torch.isfinite(sa).all()):
        raise ValueError("episode_adv and step_adv must be finite")
    if ea.dim() == sa.dim() - 1:
        ea = ea.unsqueeze(-1)
    out = (ea + omega * sa) / (1.0 + omega)
    if episode_only is not None:
        mask = torch.as_tensor(episode_only, dtype=torch.bool, device=out.device)
        if mask.dim() == sa.dim() - 1:
            mask = mask.unsqueeze(-1)
        out = torch.where(mask, ea.to(out.dtype).expand_as(out), out)
    return out


def broadcast_to_tokens(step_values, token_step_index) -> torch.Tensor:
    """Per-token advantages (B, T), in `step_values`' dtype on `token_step_index`'s device: token t of row b gets
    `step_values[b][token_step_index[b, t]]` ((B, S), or B 1-D tensors of different lengths), or 0 where the index is
    -1 (no step: padding, tool responses; the loss masks them anyway [code: `valid = sidx >= 0`])."""
    idx = torch.as_tensor(token_step_index)
    if idx.dim() != 2:
        raise ValueError(f"token_step_index must be 2-D (rows, tokens), got shape {tuple(idx.shape)}")
    if isinstance(step_values, torch.Tensor) and step_values.dim() == 2:
        table = step_values.to(idx.device)
        lengths = torch.full((table.shape[0],), table.shape[1], dtype=torch.int64, device=idx.device)
    else:
        rows = [torch.as_tensor(r).reshape(-1) for r in step_values]
        width = max((r.numel() for r in rows), default=0)
        dtype = rows[0].dtype if rows else torch.float32
        table = torch.zeros(len(rows), width, dtype=dtype, device=idx.device)
        for b, r in enumerate(rows):
            table[b, : r.numel()] = r.to(idx.device)
        lengths = torch.tensor([r.numel() for r in rows], dtype=torch.int64, device=idx.device)
    if table.shape[0] != idx.shape[0]:
        raise ValueError(f"step_values has {table.shape[0]} rows but token_step_index has {idx.shape[0]}")
    idx = idx.to(torch.int64)
    if (idx < -1).any():
        raise ValueError("token_step_index must be >= -1")
    over = idx >= lengths[:, None]
    if over.any():
        row = int(over.any(dim=1).nonzero()[0])
        raise ValueError(f"row {row}: token_step_index up to {int(idx[row].max())} but only {int(lengths[row])} steps")
    picked = table.gather(1, idx.clamp_min(0)) if table.shape[1] else torch.zeros(idx.shape, dtype=table.dtype)
    return torch.where(idx >= 0, picked, torch.zeros((), dtype=table.dtype, device=idx.device))
