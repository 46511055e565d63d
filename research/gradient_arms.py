"""The arms `make experiment` compares: the estimators replayed through the trainer, the walk arm's controls and the
walk verifier at each quality, their advantages rebuilt from the recorded columns with `mapo.reference_advantages`
(first checked equal to every replayed trainer's: `check_replays`), and each arm's products (`primary_run`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mapo import reference_advantages, semantic_reward
from research import gradient_stats as gs
from research.gradient_products import Directions, Run
from research.gradient_rollouts import Rollouts
from research.rewards import READER_HIT_P, READER_MISS_P, reader_outcome

# The estimators replayed through the trainer: the fields each sets on the recipe (whose verifier is the walk
# verifier, and whose reward is the 0.7 reader). `grpo` is what each is paired against; `oracle` is GRPO on Q*.
ESTIMATORS: dict[str, dict] = {
    "grpo": {"advantage_estimator": "grpo"},
    "mapo_walk": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact_walk"},
    "mapo_exact": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact"},
    "mapo_clip_cosine": {"advantage_estimator": "mapo", "semantic_verifier": "clip", "semantic_score": "cosine"},
    "mapo_clip_contrastive": {
        "advantage_estimator": "mapo",
        "semantic_verifier": "clip",
        "semantic_score": "contrastive",
    },
    "mapo_clip_cosine_centred": {
        "advantage_estimator": "mapo",
        "semantic_verifier": "research.verifiers:clip_centred",
        "semantic_score": "cosine",
    },
    "mapo_clip_contrastive_centred": {
        "advantage_estimator": "mapo",
        "semantic_verifier": "research.verifiers:clip_centred",
        "semantic_score": "contrastive",
    },
    "hpo": {"advantage_estimator": "hpo"},
    "mapo+hpo": {"advantage_estimator": "mapo+hpo", "semantic_verifier": "research.verifiers:exact_walk"},
    "oracle": {"advantage_estimator": "grpo", "reward_funcs": ["research.rewards:target_in_view_reward"]},
}
CLIP_ARMS = ("mapo_clip_cosine", "mapo_clip_contrastive", "mapo_clip_cosine_centred", "mapo_clip_contrastive_centred")
REINFORCE = "reinforce"  # A = r, the reader's outcome, no baseline: Proposition 1's comparison
REFERENCE, WALK = "grpo", "mapo_walk"
# The controls that pay every valid (zoom) call one constant: R_sem's density with no word on which crop framed the
# target, so the bar for any lower-noise claim made for the walk verdicts' information
CONSTANT_BONUSES = ("C_valid", "C_zoom")
# The controls of the walk arm (`research.gradient_stats`), from the walk arm towards GRPO, each removing one thing:
# C_zoom keeps a constant bonus on valid zoom calls (no word on which framed the target), C_valid on every valid call,
# C_all permutes R_sem among a group's rollouts (no word on which rollout called), C_noise draws z at the walk rate.
CONTROLS = ("C_zoom", "C_valid", "C_all", "C_noise")
CHAIN = (WALK, "C_zoom", "C_valid", "C_all", REFERENCE)
PERMUTATIONS = 100  # draws a randomised control (C_all, C_noise, the quality sweep below 1) is averaged over
QUALITIES = (0.0, 0.25, 0.5, 0.75, 1.0)
REPLAY_TOLERANCE = 1e-5  # reference_advantages against a replayed trainer's advantages (float32)


def check_close(what: str, got: np.ndarray, want: np.ndarray, tolerance: float = REPLAY_TOLERANCE) -> None:
    """Fail naming `what` when two computations of the same figures disagree."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, atol=tolerance, rtol=0):
        gap = np.abs(got - want).max() if got.shape == want.shape else f"shapes {got.shape} vs {want.shape}"
        raise AssertionError(f"{what}: the two computations differ (largest gap {gap})")


def walk_scores(walk: list[list[float | None]]) -> list[list[float]]:
    """The walk verifier's z_t per call, failed calls 0 (as the trainer scores them)."""
    return [[0.0 if v is None else v for v in calls] for calls in walk]


def semantics(scores: list[list[float]], lam: float, empty: float) -> np.ndarray:
    """R_sem (eq. 2) of every rollout from its calls' z_t."""
    return np.asarray([semantic_reward(z, lam, empty=empty) for z in scores])


def episode_advantages(outcome, semantic, group: int, beta: float, scaling: str) -> np.ndarray:
    """`mapo.reference_advantages` (eq. 3, TRL's normalisation) on per-rollout columns, as float32 like the trainer's."""
    t = torch.tensor
    return reference_advantages(
        t(outcome, dtype=torch.float32), t(semantic, dtype=torch.float32), group, beta, scaling
    ).numpy()


def walk_rate(walk: list[list[float | None]]) -> float:
    """c: the walk arm's mean z_t over valid calls."""
    verdicts = [v for calls in walk for v in calls if v is not None]
    return float(np.mean(verdicts)) if verdicts else 0.0


