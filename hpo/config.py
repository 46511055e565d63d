"""`HPOArguments`: the recipe fields of HPO's step advantage (`advantage_estimator: hpo | mapo+hpo`), composed
into `configs.MAPOConfig` (flat recipe keys, as before)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpo.advantages import MAX_OFF_TRAJECTORIES, MIN_NEGATIVE_STEPS, MIN_POSITIVE_STEPS
from hpo.transport import HPO_SOLVERS

HPO_HINDSIGHT = ("online", "offline")
HPO_FALLBACK = ("scaled", "unscaled")


@dataclass
class HPOArguments:
    """HPO's fields (HPO eq. 13-17; docs/method.md); read only when `advantage_estimator` is hpo or mapo+hpo."""

    hpo_omega: float = field(default=0.5, metadata={"help": "omega of HPO eq. 17 (paper: 0.5)."})
    hpo_hindsight: str = field(
        default="online",
        metadata={
            "help": "HPO's hindsight set. 'online': the steps of the group's own successful rollouts (a group with "
            "too few positive or negative steps falls back: hpo/fallback_frac, hpo/fallback/<reason>). 'offline': "
            "successful trajectories stored per prompt in the dataset column `hpo_hindsight_column`.",
            "choices": list(HPO_HINDSIGHT),
        },
    )
    hpo_fallback: str = field(
        default="scaled",
        metadata={
            "help": "Advantage of a fallback group (no step advantage): 'scaled', A_E / (1 + omega), eq. 17 with "
            "A_S = 0 (the authors' code); 'unscaled', A_E, 1 + omega times the weight of eligible groups.",
            "choices": list(HPO_FALLBACK),
        },
    )
    hpo_solver: str = field(
        default="exact",
        metadata={
            "help": "Kantorovich potentials of HPO eq. 13-14. 'exact': POT's exact solver (the paper's f*). "
            "'geomloss': the authors' Sinkhorn, far from converged (docs/method.md).",
            "choices": list(HPO_SOLVERS),
        },
    )
    hpo_hindsight_column: str = field(
        default="hindsight",
        metadata={
            "help": "Offline hindsight: per row, successful trajectories, each a list of step texts or embeddings."
        },
    )
    hpo_success_threshold: float = field(
        default=1.0,
        metadata={"help": "A rollout succeeded when its outcome reward (R_out, without R_sem) is at least this."},
    )
    hpo_min_positive_steps: int = field(
        default=MIN_POSITIVE_STEPS, metadata={"help": "Online HPO: fewest steps of successful rollouts a group needs."}
    )
    hpo_min_negative_steps: int = field(
        default=MIN_NEGATIVE_STEPS, metadata={"help": "Online HPO: fewest steps of failed rollouts a group needs."}
    )
    hpo_max_offline_trajectories: int = field(
        default=MAX_OFF_TRAJECTORIES,
        metadata={"help": "Offline HPO: max_off_num; a prompt's step advantage scales by n_off / this."},
    )
    hpo_text_encoder: str = field(
        default="Qwen/Qwen3-Embedding-0.6B",
        metadata={"help": "Text encoder of HPO's intent space (HPO section 4.2), a hub name or local folder."},
    )
    hpo_encoder_max_length: int = field(default=8192, metadata={"help": "Longest token window the encoder reads."})
