"""The verifier gate: does z_t reward the right label, or a label that fits everything?

MAPO's semantic reward is only as good as its verifier. Two ways it can fail, both of which RL would exploit:
- it cannot tell the right label from a wrong one on the same crop (z_t is noise);
- some fixed label scores higher than the right one on most crops ("the green object" on every crop), so a policy
  raises z_t by always writing that label: label hacking, which the paper's label-length limits do not stop.

`check_verifier` measures both on gold crops: each row's target cropped by the tool itself, with the box SFT's gold
trajectories use (`data.trajectories.plan_calls`), so the crops are of the sizes RL produces. It scores every label
in the rows (each row's own `target_label` being its right one) against every crop, under each `semantic_score` asked
for (`mapo.scale_similarity`; "contrastive" subtracts each label's score against the whole image), and reports:
- `auc`: P(z of the right label > z of a wrong label on the same crop), over every (row, other label) pair, a tie
  counting half; 0.5 is chance;
- `mean_rank`: the right label's mean rank among all labels on its crop (1 = best), of `labels`;
- `right_z`: the right label's mean z; `best_constant` and `best_constant_z`: the label whose mean z over all crops
  is highest, and that mean; `constant_wins`: the fraction of rows where that fixed label beats the right one;
- `passed`: `auc >= MIN_AUC` and `right_z > best_constant_z`: the right label pays more than any fixed label.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from data.trajectories import TrajectoryArguments, plan_calls
from mapo import scale_similarity
from rewards.verifiers import Scene
from tools import ZoomCall, ZoomInEnv

MIN_AUC = 0.75


@dataclass(frozen=True)
class GateResult:
    """`check_verifier`'s figures for one `semantic_score` (see the module docstring)."""

    semantic_score: str
    rows: int
    labels: int
    auc: float
    mean_rank: float
    right_z: float
    best_constant: str
    best_constant_z: float
    constant_wins: float
    passed: bool

    def as_dict(self) -> dict:
        return asdict(self)


def gold_crops(
    rows: Sequence[dict], make_env: Callable[[], ZoomInEnv], trajectory_args: TrajectoryArguments
) -> tuple[list[ZoomCall], list[Scene]]:
    """Per row, the tool's crop for the row's gold call (one call, `plan_calls`) and the row's `Scene`; a row whose
    call the tool rejects is left out."""
    calls, scenes = [], []
    rng = np.random.default_rng(0)  # plan_calls draws only for misses, which one call never has
    for row in rows:
        env = make_env()
        (call,) = plan_calls(row, row["target_label"], env, 1, rng, trajectory_args)
        env.image_zoom_in_tool(**call)
        if env.calls[-1].ok:
            calls.append(env.calls[-1])
            scenes.append(Scene(env.image, row["target_bbox"], row["target_label"]))
    return calls, scenes


def score_matrix(verifier, calls: Sequence[ZoomCall], scenes: Sequence[Scene], labels: Sequence[str], whole: bool):
    """z of every label (columns) against every crop (rows), or against each crop's whole image when `whole`."""
    pairs = [
        (s.whole_image_call(relabelled) if whole else relabelled, s)
        for c, s in zip(calls, scenes)
        for relabelled in (replace(c, label=label) for label in labels)
    ]
    values = verifier.score([p for p, _ in pairs], [s for _, s in pairs])
    return values.reshape(len(calls), len(labels)).double()


def gate(z: torch.Tensor, right: Sequence[int], labels: Sequence[str], semantic_score: str) -> GateResult:
    """The gate's figures from a (crops x labels) matrix of z and each crop's right-label column."""
    n, k = z.shape
    right = torch.as_tensor(right)
    right_z = z[torch.arange(n), right]
    others = torch.ones_like(z, dtype=torch.bool)
    others[torch.arange(n), right] = False
    wins = (right_z[:, None] > z).double() + 0.5 * (right_z[:, None] == z).double()
    auc = float(wins[others].mean()) if k > 1 else float("nan")
    rank = 1 + (z > right_z[:, None]).sum(dim=1).double() + 0.5 * ((z == right_z[:, None]) & others).sum(dim=1)
    constant = int(z.mean(dim=0).argmax())
    constant_wins = float((z[:, constant] > right_z).double().mean())
    best_z, mean_right = float(z[:, constant].mean()), float(right_z.mean())
    return GateResult(
        semantic_score=semantic_score,
        rows=n,
        labels=k,
        auc=auc,
        mean_rank=float(rank.mean()),
        right_z=mean_right,
        best_constant=labels[constant],
        best_constant_z=best_z,
        constant_wins=constant_wins,
        passed=bool(auc >= MIN_AUC and mean_right > best_z),
    )


def check_verifier(
    verifier,
    rows: Sequence[dict],
    make_env: Callable[[], ZoomInEnv],
    trajectory_args: TrajectoryArguments | None = None,
    semantic_scores: Sequence[str] = ("cosine", "contrastive"),
) -> dict[str, GateResult]:
    """The gate (module docstring) of `verifier` on `rows` (with `image`, `target_bbox`, `target_label`), per
    `semantic_score`."""
    calls, scenes = gold_crops(rows, make_env, trajectory_args or TrajectoryArguments(gold_box="region"))
    if not calls:
        raise ValueError("check_verifier: the tool rejected every row's gold call; nothing to score")
    labels = sorted({s.target_label for s in scenes})
    right = [labels.index(s.target_label) for s in scenes]
    crop_z = score_matrix(verifier, calls, scenes, labels, whole=False)
    whole_z = score_matrix(verifier, calls, scenes, labels, whole=True) if "contrastive" in semantic_scores else None
    return {
        how: gate(scale_similarity(crop_z, how, whole_z if how == "contrastive" else None), right, labels, how)
        for how in semantic_scores
    }
