"""HPO's step-level advantage (Hindsight Policy Optimization, Li et al., section 4.3) and its wiring into
`MAPOTrainer` (`advantage_estimator: hpo | mapo+hpo`).

The math is pure tensor functions: `kantorovich_potentials` (eq. 1-2, 13-14, POT's exact solver, canonical duals;
`geomloss_potentials`, the authors' Sinkhorn, by `hpo_solver`),
`potential_step_weights` and the group functions (eq. 16's numerator, the hindsight sets of section 4.2),
`normalize_step_advantages` (eq. 16), `combine_advantages` (eq. 17), `broadcast_to_tokens`, `unscorable_group`. The trainer's side:
`turn_index` and `step_segments` (a TRL completion's steps), `StepEncoder` (the intent space's text encoder) and
`HPOAdvantages` (eq. 17 over one generation batch). The derivation, the authors' code each choice follows ([paper] /
[code] marks in the docstrings) and how this differs from both: `docs/method.md`.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import ot
import torch
from accelerate.utils import gather_object
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, csgraph_from_dense, floyd_warshall

from utils.models import load_text_encoder

ONLINE_CLIP = 1.0  # [code] compute_step_advantages: np.clip(w, -1, 1)
OFFLINE_CLIP = 5.0  # [code] compute_step_advantages_off: np.clip(w, -5, 5)
MIN_POSITIVE_STEPS = 4  # [code] eligible_uids: cnt["pos"] >= 4 and cnt["neg"] >= 4
MIN_NEGATIVE_STEPS = 4
MAX_OFF_TRAJECTORIES = 8  # [code] examples/train/train.sh: encoder.max_off_num=8 (paper A.2: 8 offline trajectories)
STD_EPS = 1e-6  # [code] inv = 1.0 / (sigma + 1e-6)
OFFLINE_CACHE_PROMPTS = 1024  # offline hindsight clouds kept embedded (least recently used dropped): ~0.2 GB at 1024-D
# Why a group gets no step advantage, each counted per batch as hpo/fallback/<reason> (a group can have two).
FALLBACK_REASONS = (
    "too_few_positive",  # online: fewer than min_positive steps of successful rollouts
    "too_few_negative",  # online: fewer than min_negative steps of failed rollouts
    "nonfinite_embedding",  # the text encoder gave NaN/inf for a step
    "empty_hindsight",  # offline: the prompt has no stored successful trajectory
    "no_scorable_rollout",  # every rollout's outcome reward was None (a judge that timed out)
)

_SUPPORT_TOL = 1e-12  # plan entries below this (masses sum to 1) are rounding residue, not transport
_NEAR_DUPLICATE = 1e-4  # squared distances below this fraction of |x|^2 + |y|^2 are recomputed exactly


# ------------------------------------------------------------------------------------------------ potentials
def _nonfinite_rows(t: torch.Tensor) -> int:
    """Rows of a CPU float64 (rows, width) tensor holding NaN or inf."""
    # numpy, not torch: torch's threaded isfinite costs milliseconds on small tensors when the cores are busy.
    return int((~np.isfinite(t.numpy())).any(axis=1).sum())


def _as_cloud(name: str, x) -> torch.Tensor:
    """`x` as a float64 CPU tensor of shape (rows, width), or a ValueError that names `name`."""
    t = torch.as_tensor(x).detach()
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (points, width), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty (0 points): W1 needs at least one point on each side")
    if t.shape[1] == 0:
        raise ValueError(f"{name} has width 0")
    t = t.to(device="cpu", dtype=torch.float64)
    bad = _nonfinite_rows(t)
    if bad:
        raise ValueError(f"{name} has NaN/inf in {bad} of {t.shape[0]} rows")
    return t


def _as_weights(name: str, w, n: int) -> np.ndarray:
    """Weights as float64 numpy summing to 1; uniform when `w` is None. Negative or non-finite weights raise."""
    if w is None:
        return np.full(n, 1.0 / n)
    arr = torch.as_tensor(w).detach().to(device="cpu", dtype=torch.float64).numpy().copy()
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match its cloud, got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} has NaN/inf entries")
    if (arr < 0).any():
        raise ValueError(f"{name} has {int((arr < 0).sum())} negative entries")
    total = arr.sum()
    if total <= 0:
        raise ValueError(f"{name} sums to {total}; it needs positive mass")
    # Weights are a distribution only up to scale: normalising lets callers pass counts.
    return arr / total


def _euclidean_cost(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n, m) Euclidean distances in float64, exact for duplicates."""
    x2 = np.einsum("ij,ij->i", x, x)
    y2 = np.einsum("ij,ij->i", y, y)
    norms = x2[:, None] + y2[None, :]
    d2 = np.maximum(norms - 2.0 * (x @ y.T), 0.0)
    # The Gram trick is fast but its absolute error, ~eps * (|x|^2 + |y|^2), swamps the distance of near-duplicate
    # points (the step-0 prompt embedding is shared by every rollout of a group): recompute those pairs directly.
    rows, cols = np.nonzero(d2 <= _NEAR_DUPLICATE * norms)
    chunk = max(1, 4_194_304 // x.shape[1])
    for s in range(0, rows.size, chunk):
        r, c = rows[s : s + chunk], cols[s : s + chunk]
        diff = x[r] - y[c]
        d2[r, c] = np.einsum("ij,ij->i", diff, diff)
    return np.sqrt(d2)


def _central_shifts(cost: np.ndarray, plan: np.ndarray, u: np.ndarray, v: np.ndarray, a: np.ndarray):
    """Per-point shifts (for u, to subtract from v) that move optimal duals (u, v) to the canonical ones.

    Within a connected part of the plan's support, u_i + v_j = C_ij on the support fixes the duals up to one
    constant t_p per part. Feasibility across parts is t_p - t_q <= S_pq, the least slack C_ij - u_i - v_j over
    rows i of part p and columns j of part q. With D the shortest paths of the graph with edges q -> p of length
    S_pq, t = D[r, :] (the largest t with t_r = 0) and t = -D[:, r] (the smallest) are feasible for every part r;
    their average weighted by the parts' masses is feasible too, and does not depend on the input duals, on the
    order of the points or on how a tied part is split. All weights here are positive.
    """
    n, m = cost.shape
    support = plan > _SUPPORT_TOL
    # Every point ships or receives its (positive) mass, so its largest flow is transport even if tiny: keeping it
    # guarantees each part below holds at least one row and one column.
    support[np.arange(n), plan.argmax(axis=1)] = True
    support[plan.argmax(axis=0), np.arange(m)] = True
    rows, cols = np.nonzero(support)
    graph = coo_matrix((np.ones(rows.size), (rows, n + cols)), shape=(n + m, n + m))
    k, labels = connected_components(graph, directed=False)
    if k == 1:
        return np.zeros(n), np.zeros(m)
    row_part, col_part = labels[:n], labels[n:]
    slack = np.maximum(cost - u[:, None] - v[None, :], 0.0)  # >= 0 up to rounding, as (u, v) is feasible
    row_order = np.argsort(row_part, kind="stable")
    col_order = np.argsort(col_part, kind="stable")
    row_starts = np.searchsorted(row_part[row_order], np.arange(k))
    col_starts = np.searchsorted(col_part[col_order], np.arange(k))
    least = np.minimum.reduceat(slack[row_order], row_starts, axis=0)
    least = np.minimum.reduceat(least[:, col_order], col_starts, axis=1)  # least[p, q] = S_pq
    lengths = least.T.copy()  # lengths[q, p]: edge q -> p
    np.fill_diagonal(lengths, np.inf)
    dist = floyd_warshall(csgraph_from_dense(lengths, null_value=np.inf), directed=True)
    mass = np.bincount(row_part, weights=a, minlength=k)
    t = 0.5 * (mass @ dist - dist @ mass)
    return t[row_part], t[col_part]


def kantorovich_potentials(x, y, a=None, b=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kantorovich potentials of the 1-Wasserstein distance between point clouds, Euclidean cost (eq. 1-2).

    Args:
        x: (n, d) points of the first measure (in HPO, the policy steps); tensor or array, any float dtype/device.
        y: (m, d) points of the second measure (the hindsight steps).
        a, b: (n,) and (m,) non-negative weights; uniform when None. They are normalised to sum to 1.

    Returns:
        `(f, g, w1)`: float64 CPU tensors of shapes (n,), (m,) and () such that f_i + g_j <= |x_i - y_j| for all
        i, j (dual feasibility) and a.f + b.g = w1 = W1(a, b), the optimal cost. Normalisation: f has weighted mean
        zero under a (a.f = 0, so b.g = w1), matching the per-group centring of HPO's code; beyond that shift the
        potentials are the canonical (order-independent, "central") optimal duals described in the module
        docstring. f is a c-transform of g, hence 1-Lipschitz on the x points (and g on the y points); for a
        zero-weight point it is the largest feasible value.

    Raises:
        ValueError: a cloud that is not 2-D, has no points, width 0, or NaN/inf rows (the message names it and
            counts the rows); widths that differ; weights of the wrong shape, negative, non-finite or summing to 0.
        RuntimeError: POT's solver did not reach optimality.
    """
    xt, yt = _as_cloud("x", x), _as_cloud("y", y)
    if xt.shape[1] != yt.shape[1]:
        raise ValueError(f"x and y must have the same width, got x width {xt.shape[1]} and y width {yt.shape[1]}")
    n, m = xt.shape[0], yt.shape[0]
    aw, bw = _as_weights("a", a, n), _as_weights("b", b, m)
    cost = _euclidean_cost(xt.numpy(), yt.numpy())

    plan, log = ot.emd(aw, bw, cost, log=True, numItermax=max(100_000, 10 * n * m))
    if log["result_code"] != 1:
        raise RuntimeError(f"ot.emd did not converge: {log['warning']}")

    f, g = np.full(n, np.nan), np.full(m, np.nan)
    ra, rb = aw > 0, bw > 0
    sub_cost = cost[np.ix_(ra, rb)]
    u, v = log["u"][ra], log["v"][rb]
    shift_u, shift_v = _central_shifts(sub_cost, plan[np.ix_(ra, rb)], u, v, aw[ra])
    f[ra], g[rb] = u + shift_u, v - shift_v
    # The c-transform leaves the tight positive-weight duals as they are (up to rounding) and gives zero-weight
    # points, which the LP leaves undetermined, the largest value that keeps the duals feasible.
    f = np.min(cost[:, rb] - g[rb][None, :], axis=1)
    g = np.min(cost - f[:, None], axis=0)
    shift = float(aw @ f)
    f, g = f - shift, g + shift
    w1 = float(bw @ g)  # = a.f + b.g, as a.f = 0
    if abs(w1 - log["cost"]) > 1e-7 * (1.0 + abs(log["cost"])):
        raise RuntimeError(f"dual objective {w1} differs from the optimal cost {log['cost']}")
    return torch.from_numpy(f), torch.from_numpy(g), torch.tensor(w1, dtype=torch.float64)


def geomloss_potentials(x, y) -> tuple[torch.Tensor, float]:
    """[code] The HPO authors' potentials: geomloss `SamplesLoss("sinkhorn", p=1, blur=0.01, scaling=0.5,
    debias=False, potentials=True)` on float32 clouds, uniform weights; f (n,) float64 centred to mean 0, and the
    loss <a, F> + <b, G>.

    Not the exact f* of eq. 13-14: epsilon-scaling at 0.5 runs about one averaged Sinkhorn iteration per scale and
    stops at epsilon = 0.01, far from converged (`scripts/hpo_solvers.py` measures how far; `docs/method.md`).
    """
    from geomloss import SamplesLoss  # only this solver needs it

    xt, yt = _as_cloud("x", x).float(), _as_cloud("y", y).float()
    loss = SamplesLoss("sinkhorn", p=1, blur=0.01, scaling=0.5, debias=False, potentials=True, backend="tensorized")
    f, g = (t.reshape(-1).double() for t in loss(xt, yt))
    w1 = float(f.mean() + g.mean())
    return f - f.mean(), w1


HPO_SOLVERS = ("exact", "geomloss")


# ------------------------------------------------------------------------------------------ step advantages
def potential_step_weights(policy_emb, hindsight_emb, solver: str = "exact") -> tuple[torch.Tensor, float]:
    """The per-group numerator of eq. 16: w_i = -(n / (n - 1)) * (f_i - mean f), and W1.

    f is the Kantorovich potential of W1(policy, hindsight) on the n policy points, both clouds uniformly weighted
    [paper eq. 12, 14; code: geomloss with uniform weights, `F, _ = ot(all_emb, pos_emb)`]: `solver` "exact" is
    `kantorovich_potentials`, "geomloss" the authors' call (`geomloss_potentials`). The sign makes a
    lower potential (closer to the hindsight set) a positive advantage [paper eq. 16]. The n / (n - 1) factor, with
    n - 1 read as 1 for n = 1, is [code] `all_w = (len(k_all) / max(len(k_all) - 1, 1)) * (k_all - mean)`; it only
    matters between groups of different sizes, as the batch std divides it out otherwise. Returns float64 (n,).
    """
    if solver == "exact":
        f, _, w1 = kantorovich_potentials(policy_emb, hindsight_emb)
    elif solver == "geomloss":
        f, w1 = geomloss_potentials(policy_emb, hindsight_emb)
    else:
        raise ValueError(f"solver must be one of {HPO_SOLVERS}, got {solver!r}")
    n = f.numel()
    return -(n / max(n - 1, 1)) * (f - f.mean()), float(w1)


@dataclass(frozen=True)
class GroupStepAdvantages:
    """One group's step weights before batch normalisation.

    `raw` (n,) float64 is `potential_step_weights` of the group, zeros when `fallback`; `step_index` (n,) int64
    the step of each policy point (0 = prompt segment); `scale` the factor applied after normalisation (online:
    positive-step ratio, offline: n_off / max_off); `mode` "online" or "offline" (it picks the default clip);
    `fallback` says the group gets no step advantage (A_S = 0), `reasons` why as `FALLBACK_REASONS` codes and
    `reason` in words. Embeddings are used as float64 on the CPU whatever their dtype and device.
    """

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
    """Why an online group gets no step advantage, `{reason code: words}`, empty when it is eligible.

    [code] A group is used only with >= 4 steps from successful rollouts and >= 4 from failed ones, steps counted
    as the code splits them (step 0, the prompt segment, included). The paper only says online hindsight sets
    fluctuate (section 5.2).
    """
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


def _nonfinite_reason(nonfinite: str, **clouds: torch.Tensor) -> dict[str, str]:
    """{} if every cloud is finite; else the reason, or a ValueError when `nonfinite` is "raise"."""
    if nonfinite not in ("raise", "fallback"):
        raise ValueError(f"nonfinite must be 'raise' or 'fallback', got {nonfinite!r}")
    counts = {name: _nonfinite_rows(t) for name, t in clouds.items()}
    bad = [f"{name} has NaN/inf in {k} of {clouds[name].shape[0]} rows" for name, k in counts.items() if k]
    # Checked before eligibility, so a broken encoder surfaces even in groups that would fall back anyway.
    if bad and nonfinite == "raise":
        raise ValueError("; ".join(bad))
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

    Unscorable rollouts are left out of their group altogether, neither in its policy cloud, nor in its hindsight
    set, nor in the batch std, and get advantage 0, as stock GRPO gives them; a group with no other rollout is this.
    """
    return GroupStepAdvantages(
        raw=torch.zeros(0, dtype=torch.float64),
        step_index=torch.zeros(0, dtype=torch.int64),
        scale=0.0,
        mode=mode,
        fallback=True,
        reason="no rollout of the group could be scored",
        reasons=("no_scorable_rollout",),
    )


def online_group_step_advantages(
    policy_emb,
    rollout_index,
    step_index,
    rollout_success,
    *,
    min_positive: int = MIN_POSITIVE_STEPS,
    min_negative: int = MIN_NEGATIVE_STEPS,
    nonfinite: str = "raise",
    solver: str = "exact",
) -> GroupStepAdvantages:
    """Online HPO for one prompt: the hindsight set is the group's own steps from successful rollouts.

    Args:
        policy_emb: (n, d) embeddings of every step of every rollout of the prompt (step 0 included if embedded).
        rollout_index: (n,) which rollout, in [0, G), each step belongs to.
        step_index: (n,) step of each point in its rollout; 0 = prompt segment, zeroed after normalisation.
        rollout_success: (G,) bool, or 0/1 numbers. [code] success is an outcome score of exactly 1.
        min_positive, min_negative: the eligibility rule of `online_fallback_reason`.
        nonfinite: "raise" (ValueError naming the rows) or "fallback" (flag the group, never NaN).
        solver: `potential_step_weights`' "exact" or "geomloss".

    [paper eq. 12] the hindsight set is the steps of successful trajectories. [code] they are a subset of the policy
    cloud (the policy cloud holds all steps of all rollouts), and `scale` is the positive-step ratio n_pos / n.
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
    n_pos = int(positive.sum())
    n = emb.shape[0]
    reason = _nonfinite_reason(nonfinite, policy_emb=emb) or online_fallback_reason(
        n_pos, n - n_pos, min_positive, min_negative
    )
    scale = n_pos / n if n else 0.0
    return _group_result(emb, emb[positive], steps, scale, "online", reason, n_pos, solver)


def offline_group_step_advantages(
    policy_emb,
    step_index,
    hindsight_emb,
    n_off_trajectories: int,
    *,
    max_off_trajectories: int = MAX_OFF_TRAJECTORIES,
    nonfinite: str = "raise",
    solver: str = "exact",
) -> GroupStepAdvantages:
    """Offline HPO for one prompt: the hindsight set is the steps of pre-collected successful trajectories.

    Args:
        policy_emb: (n, d) embeddings of every step of every rollout of the prompt.
        step_index: (n,) step of each point; 0 = prompt segment, zeroed after normalisation.
        hindsight_emb: (k, d) embeddings of the steps of the prompt's offline successful trajectories; k = 0 (or
            n_off_trajectories = 0) makes the group a fallback.
        n_off_trajectories: how many trajectories `hindsight_emb` comes from.
        max_off_trajectories: [code] `max_off_num`; `scale` = min(n_off, max_off) / max_off, so prompts with fewer
            offline successes weigh less. The code assumes the set is already capped; here the scale is capped.
        nonfinite: "raise" or "fallback", as in `online_group_step_advantages`.
        solver: `potential_step_weights`' "exact" or "geomloss".

    [paper section 4.2, "offline HPO"] rejection-sampled successes of the initial policy. [code] no eligibility
    rule: every group with offline successes is used.
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
    reason = _nonfinite_reason(nonfinite, policy_emb=emb, hindsight_emb=hind)
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


def normalize_step_advantages(
    groups: Sequence[GroupStepAdvantages], *, clip: float | None = None, eps: float = STD_EPS, zero_step0: bool = True
) -> StepAdvantageBatch:
    """The batch-level part of eq. 16, as the authors' code does it.

    A_S = clip(raw / (sigma + eps), -clip, clip) * scale, then 0 at step 0 and for fallback groups, where
    - sigma is the std (ddof=1) of the raw weights of all non-fallback groups together, step 0 included [code; the
      paper's std(f*) does not say over what]. Each group's raw weights already have mean zero, so there is no
      recentring [paper eq. 16 subtracts mean(-f*) per group; code: `all_w` centred per group, then `w * inv`];
    - clip defaults to 1 for online and 5 for offline groups [code];
    - scale is the group's positive-step ratio (online) or n_off / max_off (offline) [code];
    - step 0, the prompt segment, enters sigma but gets 0 [code: `step_returns[0]` stays 0];
    - if sigma = 0 (all raw weights are 0) the values are left unscaled and unclipped, i.e. 0 [code].
    """
    if clip is None:
        modes = {g.mode for g in groups}
        if len(modes) > 1:
            raise ValueError(f"groups mix modes {sorted(modes)}; pass clip explicitly")
        clip = OFFLINE_CLIP if modes == {"offline"} else ONLINE_CLIP
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    used = [g.raw for g in groups if not g.fallback]
    pooled = torch.cat(used) if used else torch.zeros(0, dtype=torch.float64)
    sigma = float(pooled.std(correction=1)) if pooled.numel() > 1 else 0.0
    values = []
    for g in groups:
        if g.fallback:
            values.append(torch.zeros_like(g.raw))
            continue
        v = (g.raw / (sigma + eps)).clamp(-clip, clip) if sigma > 0 else g.raw.clone()
        v = v * g.scale
        if zero_step0:
            v[g.step_index == 0] = 0.0
        values.append(v)
    return StepAdvantageBatch(values=values, sigma=sigma, clip=float(clip), fallback=[g.fallback for g in groups])


# ---------------------------------------------------------------------------------------- final advantage
def combine_advantages(episode_adv, step_adv, omega: float, episode_only=None) -> torch.Tensor:
    """Eq. 17: (A_E + omega * A_S) / (1 + omega) [paper; code `compute_otgrpo_outcome_advantage`].

    Args:
        episode_adv: A_E, (B,) per rollout or already the shape of `step_adv`.
        step_adv: A_S, (B, S) per step (or (B, T) per token) or (B,).
        omega: >= 0; 0 gives plain GRPO.
        episode_only: optional bool, (B,) or the shape of `step_adv`: where True the result is A_E itself. The
            authors' code has no such switch: a fallback group has A_S = 0 and so gets A_E / (1 + omega). Pass the
            fallback flags here to fall back to the unscaled episode advantage instead.
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
    """Per-token advantages: token t of row b gets `step_values[b][token_step_index[b, t]]`, or 0 where the index is -1.

    Args:
        step_values: (B, S) tensor, or a list of B 1-D tensors of different lengths (one value per step/turn).
        token_step_index: (B, T) integers in [-1, S_b); -1 marks tokens of no step (prompt, padding, tool-response
            tokens the caller does not assign): they get 0, and the loss masks them anyway [code: `valid = sidx >= 0`].

    Returns (B, T) in the dtype of `step_values`, on the device of `token_step_index`.
    """
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


# -------------------------------------------------------------------------------------------------- bench
def bench_potentials(sizes=(16, 64, 256, 1024), dim: int = 1024, repeats: int = 3, seed: int = 0) -> list[dict]:
    """Seconds per `kantorovich_potentials` call for n = m = each size, on seeded random float32 embeddings.

    The second cloud is shifted so W1 > 0. Equal sizes with uniform weights make the optimal plan a perfect
    matching, the worst case for the canonical-dual step (one part per pair). Returns one dict per size:
    n, m, dim, repeats, seconds (mean), seconds_min, w1.
    """
    gen = torch.Generator().manual_seed(seed)
    results = []
    for size in sizes:
        x = torch.randn(size, dim, generator=gen, dtype=torch.float32)
        y = torch.randn(size, dim, generator=gen, dtype=torch.float32) + 0.1
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, _, w1 = kantorovich_potentials(x, y)
            times.append(time.perf_counter() - start)
        results.append(
            {
                "n": size,
                "m": size,
                "dim": dim,
                "repeats": repeats,
                "seconds": sum(times) / len(times),
                "seconds_min": min(times),
                "w1": float(w1),
            }
        )
    return results


# ------------------------------------------------------------------------------ steps of a TRL rollout (trainer side)
def turn_index(completion_mask: torch.Tensor, tool_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T) step of each completion token: j >= 1 for the tokens of assistant turn j, -1 for tool-response tokens
    and padding.

    A TRL completion is assistant turn 1, a tool response (`tool_mask` 0), turn 2, ...: the turns are the runs of
    tokens with `completion_mask * tool_mask` = 1. Steps are assistant turns (paper section 4.1); step 0, the prompt,
    has no completion tokens.
    """
    kept = completion_mask.bool() if tool_mask is None else (completion_mask * tool_mask).bool()
    starts = kept & ~torch.nn.functional.pad(kept, (1, 0))[:, :-1]
    index = torch.cumsum(starts.long(), dim=1)
    return torch.where(kept, index, torch.full_like(index, -1))


def step_segments(
    tokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    tool_mask: torch.Tensor | None,
    drop_token_ids: Sequence[int] = (),
) -> list[list[str]]:
    """The text of each step of each rollout: `[prompt, segment 1, ..., segment T]` per row.

    Segment j is what the rollout added between the end of turn j - 1 and the end of turn j: the tool response to
    turn j - 1 (if any), then turn j itself. Concatenated, segments 0..j are the history up to step j plus its action
    text, the state-action pair HPO embeds (section 4.2; the authors' code also appends the observation that follows
    the action, which here is an image the text encoder cannot read). `drop_token_ids` (the image pads) are removed
    before decoding: a text encoder reads thousands of `<|image_pad|>` as noise.
    """
    drop = torch.tensor(list(drop_token_ids), dtype=prompt_ids.dtype, device=prompt_ids.device)
    turns = turn_index(completion_mask, tool_mask)
    rows = []
    for b in range(prompt_ids.shape[0]):

        def text(ids: torch.Tensor) -> str:
            return tokenizer.decode(ids[~torch.isin(ids, drop)].tolist(), skip_special_tokens=False)

        segments = [text(prompt_ids[b][prompt_mask[b].bool()])]
        ends = [int(t) for t in (turns[b][:-1] != turns[b][1:]).nonzero().flatten() if turns[b][t] > 0]
        if turns[b].numel() and turns[b][-1] > 0:
            ends.append(turns[b].numel() - 1)
        start = 0
        for end in ends:
            segments.append(text(completion_ids[b][start : end + 1]))
            start = end + 1
        rows.append(segments)
    return rows


class StepEncoder:
    """A frozen causal text encoder (Qwen3-Embedding-0.6B by default) embedding every step of every rollout.

    Like the CLIP verifier it lives beside the policy (never wrapped by DeepSpeed/accelerate, no gradients, half
    precision on GPU). A rollout's segments are tokenized and concatenated, and one forward pass gives every step:
    the embedding of step j is the last hidden state at the last token of segments 0..j, a causal model's summary of
    that prefix (the authors' code; no L2 normalisation). A rollout longer than `max_length` tokens embeds each step
    from its own window, the last `max_length` tokens up to its end.
    """

    def __init__(self, name: str, device: torch.device | str = "cpu", max_length: int = 8192, batch_size: int = 16):
        self.device = torch.device(device)
        with torch.random.fork_rng(devices=[]):  # loading must not move the policy's sampling RNG
            self.model, self.tokenizer = load_text_encoder(name)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model.to(device=self.device, dtype=dtype)
        self.max_length, self.batch_size = max_length, batch_size
        self.width = self.model.config.hidden_size

    @torch.no_grad()
    def embed(self, rollouts: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        """Per rollout, a (steps, width) float32 CPU tensor: one row per segment prefix."""
        windows, owners = [], []  # token ids to run, and (rollout, step) of each position read from them
        for r, segments in enumerate(rollouts):
            pieces = [self.tokenizer(s, add_special_tokens=False)["input_ids"] for s in segments]
            ids = [token for piece in pieces for token in piece]
            ends = list(accumulate(max(len(p), 0) for p in pieces))
            ends = [max(e, 1) - 1 for e in ends]  # an empty first segment still reads position 0
            if len(ids) <= self.max_length:
                windows.append(ids or [self.tokenizer.pad_token_id or 0])
                owners.append([(r, s, e) for s, e in enumerate(ends)])
            else:
                for s, e in enumerate(ends):
                    lo = max(0, e + 1 - self.max_length)
                    windows.append(ids[lo : e + 1])
                    owners.append([(r, s, e - lo)])
        out = [torch.empty(len(segments), self.width) for segments in rollouts]
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))  # similar lengths batch with less padding
        pad = self.tokenizer.pad_token_id or 0
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            width = max(len(windows[i]) for i in chunk)
            ids = torch.tensor([windows[i] + [pad] * (width - len(windows[i])) for i in chunk], device=self.device)
            mask = torch.tensor([[1] * len(windows[i]) + [0] * (width - len(windows[i])) for i in chunk])
            hidden = self.model(input_ids=ids, attention_mask=mask.to(self.device)).last_hidden_state.float().cpu()
            for row, i in enumerate(chunk):
                for r, s, position in owners[i]:
                    out[r][s] = hidden[row, position]
        return out


# ------------------------------------------------------------------------------------------------ trainer wiring
class HPOAdvantages:
    """HPO for `MAPOTrainer` (`advantage_estimator: hpo | mapo+hpo`): the text encoder of the intent space, the
    offline hindsight cache, and eq. 17 over one generation batch (`__call__`).

    `config` is the run's `configs.MAPOConfig` (its `hpo_*` fields).
    """

    def __init__(self, config, device: torch.device | str = "cpu"):
        self.config = config
        self.encoder = StepEncoder(config.hpo_text_encoder, device=device, max_length=config.hpo_encoder_max_length)
        self._offline_embeddings: OrderedDict[str, tuple[torch.Tensor, int]] = OrderedDict()  # LRU

    def __call__(
        self,
        inputs: list[dict],
        out: dict,
        *,
        outcome: torch.Tensor,
        num_generations: int,
        tokenizer,
        drop_token_ids: Sequence[int],
        process_index: int,
    ) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """Per-token advantages (B, T) of this process's rollouts (eq. 17, A_E being `out["advantages"]`, TRL's GRPO
        or MAPO advantage), the step's `hpo/*` metrics, and each gathered rollout's per-turn advantages as text.

        `out` is `GRPOTrainer._generate_and_score_completions`' output, `outcome` R_out of the whole gathered batch.
        Every process embeds its own rollouts' steps; the embeddings are gathered so that each group, possibly split
        across processes, is transported whole, and every process computes the same batch statistics (eq. 16's std).
        """
        args = self.config
        segments = step_segments(
            tokenizer,
            out["prompt_ids"],
            out["prompt_mask"],
            out["completion_ids"],
            out["completion_mask"],
            out.get("tool_mask"),
            drop_token_ids=drop_token_ids,
        )
        steps = gather_object(self.encoder.embed(segments))
        scorable = ~torch.isnan(outcome.cpu())  # unscorable rows (outcome NaN) take no part in HPO: advantage 0
        success = outcome.cpu() >= args.hpo_success_threshold
        if args.hpo_hindsight == "offline":
            offline = gather_object([row.get(args.hpo_hindsight_column) for row in inputs])
            prompts = gather_object([rollout[0] for rollout in segments])
        groups, members = [], []
        for first in range(0, len(steps), num_generations):
            rows = [r for r in range(first, first + num_generations) if scorable[r]]
            members.append(rows)
            if not rows:
                groups.append(unscorable_group(args.hpo_hindsight))
                continue
            emb = torch.cat([steps[r] for r in rows])
            rollout = torch.cat([torch.full((len(steps[r]),), k) for k, r in enumerate(rows)])
            step = torch.cat([torch.arange(len(steps[r])) for r in rows])
            if args.hpo_hindsight == "online":
                group = online_group_step_advantages(
                    emb,
                    rollout,
                    step,
                    success[rows],
                    min_positive=args.hpo_min_positive_steps,
                    min_negative=args.hpo_min_negative_steps,
                    nonfinite="fallback",
                    solver=args.hpo_solver,
                )
            else:
                hindsight, n_off = self._offline_hindsight(offline[first], prompts[first], row=first)
                group = offline_group_step_advantages(
                    emb, step, hindsight, n_off, max_off_trajectories=args.hpo_max_offline_trajectories,
                    nonfinite="fallback", solver=args.hpo_solver,
                )  # fmt: skip
            groups.append(group)
        batch = normalize_step_advantages(groups)
        per_row = [torch.zeros(len(s), dtype=torch.float64) for s in steps]  # A_S; 0 for unscorable rows
        fallback = [False] * len(steps)
        for rows, values, fell_back in zip(members, batch.values, batch.fallback):
            for r, v in zip(rows, values.split([len(steps[r]) for r in rows])):
                per_row[r], fallback[r] = v, fell_back
        local = slice(process_index * len(inputs), (process_index + 1) * len(inputs))
        turns = turn_index(out["completion_mask"], out.get("tool_mask"))
        step_adv = broadcast_to_tokens(per_row[local], turns)
        # [code] a fallback group has A_S = 0, so it gets A_E / (1 + omega); 'unscaled' gives it A_E itself.
        episode_only = fallback[local] if args.hpo_fallback == "unscaled" else None
        advantages = combine_advantages(out["advantages"], step_adv, args.hpo_omega, episode_only=episode_only)
        advantages[~scorable[local].to(advantages.device)] = 0.0  # as stock GRPO: no signal from a row not scored

        used = [g.w1 for g in groups if not g.fallback]
        metrics = {
            "hpo/fallback_frac": batch.n_fallback / len(groups),
            "hpo/step_adv_sigma": batch.sigma,
            "hpo/w1": sum(used) / len(used) if used else 0.0,
        }
        for reason in FALLBACK_REASONS:
            metrics[f"hpo/fallback/{reason}"] = sum(reason in g.reasons for g in groups) / len(groups)
        a_e = gather_object(out["advantages"].tolist())
        turn_values = []
        for a, values, fell_back, ok in zip(a_e, per_row, fallback, scorable.tolist()):
            if not ok:
                shown = [0.0] * (len(values) - 1)
            elif fell_back and args.hpo_fallback == "unscaled":
                shown = [a] * (len(values) - 1)
            else:
                shown = [(a + args.hpo_omega * v) / (1 + args.hpo_omega) for v in values[1:].tolist()]
            turn_values.append(" | ".join(f"{x:.3f}" for x in shown))
        return advantages.to(out["advantages"].dtype), metrics, turn_values

    def _offline_hindsight(self, trajectories, prompt_segment: str, row: int) -> tuple[torch.Tensor, int]:
        """The offline hindsight cloud of one prompt (every step of its stored successful trajectories, the prompt
        included), embedded once and kept for the `OFFLINE_CACHE_PROMPTS` most recently used prompts, and how many
        trajectories it holds."""
        column = self.config.hpo_hindsight_column
        trajectories = [t for t in trajectories or [] if t]
        if not trajectories:
            return torch.zeros(0, self.encoder.width), 0
        if all(isinstance(step, str) for trajectory in trajectories for step in trajectory):
            key = prompt_segment + "\x00" + "\x00".join("\x01".join(t) for t in trajectories)
            cache = self._offline_embeddings
            if key in cache:
                cache.move_to_end(key)
            else:
                embedded = self.encoder.embed([[prompt_segment, *t] for t in trajectories])
                cache[key] = (torch.cat(embedded), len(trajectories))
                if len(cache) > OFFLINE_CACHE_PROMPTS:
                    cache.popitem(last=False)
            return cache[key]
        steps = torch.tensor([step for trajectory in trajectories for step in trajectory], dtype=torch.float32)
        if steps.dim() != 2 or steps.shape[1] != self.encoder.width:
            raise ValueError(
                f"column {column!r}, row {row}: stored step embeddings have width "
                f"{steps.shape[-1] if steps.dim() else 0}, the text encoder {self.config.hpo_text_encoder!r} "
                f"{self.encoder.width}: embed the offline set with the same encoder, or store step texts"
            )
        return steps, len(trajectories)
