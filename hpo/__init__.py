"""HPO, the step-level advantage estimator (Hindsight Policy Optimization, Li et al., section 4.3), for `MAPOTrainer`
(`advantage_estimator: hpo | mapo+hpo`): `transport` (W1's Kantorovich potentials, eq. 13-14) and `advantages`
(eq. 16-17), both pure; `steps` (a rollout's steps, their text encoder); `estimator` (the trainer's wiring). The
derivation, the authors' code each choice follows and how this differs from both: `docs/method.md`.
"""

from hpo.advantages import (
    FALLBACK_REASONS,
    MAX_OFF_TRAJECTORIES,
    MIN_NEGATIVE_STEPS,
    MIN_POSITIVE_STEPS,
    broadcast_to_tokens,
    combine_advantages,
    normalize_step_advantages,
    offline_group_step_advantages,
    online_fallback_reason,
    online_group_step_advantages,
    unscorable_group,
)
from hpo.estimator import HPOAdvantages
from hpo.steps import StepEncoder, step_segments, turn_index
from hpo.transport import HPO_SOLVERS, geomloss_potentials, kantorovich_potentials, potential_step_weights

__all__ = [
    "FALLBACK_REASONS",
    "HPO_SOLVERS",
    "MAX_OFF_TRAJECTORIES",
    "MIN_NEGATIVE_STEPS",
    "MIN_POSITIVE_STEPS",
    "HPOAdvantages",
    "StepEncoder",
    "broadcast_to_tokens",
    "combine_advantages",
    "geomloss_potentials",
    "kantorovich_potentials",
    "normalize_step_advantages",
    "offline_group_step_advantages",
    "online_fallback_reason",
    "online_group_step_advantages",
    "potential_step_weights",
    "step_segments",
    "turn_index",
    "unscorable_group",
]
