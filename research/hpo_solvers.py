"""How far HPO's solvers (`hpo_solver`) are from each other on HPO-like groups: exact potentials (POT's EMD, the
paper's f*), the authors' geomloss Sinkhorn (blur 0.01, scaling 0.5), and POT's entropic solver run to convergence at
the authors' regularisation (epsilon = blur = 0.01, `ot.bregman.sinkhorn_epsilon_scaling`).

python -m research.hpo_solvers            # ~2 min on one core; prints the markdown table quoted in docs/method.md

Groups: online HPO, 8 rollouts of 3-6 steps (step 0, the prompt, shared by the group's rollouts), 2-6 of them
successful, in 1024-D: (a) norms 30-100, like a causal LM's unnormalised last hidden states (the authors' step
embeddings), steps of a rollout correlated; (b) the same points on the unit sphere. Per group, the median over points
of |f_a - f_b| / range(f_exact), both centred; per batch of 8 groups, ||A_S,a - A_S,b|| / ||A_S,b|| through
`hpo.normalize_step_advantages` (eq. 16). Median / 90th percentile over groups and batches. Seeded.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings

import numpy as np
import ot
import torch

import hpo

DIM, ROLLOUTS, BATCH, EPSILON = 1024, 8, 8, 0.01


def make_group(rng: np.random.Generator, unit: bool):
    """One group's points, rollout and step of each, and which rollouts succeeded."""
    base = rng.standard_normal(DIM)
    prompt = base + 0.8 * rng.standard_normal(DIM)
    prompt *= rng.uniform(30, 100) / np.linalg.norm(prompt)
    success = np.zeros(ROLLOUTS, dtype=bool)
    success[rng.choice(ROLLOUTS, int(rng.integers(2, 7)), replace=False)] = True
    points, rollout, step = [], [], []
    for r in range(ROLLOUTS):
        centre, norm = base + 0.8 * rng.standard_normal(DIM), rng.uniform(35, 90)
        points.append(prompt.copy())
        rollout.append(r)
        step.append(0)
        for s in range(1, int(rng.integers(3, 7))):
            v = centre + 0.5 * rng.standard_normal(DIM)
            points.append(v * np.clip(norm * (1 + 0.12 * rng.standard_normal()), 30, 100) / np.linalg.norm(v))
            rollout.append(r)
            step.append(s)
    x = np.stack(points)
    if unit:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, np.array(rollout), np.array(step), success


def entropic_potential(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """POT's converged entropic f at epsilon = 0.01 (epsilon scaling only to reach it faster), centred."""
    n, m = len(x), len(y)
    cost = ot.dist(x, y, metric="euclidean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, log = ot.bregman.sinkhorn_epsilon_scaling(
            np.full(n, 1 / n), np.full(m, 1 / m), cost, EPSILON, numItermax=2000, epsilon0=1e4,
            numInnerItermax=100, tau=1e3, stopThr=1e-10, log=True,
        )  # fmt: skip
    return log["alpha"] - log["alpha"].mean()


def regime(unit: bool, groups: int, seed: int) -> dict[str, tuple[list[float], list[float]]]:
    rng = np.random.default_rng(seed)
    solved, potentials = [], []
    for _ in range(groups):
        x, rollout, step, success = make_group(rng, unit)
        group = hpo.online_group_step_advantages(x, rollout, step, success)
        y = x[success[rollout]]
        f = {
            "exact": hpo.kantorovich_potentials(x, y)[0].numpy(),
            "geomloss": hpo.geomloss_potentials(x, y)[0].numpy(),
            "entropic": entropic_potential(x, y),
        }
        solved.append(group)
        potentials.append({k: v - v.mean() for k, v in f.items()})

    def step_advantages(key: str) -> list[np.ndarray]:
        out = []
        for s in range(0, groups, BATCH):
            batch = []
            for g, f in zip(solved[s : s + BATCH], potentials[s : s + BATCH]):
                n = f[key].size
                batch.append(dataclasses.replace(g, raw=torch.from_numpy(-(n / (n - 1)) * f[key])))
            out.append(np.concatenate([v.numpy() for v in hpo.normalize_step_advantages(batch).values]))
        return out

    a_s = {k: step_advantages(k) for k in ("exact", "geomloss", "entropic")}
    rows = {}
    for a, b in (("geomloss", "exact"), ("entropic", "exact"), ("entropic", "geomloss")):
        per_point = [float(np.median(np.abs(f[a] - f[b])) / (f["exact"].max() - f["exact"].min())) for f in potentials]
        per_batch = [float(np.linalg.norm(u - v) / np.linalg.norm(v)) for u, v in zip(a_s[a], a_s[b])]
        rows[f"{a} vs {b}"] = (per_point, per_batch)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=64, help="groups per regime (a multiple of 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {name: regime(unit, args.groups, args.seed) for name, unit in (("a", False), ("b", True))}

    def q(values: list[float]) -> str:
        return f"{np.median(values):.3f} / {np.quantile(values, 0.9):.3f}"

    print("| solvers | (a) f: median / p90 of range | (a) A_S per batch | (b) f | (b) A_S per batch |")
    print("|---|---|---|---|---|")
    for pair in results["a"]:
        (fa, aa), (fb, ab) = results["a"][pair], results["b"][pair]
        print(f"| {pair} | {q(fa)} | {q(aa)} | {q(fb)} | {q(ab)} |")


if __name__ == "__main__":
    main()
