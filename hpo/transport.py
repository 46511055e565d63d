"""Kantorovich potentials of the 1-Wasserstein distance between two point clouds (HPO eq. 1-2, 13-14), POT's exact
solver or the authors' geomloss Sinkhorn (`hpo_solver`), and a group's step weights from them (eq. 16's numerator).
Pure: tensors and arrays in, float64 CPU tensors out. Exact potentials are unique only up to a shift on each connected
part of the optimal plan's support; `_central_shifts` picks canonical ones, independent of point order and solver.
"""

from __future__ import annotations

import numpy as np
import ot
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, csgraph_from_dense, floyd_warshall

_SUPPORT_TOL = 1e-12  # plan entries below this (masses sum to 1) are rounding residue, not transport
_NEAR_DUPLICATE = 1e-4  # squared distances below this fraction of |x|^2 + |y|^2 are recomputed exactly


def nonfinite_rows(t: torch.Tensor) -> int:
    """Rows of a CPU float64 (rows, width) tensor holding NaN or inf."""
    # numpy, not torch: torch's threaded isfinite costs milliseconds on small tensors when the cores are busy.
    return int((~np.isfinite(t.numpy())).any(axis=1).sum())


def _as_cloud(name: str, x) -> torch.Tensor:
    """`x` as a float64 CPU tensor (rows, width), or a ValueError naming `name`."""
    t = torch.as_tensor(x).detach()
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (points, width), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty (0 points): W1 needs at least one point on each side")
    if t.shape[1] == 0:
        raise ValueError(f"{name} has width 0")
    t = t.to(device="cpu", dtype=torch.float64)
    if bad := nonfinite_rows(t):
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
    """Kantorovich potentials of W1 between clouds `x` (n, d; in HPO the policy steps) and `y` (m, d; the hindsight
    steps), Euclidean cost (eq. 1-2), with non-negative weights `a`, `b` (uniform when None; normalised to sum 1).

    Returns float64 CPU `(f, g, w1)`, (n,), (m,), (): f_i + g_j <= |x_i - y_j| and a.f + b.g = w1 = W1(a, b). f has
    weighted mean zero (a.f = 0), as HPO's code centres per group; beyond that the duals are the canonical ones
    (module docstring). f is a c-transform of g (1-Lipschitz); a zero-weight point gets its largest feasible value.
    ValueError: a cloud not 2-D, empty, of width 0 or with NaN/inf rows (named, counted); widths that differ; bad
    weights. RuntimeError: POT's solver did not reach optimality.
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
    debias=False, potentials=True)` on float32 clouds, uniform weights; f (n,) float64 centred, and <a, F> + <b, G>.
    Not eq. 13-14's exact f*: it stops far from converged (`docs/method.md`)."""
    from geomloss import SamplesLoss  # only this solver needs it

    xt, yt = _as_cloud("x", x).float(), _as_cloud("y", y).float()
    loss = SamplesLoss("sinkhorn", p=1, blur=0.01, scaling=0.5, debias=False, potentials=True, backend="tensorized")
    f, g = (t.reshape(-1).double() for t in loss(xt, yt))
    w1 = float(f.mean() + g.mean())
    return f - f.mean(), w1


HPO_SOLVERS = ("exact", "geomloss")


def potential_step_weights(policy_emb, hindsight_emb, solver: str = "exact") -> tuple[torch.Tensor, float]:
    """The per-group numerator of eq. 16, float64 (n,): w_i = -(n / (n - 1)) * (f_i - mean f), and W1.

    f: the potential of W1(policy, hindsight) on the n policy points, uniform weights [paper eq. 12, 14; code
    `F, _ = ot(all_emb, pos_emb)`], by `solver` "exact" (`kantorovich_potentials`) or "geomloss". A lower potential
    (closer to the hindsight set) is a positive advantage [paper eq. 16]. n / max(n - 1, 1) is [code] `all_w`'s; it
    matters only between groups of different sizes (the batch std divides it out).
    """
    if solver == "exact":
        f, _, w1 = kantorovich_potentials(policy_emb, hindsight_emb)
    elif solver == "geomloss":
        f, w1 = geomloss_potentials(policy_emb, hindsight_emb)
    else:
        raise ValueError(f"solver must be one of {HPO_SOLVERS}, got {solver!r}")
    n = f.numel()
    return -(n / max(n - 1, 1)) * (f - f.mean()), float(w1)