def control_semantics(r: Rollouts, lam: float, empty: float, group: int, seed: int) -> dict[str, list[np.ndarray]]:
    """Each control's R_sem columns (`research.gradient_stats` builds their z_t): one for a fixed control, one per
    draw (`PERMUTATIONS`) for a randomised one."""
    c = walk_rate(r.walk)
    valid = [[v is not None for v in calls] for calls in r.walk]
    walk_sem = semantics(walk_scores(r.walk), lam, empty)
    calls = [len(v) for v in r.walk]
    every = [z for calls_z in walk_scores(r.walk) for z in calls_z]
    rate = float(np.mean(every)) if every else 0.0
    rng = np.random.default_rng([seed, 1])
    return {
        "C_zoom": [semantics(gs.zoom_constant_scores(valid, r.zoom, c), lam, empty)],
        "C_valid": [semantics(gs.valid_constant_scores(valid, c), lam, empty)],
        "C_all": [gs.permuted_within_groups(walk_sem, group, rng) for _ in range(PERMUTATIONS)],
        "C_noise": [semantics(gs.noise_scores(calls, rate, rng), lam, empty) for _ in range(PERMUTATIONS)],
    }


def quality_semantics(r: Rollouts, quality: float, lam: float, empty: float, seed: int) -> list[np.ndarray]:
    """R_sem under a walk verifier of quality `quality` among valid zoom calls (`gs.garbled_scores`), one column per
    draw; the draws are shared by every quality (common random numbers)."""
    if quality >= 1.0:
        return [semantics(walk_scores(r.walk), lam, empty)]
    return [
        semantics(gs.garbled_scores(r.walk, r.zoom, quality, np.random.default_rng([seed, 2, d])), lam, empty)
        for d in range(PERMUTATIONS)
    ]


def world_arms(
    r: Rollouts,
    d: Directions,
    recipe: dict,
    group: int,
    scalings: Sequence[str],
    seed: int,
    qualities: Sequence[float] = QUALITIES,
) -> dict:
    """The arms every measurement gets, from the recorded columns, per scaling: GRPO, the walk arm, its controls, and
    the walk verifier at each of `qualities` (`quality_semantics`)."""
    lam, empty, beta = recipe["semantic_lambda"], recipe["no_tool_semantic"], recipe["semantic_beta"]
    steps_of = r.step_rollout
    reader = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P))
    walk_sem = semantics(walk_scores(r.walk), lam, empty)
    controls = control_semantics(r, lam, empty, group, seed)
    sweep = {q: quality_semantics(r, q, lam, empty, seed) for q in qualities if q < 1.0}
    arms = {}
    for scaling in scalings:

        def mean_arm(columns, scaling=scaling):
            return d.mean_arm([episode_advantages(reader, sem, group, beta, scaling)[steps_of] for sem in columns])

        arms[(REFERENCE, scaling)] = d.arm(
            episode_advantages(reader, np.zeros_like(reader), group, 0.0, scaling)[steps_of]
        )
        arms[(WALK, scaling)] = d.arm(episode_advantages(reader, walk_sem, group, beta, scaling)[steps_of])
        for name, columns in controls.items():
            arms[(name, scaling)] = mean_arm(columns)
        for q in qualities:
            arms[(quality_arm(q), scaling)] = mean_arm(sweep[q]) if q < 1.0 else arms[(WALK, scaling)]
    return arms


def quality_arm(q: float) -> str:
    """The name of the walk verifier at quality `q` among the arms."""
    return f"walk_q{q:.2f}"


Q0 = quality_arm(QUALITIES[0])  # the walk verifier's verdicts drawn at random at their own rate: its density alone


def check_replays(m: dict) -> None:
    """The recorded columns and `reference_advantages` against what the replayed trainers computed."""
    r, replays, group = m["rollouts"], m["replays"], m["group"]
    recipe, scaling = m["recipe"], m["recipe_scaling"]
    check_close(
        "Q* from the recorded calls against the oracle trainer's reward",
        replays[("oracle", scaling)].outcome,
        r.q_star,
    )
    check_close(
        "the 0.7 reader recomputed against the trainer's",
        reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P),
        replays[(REFERENCE, scaling)].outcome,
    )
    for (name, scale), rep in replays.items():  # reference_advantages is what the controls and the sweep use
        if "hpo" in name:
            continue
        ep = episode_advantages(rep.outcome, rep.semantic, group, rep.semantic_weight, scale)
        check_close(
            f"reference_advantages against the {name} trainer (scale_rewards {scale})",
            ep[r.step_rollout],
            rep.advantages,
        )
    walk_sem = semantics(walk_scores(r.walk), recipe["semantic_lambda"], recipe["no_tool_semantic"])
    check_close(
        "R_sem of the recorded walk verdicts against the walk trainer's", walk_sem, replays[(WALK, scaling)].semantic
    )


def folds_of(prompts: int, folds: int) -> np.ndarray:
    """Each prompt's fold: `folds` consecutive blocks."""
    return np.arange(prompts) * folds // prompts


def primary_run(m: dict, folds: int) -> Run:
    """A measurement at the primary checkpoint, with replays, as a `Run`: every arm at both scalings (the recorded
    columns' arms, every replayed trainer's, REINFORCE, the quality sweep), after `check_replays`."""
    check_replays(m)
    r, group, scaling = m["rollouts"], m["group"], m["recipe_scaling"]
    d = Directions(r, group)
    arms = world_arms(r, d, m["recipe"], group, tuple(dict.fromkeys((scaling, "none"))), m["seed"])
    arms |= {key: d.arm(rep.advantages) for key, rep in m["replays"].items()}
    reader = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P))
    arms[(REINFORCE, "none")] = d.arm(reader[r.step_rollout])
    return Run(arms, d, folds_of(d.prompts, folds))
