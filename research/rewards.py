"""The experiment world's outcome rewards, named by import path in its recipes
(`reward_funcs: [research.rewards:simulated_reader_reward]`): a simulated reader whose success depends only on where
the policy looked, and its noise-free twin for positive controls, the grounding reward (`reward_funcs:
[target_in_view]`). Both now live in production (`rewards.simulated_reader`, `rewards.grounding`; `make demo` trains
on the reader) and are re-exported here under the names the experiments and their recipes use. Both read the rows'
`target_bbox`.
"""

from __future__ import annotations

from rewards.grounding import (  # noqa: F401 (the experiment's names for them)
    MAX_ZOOM_AREA,
    frames_target,
    is_zoom,
    target_in_view,
    target_in_view_reward,
    target_seen,
)
from rewards.outcome import format_reward  # noqa: F401 (importable here as before the move)
from rewards.simulated_reader import (  # noqa: F401 (the experiment's names for them)
    READER_HIT_P,
    READER_MISS_P,
    reader_draw,
    reader_outcome,
    simulated_reader_reward,
)

READER_MAX_AREA = MAX_ZOOM_AREA  # what counts as a zoom: the production grounding reward's rule (`rewards.grounding`)
