"""`make experiment`: MAPO's gradient claims (Walk the Talk, section 4) measured on the trainer's own code, at fixed
policies, on CPU.

RL on 2 cores cannot move the tiny policy (research/reports/experiment_curves.md), but section 4 argues about the
policy-gradient estimate at a fixed policy, not about training curves, and that can be measured here:

1. **Fixed policies where the question has an answer**: SFT checkpoints of the experiment's world (region hint, 768 px
   squares, the simulated reader of `research.rewards`), each round of the tiny SFT recipe from the last, built once
   and cached (`--start`); the first of `--checkpoints` is the primary one, whose sampled rate of framing the target
   (Q*, `target_in_view_reward`) must lie in `CHECKPOINT_RATE`.
2. **Rollouts and score vectors, once per checkpoint and seed** (`collect`): groups of G through the trainer's own
   rollout path (`MAPOTrainer._generate_and_score_completions`: TRL's tool loop, the real zoom-in tool), and for
   every step (assistant turn) the gradient of the trainer's loss term without its advantage
   (`utils.diagnostics.policy_gradient_loss`: the loss's own token mask and per-sequence normalisation). Only their
   Gram matrix is kept.
3. **Every estimator's advantages from the code that trains** (`replay`, primary checkpoint): a `MAPOTrainer` built
   as `rl.py` builds it replays the recorded rollouts; its rewards, R_sem, z_t, TRL's advantages and HPO's are its
   own. The controls and the quality sweep recombine recorded columns with `mapo.reference_advantages`, which this run
   first checks equal to every replayed MAPO trainer's advantages.
4. **Statistics** (`research.gradient_stats`): the reference directions are the gradients of E[Q*] and of E[V] (V: a
   well-formed rollout with a valid call) from unnormalised sequence scores with a leave-one-out baseline, and the
   framing direction (grad Q* with grad E[V] projected out); each estimator's batch gradient keeps the trainer's loss
   terms; the primary metric is the expected gain of one normalised SGD step; a stratified bootstrap over prompts of
   the whole pipeline gives standard errors; verdicts are stated before the numbers.

    make experiment                                   # checkpoints (cached), rollouts, replays, report
    make experiment ARGS="--reuse"                    # the report again from the cached measurements
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import set_seed

import rl
from data.benchmarks import load_saved_split
from evaluation.verifier_check import check_verifier
from hpo.steps import turn_index
from mapo import reference_advantages, scale_similarity, semantic_reward
from mapo_trainer import MAPOTrainer
from research import gradient_stats as gs
from research.report import markdown_table, verdict_sections
from research.rewards import READER_HIT_P, READER_MISS_P, is_zoom, reader_draw, reader_outcome, target_seen
from research.verifiers import WalkVerifier
from rewards.outcome import format_reward
from rewards.verifiers import Scene, build_verifier
from tiny import stages
from tools import ToolConfig, make_environment_factory
from utils.diagnostics import completion_logps, policy_gradient_loss, rollout_rows, trained_token_mask
from utils.models import load_processor, pixel_budget

RECIPE = "research/recipes/config_experiment.yaml"
REPORT = Path("research/reports/experiment.md")
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
# The controls of the walk arm (`research.gradient_stats`), from the walk arm towards GRPO, each removing one thing:
# C_zoom keeps a constant bonus on valid zoom calls (no word on which framed the target), C_valid on every valid call,
# C_all permutes R_sem among a group's rollouts (no word on which rollout called), C_noise draws z at the walk rate.
CONTROLS = ("C_zoom", "C_valid", "C_all", "C_noise")
CHAIN = (WALK, "C_zoom", "C_valid", "C_all", REFERENCE)
PERMUTATIONS = 100  # draws a randomised control (C_all, C_noise, the quality sweep below 1) is averaged over
QUALITIES = (0.0, 0.25, 0.5, 0.75, 1.0)
DIRECTIONS = ("q", "framing")  # grad Q*, and grad Q* with grad E[V] projected out
# Proposition 1's world of mixed difficulty: the same rollouts, read by a reader that answers the even-numbered
# prompts right with EASY_P whatever the policy looked at (the answer is legible without zooming) and the others
# as the recipe's reader does.
EASY_P = 0.9
RHO_MIN = 0.3  # Proposition 1's verdict needs this intra-group correlation: at rho near 0, (1 - rho) predicts 1
CHECKPOINT_RATE = (
    0.10,
    0.90,
)  # the primary checkpoint's sampled Q* rate must lie here for the question to have an answer
REPLAY_TOLERANCE = 1e-5  # reference_advantages against a replayed trainer's advantages (float32)
# The first version of this measurement (2026-12-02, results 0ea6b987bf75, 256 prompts): the walk arm's gain over its
# shuffled control in batch cosine and that difference's bootstrap SE, the power calculation's input.
FIRST_VERSION = {"prompts": 256, "walk_minus_control": 0.0035, "se": 0.0101}


# ------------------------------------------------------------------------------------------------- the trainers
class RecordingTrainer(MAPOTrainer):
    """`MAPOTrainer` that keeps, per generation batch, what `_generate` returned and the calls each rollout's
    environment recorded: what `ReplayTrainer` needs to replay the batch."""

    recorded: tuple | None = None

    def _generate(self, prompts):
        generated = super()._generate(prompts)
        self.recorded = (generated, [list(env.calls) for env in self.environments])
        return generated


class ReplayTrainer(MAPOTrainer):
    """`MAPOTrainer` whose generation returns a recorded batch (`replay`, from `RecordingTrainer`) and restores the
    calls its environments recorded; rewards, R_sem, TRL's advantages and HPO's are the trainer's own. Keeps the
    reward columns of the last batch (`rewards`) and its verifier's scores (`scored`, for `z_values`)."""

    replay: tuple | None = None
    rewards: torch.Tensor | None = None
    scored: list[torch.Tensor] = []

    def _generate(self, prompts):
        generated, calls = self.replay
        for env, recorded in zip(self.environments, calls, strict=True):
            env.calls = list(recorded)
        return generated

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self.scored = []
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.rewards = rewards.detach().clone()
        return rewards

    def _score(self, calls, scenes):
        scores = super()._score(calls, scenes)
        self.scored.append(scores.detach().clone())
        return scores

    def z_values(self) -> list[float]:
        """The last batch's z_t of every valid call, as `_semantic_reward` scaled them (NaN: unscorable)."""
        if not self.scored:
            return []
        cosine, whole = self.scored[0], self.scored[1] if len(self.scored) > 1 else None
        if whole is not None:
            cosine = torch.where(torch.isnan(whole), torch.nan, cosine)
        z = scale_similarity(cosine, self.args.semantic_score, whole)
        return z.tolist()


def parse_run(start: Path, checkpoint: Path, kit: dict, name: str, **fields) -> tuple:
    """The recipe's parsed arguments from `checkpoint`, as `rl.py` parses them, with `fields` on top."""
    argv = stages.rl_argv(
        checkpoint,
        start / "data",
        start / "clip",
        start / "trainers" / name,
        1,
        recipe=RECIPE,
        hpo_text_encoder=kit["text_encoder"],
        **fields,
    )
    return stages.rl_args(argv)


def build(
    start: Path, checkpoint: Path, kit: dict, name: str, trainer_cls: type[MAPOTrainer], **fields
) -> MAPOTrainer:
    """`rl.build_trainer` on the recipe with `fields`, its model in training mode (what `train` would set)."""
    trainer = rl.build_trainer(*parse_run(start, checkpoint, kit, name, **fields), trainer_cls=trainer_cls)
    trainer.model.train()
    return trainer


# ------------------------------------------------------------------------------------------------- collection
@dataclass
class Rollouts:
    """What the recorded rollouts give every estimator: per step, its rollout; per rollout, its prompt, trained tokens,
    format, whether a call framed the target, the reader's draw, every call's walk verdict (None: failed call) and
    whether each call's box is a zoom (`research.rewards.is_zoom`; False for a failed call); and the Gram matrix of
    the step score vectors."""

    step_rollout: np.ndarray
    rollout_prompt: np.ndarray
    tokens: np.ndarray
    well_formed: np.ndarray
    seen: np.ndarray
    draws: np.ndarray
    walk: list[list[float | None]]
    zoom: list[list[bool]]
    gram: np.ndarray

    @property
    def step_prompt(self) -> np.ndarray:
        return self.rollout_prompt[self.step_rollout]

    @property
    def q_star(self) -> np.ndarray:
        """Q*: well formed, and a valid call framed the target."""
        return self.well_formed * self.seen

    @property
    def valid_call(self) -> np.ndarray:
        """V: well formed, with a valid call."""
        return self.well_formed * np.array([any(v is not None for v in calls) for calls in self.walk], dtype=float)

    def rollout_gram(self) -> np.ndarray:
        """<S_i, S_k> of the rollouts' whole score vectors (sums of their steps')."""
        e = np.zeros((len(self.rollout_prompt), len(self.step_rollout)))
        e[self.step_rollout, np.arange(len(self.step_rollout))] = 1.0
        return e @ self.gram @ e.T


def batch_inputs(dataset, prompts: Sequence[int], group: int) -> list[dict]:
    """One generation batch: each prompt's row `group` times, consecutively (TRL's sampler's order); the copies share
    the row's decoded image (thousands of rollouts are kept for the replays)."""
    rows = [dataset[i] for i in prompts]
    return [dict(row) for row in rows for _ in range(group)]


def step_vectors(trainer: MAPOTrainer, out: dict) -> tuple[list[torch.Tensor], list[int], torch.Tensor]:
    """Per rollout of `out`, the score vector of each of its steps (assistant turns: `hpo.steps.turn_index`): the
    gradient of `policy_gradient_loss` with 1 on the step's tokens as the advantage; and each rollout's step count and
    trained-token count."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    vectors, counts, tokens = [], [], []
    for row in rollout_rows(out):
        mask = trained_token_mask(row)
        turns = turn_index(row["completion_mask"], row.get("tool_mask"))
        steps = max(int(turns.max()), 0) if turns.numel() else 0
        logps = completion_logps(trainer, row)
        for k in range(1, steps + 1):
            loss = policy_gradient_loss(logps, (turns == k).to(logps.dtype), mask)
            grads = torch.autograd.grad(loss, params, retain_graph=k < steps, allow_unused=True)
            vectors.append(
                torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)])
            )
        counts.append(steps)
        tokens.append(float(mask.sum()))
    return vectors, counts, torch.tensor(tokens)


def gram_matrix(vectors: list[torch.Tensor], chunk: int = 16384) -> np.ndarray:
    """K = S S^T in float64, S the stacked score vectors: float32 products accumulated chunk by chunk of
    parameters in float64, each chunk stacked on its own (the whole of S would double the vectors' memory)."""
    gram = torch.zeros(len(vectors), len(vectors), dtype=torch.float64)
    for start in range(0, vectors[0].numel(), chunk):
        block = torch.stack([v[start : start + chunk] for v in vectors])
        gram += (block @ block.T).double()
    return gram.numpy()


def collect(trainer: RecordingTrainer, prompts: Sequence[int], batch_prompts: int, seed: int, log=print):
    """Draw the rollouts through `trainer`'s own path, batch by batch (each seeded by (`seed`, batch)), and keep
    what every estimator needs: the recorded batches (for `replay`), and `Rollouts`."""
    group = trainer.num_generations
    dataset = trainer.train_dataset
    batches, vectors, step_rollout, rollout_prompt, tokens = [], [], [], [], []
    well_formed, seen, draws, walk, zoom = [], [], [], [], []
    verdicts = WalkVerifier()
    started = time.time()
    for b, chunk in enumerate(gs.batches_of(list(prompts), batch_prompts)):
        inputs = batch_inputs(dataset, chunk, group)
        set_seed(seed * 1_000_003 + b)
        out = trainer._generate_and_score_completions(inputs)
        generated, calls = trainer.recorded
        batches.append({"inputs": inputs, "replay": (generated, calls), "turns": turns_of(out)})
        completions = generated[3]
        more, counts, row_tokens = step_vectors(trainer, out)
        first = len(rollout_prompt)
        for i, steps in enumerate(counts):
            step_rollout += [first + i] * steps
        vectors += more
        rollout_prompt += [p for p in chunk for _ in range(group)]
        tokens += row_tokens.tolist()
        environments = trainer.environments
        well_formed += format_reward(completions)
        seen += target_seen(completions, environments, [x["target_bbox"] for x in inputs])
        draws += [reader_draw(x["id"], 0, i) for i, x in enumerate(inputs)]
        for x, env in zip(inputs, environments):
            ok = [c for c in env.calls if c.ok]
            scores = iter(verdicts.score(ok, [Scene(env.image, x["target_bbox"], None)] * len(ok)).tolist())
            walk.append([next(scores) if c.ok else None for c in env.calls])
            zoom.append([c.ok and is_zoom(c.box, env.image.size) for c in env.calls])
        if b % 8 == 0:
            log(
                f"  batch {b + 1}: {len(rollout_prompt)} rollouts, {len(vectors)} steps, {time.time() - started:.0f} s"
            )
    rollouts = Rollouts(
        np.asarray(step_rollout),
        np.asarray(rollout_prompt),
        np.asarray(tokens),
        np.asarray(well_formed, dtype=np.float64),
        np.asarray(seen, dtype=bool),
        np.asarray(draws),
        walk,
        zoom,
        gram_matrix(vectors),
    )
    return batches, rollouts


def turns_of(out: dict) -> torch.Tensor:
    """(B, T) step of every completion token of a batch (`hpo.steps.turn_index`), -1 off the trained tokens."""
    return turn_index(out["completion_mask"], out.get("tool_mask"))


def step_advantages(advantages: torch.Tensor, turns: torch.Tensor) -> list[float]:
    """Each step's advantage, rollout by rollout: the episode advantage for every step, or (per-token advantages)
    the value on the step's tokens, which must be one value (HPO's are per step)."""
    values = []
    for i in range(turns.shape[0]):
        for k in range(1, max(int(turns[i].max()), 0) + 1):
            if advantages.dim() == 1:
                values.append(float(advantages[i]))
                continue
            on_step = advantages[i][turns[i] == k]
            if float(on_step.max() - on_step.min()) > 1e-6 * (1 + float(on_step.abs().max())):
                raise ValueError(f"rollout {i}: per-token advantages vary within step {k}; a step needs one value")
            values.append(float(on_step[0]))
    return values


@dataclass
class Replayed:
    """One estimator's replay: per step its advantage; per rollout the outcome (the weighted outcome columns) and
    R_sem (the last column); the z_t of every valid call."""

    advantages: np.ndarray
    outcome: np.ndarray
    semantic: np.ndarray
    scale_rewards: str
    semantic_weight: float
    z: np.ndarray = field(default_factory=lambda: np.zeros(0))


def replay(trainer: ReplayTrainer, batches: list[dict]) -> Replayed:
    """Every recorded batch through `trainer`'s `_generate_and_score_completions`."""
    advantages, outcome, semantic, z = [], [], [], []
    weights = trainer.reward_weights
    for batch in batches:
        trainer.replay = batch["replay"]
        out = trainer._generate_and_score_completions(batch["inputs"])
        advantages += step_advantages(out["advantages"], batch["turns"])
        rewards = trainer.rewards
        outcome += (rewards[:, :-1] * weights[:-1]).nansum(dim=1).tolist()
        semantic += rewards[:, -1].tolist()
        z += trainer.z_values()
    return Replayed(
        np.asarray(advantages),
        np.asarray(outcome),
        np.asarray(semantic),
        trainer.scale_rewards,
        float(weights[-1]),
        np.asarray(z),
    )


def measure(
    args: argparse.Namespace,
    start: Path,
    checkpoint: Path,
    rollouts: int,
    seed: int,
    replays: bool = True,
    log=print,
    recording_cls: type[RecordingTrainer] = RecordingTrainer,
) -> tuple[dict, list[dict]]:
    """`rollouts` rollouts at `checkpoint` (seeded by `seed`), their Gram matrix and, with `replays`, every
    estimator's replay; and the recorded batches. `recording_cls` draws the rollouts (a test scripts its calls)."""
    kit = stages.tiny_kit()
    recorder = build(start, checkpoint, kit, "recording", recording_cls, **ESTIMATORS[REFERENCE])
    group = recorder.num_generations
    batch_prompts = recorder.args.per_device_train_batch_size // group
    prompts = rollouts // group
    if prompts > len(recorder.train_dataset):
        raise ValueError(f"--rollouts {rollouts}: the train split has {len(recorder.train_dataset)} prompts")
    recipe_scaling = recorder.scale_rewards
    parameters = sum(p.numel() for p in recorder.model.parameters() if p.requires_grad)  # the score vectors' size
    timings = {}
    t = time.time()
    log(f"{checkpoint.name}, seed {seed}: {rollouts} rollouts in groups of {group}, {batch_prompts} prompts a batch")
    batches, recorded = collect(recorder, range(prompts), batch_prompts, seed, log)
    timings["rollouts and score vectors"] = time.time() - t
    del recorder
    replayed = {}
    t = time.time()
    for name, fields in ESTIMATORS.items() if replays else ():
        for scaling in dict.fromkeys((recipe_scaling, "none")):
            trainer = build(
                start, checkpoint, kit, f"{name}-{scaling}", ReplayTrainer, scale_rewards=scaling, **fields
            )
            replayed[(name, scaling)] = replay(trainer, batches)
            log(f"  replayed {name} (scale_rewards {scaling}): {time.time() - t:.0f} s")
            del trainer
    if replays:
        timings["replays"] = time.time() - t
    measurement = {
        "checkpoint": checkpoint.name,
        "seed": seed,
        "rollouts": recorded,
        "replays": replayed,
        "group": group,
        "batch_prompts": batch_prompts,
        "recipe_scaling": recipe_scaling,
        "parameters": parameters,
        "recipe": {k: v for part in parse_run(start, checkpoint, kit, "recipe") for k, v in vars(part).items()},
        "timings": timings,
    }
    return measurement, batches


# ------------------------------------------------------------------------------------------------- analysis
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


@dataclass
class ArmProducts:
    """One arm's prompt-level products: with itself, with grad Q*'s and with grad E[V]'s contributions."""

    own: np.ndarray
    q: np.ndarray
    v: np.ndarray
    randomised: bool = False


class Directions:
    """The reference directions of one measurement: per step, the coefficients of grad E[Q*] and grad E[V] on the
    recorded score vectors, and every product an arm needs with them.

    The score vectors are the trainer's loss terms, divided by the rollout's trained-token count |tau|, whose mean
    under the policy is the gradient of E[1 / |tau|], not 0. The references multiply them back by |tau| (unnormalised
    sequence scores, mean 0), with a leave-one-out baseline, so they are unbiased for the gradients of E[Q*] and E[V];
    the arms keep the trainer's own terms."""

    def __init__(self, r: Rollouts, group: int):
        self.group, self.prompts = group, len(r.rollout_prompt) // group
        self.step_rollout, self.step_prompt = r.step_rollout, r.step_prompt
        self.gram = r.gram
        self.rollout_gram = r.rollout_gram()
        coef = {d: gs.loo_advantages(values, group) * r.tokens for d, values in (("q", r.q_star), ("v", r.valid_call))}
        self.qq = self._rollout_products(coef["q"], coef["q"])
        self.qv = self._rollout_products(coef["q"], coef["v"])
        self.vv = self._rollout_products(coef["v"], coef["v"])
        self.rollout_coef = coef

    def _rollout_products(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """H_ab for coefficients constant over each rollout's steps (`a`, `b`: one per rollout)."""
        p, g = self.prompts, self.group
        return (a[:, None] * self.rollout_gram * b[None, :]).reshape(p, g, p, g).sum(axis=(1, 3))

    def arm(self, coefficients: np.ndarray) -> ArmProducts:
        """The products of the batch gradients with per-step `coefficients` (advantages); through the rollouts' Gram
        matrix when they are one value per rollout (an episode advantage), else through the steps'."""
        a = np.asarray(coefficients, dtype=np.float64)
        per_rollout = np.zeros(len(self.rollout_gram))
        per_rollout[self.step_rollout] = a
        if np.array_equal(per_rollout[self.step_rollout], a):
            return ArmProducts(*(self._rollout_products(per_rollout, b) for b in
                                 (per_rollout, self.rollout_coef["q"], self.rollout_coef["v"])))  # fmt: skip
        q, v = (self.rollout_coef[d][self.step_rollout] for d in ("q", "v"))
        return ArmProducts(*(gs.prompt_products(self.gram, self.step_prompt, a, b, self.prompts) for b in (a, q, v)))

    def mean_arm(self, draws: Sequence[np.ndarray]) -> ArmProducts:
        """A randomised arm's products averaged over its draws (`gs.Arm` says why that is exact)."""
        arms = [self.arm(a) for a in draws]
        if len(arms) == 1:
            return arms[0]
        mean = ArmProducts(*(np.mean([getattr(x, f) for x in arms], axis=0) for f in ("own", "q", "v")))
        mean.randomised = True
        return mean


FIGURES = ("gain", "with_gradient", "cosine_given_gradient", "cosine", "noise_over_signal")


def evaluate(arms: dict, d: Directions, draw: gs.Draw, bp: int, group: int) -> dict:
    """Every arm's `gs.figures` on one draw, against grad Q* and against the framing direction."""
    weights = gs.DrawWeights(draw, d.prompts, bp, group)
    c = gs.projection_coefficient(d.qv, d.vv, weights)
    framing = gs.framing_products(d.qq, d.qv, d.vv, c)
    out = {"projection": c}
    for key, arm in arms.items():
        out[key] = {
            "q": gs.figures(gs.Arm(arm.own, arm.q), d.qq, weights),
            "framing": gs.figures(gs.Arm(arm.own, arm.q - c * arm.v), framing, weights),
        }
    return out


@dataclass
class Measured:
    """An arm set's figures on the sample (`point`) and on every bootstrap replicate (`replicates`, arrays)."""

    point: dict
    replicates: dict

    def value(self, key, direction: str = "q", figure: str = "gain") -> float:
        return self.point[key][direction][figure]

    def se(self, key, direction: str = "q", figure: str = "gain") -> float:
        return float(np.nanstd(self.replicates[key][direction][figure], ddof=1))

    def undefined(self) -> int:
        """Replicates whose reference had no measurable norm (|grad J|^2 <= 0), left out of every SE."""
        first = next(iter(self.replicates.values()))
        return max(int(np.isnan(first[x]["gain"]).sum()) for x in DIRECTIONS)

    def diff(self, a, b, direction: str = "q", figure: str = "gain") -> gs.Difference:
        """a minus b, paired over replicates."""
        return gs.paired_difference(
            self.value(a, direction, figure),
            self.value(b, direction, figure),
            self.replicates[a][direction][figure],
            self.replicates[b][direction][figure],
        )


def measure_arms(arms: dict, d: Directions, fold_of: np.ndarray, bp: int, group: int, bootstrap: int, seed: int):
    """`evaluate` on the sample and on `bootstrap` stratified replicates over prompts (`gs.Draw.of`)."""
    point = evaluate(arms, d, gs.Draw.of(fold_of), bp, group)
    rng = np.random.default_rng(seed)
    replicates = {key: {x: {f: [] for f in FIGURES} for x in DIRECTIONS} for key in arms}
    for _ in range(bootstrap):
        figs = evaluate(arms, d, gs.Draw.of(fold_of, rng), bp, group)
        for key in arms:
            for x in DIRECTIONS:
                for f in FIGURES:
                    replicates[key][x][f].append(figs[key][x][f])
    replicates = {
        k: {x: {f: np.asarray(v) for f, v in fs.items()} for x, fs in xs.items()} for k, xs in replicates.items()
    }
    return Measured(point, replicates)


def world_arms(r: Rollouts, d: Directions, recipe: dict, group: int, scalings: Sequence[str], seed: int) -> dict:
    """The arms every measurement gets, from the recorded columns: GRPO, the walk arm and its controls, per scaling."""
    lam, empty, beta = recipe["semantic_lambda"], recipe["no_tool_semantic"], recipe["semantic_beta"]
    steps_of = r.step_rollout
    reader = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P))
    walk_sem = semantics(walk_scores(r.walk), lam, empty)
    controls = control_semantics(r, lam, empty, group, seed)
    arms = {}
    for scaling in scalings:
        arms[(REFERENCE, scaling)] = d.arm(
            episode_advantages(reader, np.zeros_like(reader), group, 0.0, scaling)[steps_of]
        )
        arms[(WALK, scaling)] = d.arm(episode_advantages(reader, walk_sem, group, beta, scaling)[steps_of])
        for name, columns in controls.items():
            arms[(name, scaling)] = d.mean_arm(
                [episode_advantages(reader, sem, group, beta, scaling)[steps_of] for sem in columns]
            )
    return arms


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


def proposition_1(r: Rollouts, group: int, bp: int, fold_of: np.ndarray, bootstrap: int, seed: int) -> dict:
    """Proposition 1 in the recipe's world and in the world of mixed difficulty (`EASY_P`): the variance trace of the
    group baseline (A = r - r-bar) over REINFORCE's (A = r), each split into per-rollout and cross-rollout parts."""
    gram = r.rollout_gram()
    reader = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P))
    easy = r.rollout_prompt % 2 == 0
    mixed = np.where(easy, r.well_formed * (r.draws < EASY_P), reader)
    out = {}
    for world, outcome in (("recipe", reader), ("mixed", mixed)):
        parts = {
            arm: gs.rollout_split(coef, gram, group)
            for arm, coef in (("grpo", gs.group_advantages(outcome, group)), (REINFORCE, outcome))
        }

        def split(draw, parts=parts):
            return {arm: gs.trace_split(own, self_part, draw, bp, group) for arm, (own, self_part) in parts.items()}

        point = split(gs.Draw.of(fold_of))
        rng = np.random.default_rng([seed, 3])
        reps = [split(gs.Draw.of(fold_of, rng)) for _ in range(bootstrap)]

        def ratio(figs, i):
            return figs["grpo"][i] / figs[REINFORCE][i] if figs[REINFORCE][i] else math.nan

        entry = {"moments": vars(gs.reward_moments(outcome, group))}
        entry["moments"]["predicted_ratio"] = gs.reward_moments(outcome, group).predicted_ratio
        for i, part in enumerate(("trace", "per_rollout", "cross")):
            entry[part] = {arm: point[arm][i] for arm in parts}
            entry[f"{part}_ratio"] = ratio(point, i)
            entry[f"{part}_ratio_se"] = float(np.std([ratio(x, i) for x in reps], ddof=1))
        entry["verdict"] = gs.better_verdict(gs.Difference(1.0 - entry["trace_ratio"], entry["trace_ratio_se"]))
        if not entry["moments"]["rho"] >= RHO_MIN:  # the (1 - rho) factor cannot show
            entry["verdict"] = gs.INCONCLUSIVE
        out[world] = entry
    return out


def analyse(m: dict, folds: int, bootstrap: int, seed: int, log=print) -> dict:
    """Every table and verdict of the report from the primary measurement (`measure` with replays)."""
    check_replays(m)
    r, replays, group, bp = m["rollouts"], m["replays"], m["group"], m["batch_prompts"]
    recipe, scaling = m["recipe"], m["recipe_scaling"]
    scalings = tuple(dict.fromkeys((scaling, "none")))
    lam, empty, beta = recipe["semantic_lambda"], recipe["no_tool_semantic"], recipe["semantic_beta"]
    t = time.time()
    d = Directions(r, group)
    arms = world_arms(r, d, recipe, group, scalings, seed)
    arms |= {key: d.arm(rep.advantages) for key, rep in replays.items()}
    reader = replays[(REFERENCE, scaling)].outcome
    arms[(REINFORCE, "none")] = d.arm(reader[r.step_rollout])
    for q in QUALITIES[:-1]:
        columns = quality_semantics(r, q, lam, empty, seed)
        for s in scalings:
            arms[(f"walk_q{q:.2f}", s)] = d.mean_arm(
                [episode_advantages(reader, sem, group, beta, s)[r.step_rollout] for sem in columns]
            )
    for s in scalings:
        arms[(f"walk_q{QUALITIES[-1]:.2f}", s)] = arms[(WALK, s)]
    log(f"  products of {len(arms)} arms: {time.time() - t:.0f} s")
    fold_of = np.arange(d.prompts) * folds // d.prompts
    t = time.time()
    measured = measure_arms(arms, d, fold_of, bp, group, bootstrap, seed)
    log(f"  bootstrap: {time.time() - t:.0f} s")

    def entry(key) -> dict:
        out = {x: dict(measured.point[key][x]) for x in DIRECTIONS}
        for x in DIRECTIONS:
            out[x]["gain_se"] = measured.se(key, x)
            out[x]["noise_over_signal_se"] = measured.se(key, x, "noise_over_signal")
            if key[0] != REFERENCE and (REFERENCE, key[1]) in arms:
                out[x]["minus_grpo"] = vars(measured.diff(key, (REFERENCE, key[1]), x))
        out["randomised"] = arms[key].randomised
        return out

    table = {f"{name}|{s}": entry((name, s)) for name, s in arms if not name.startswith("walk_q")}
    chain = {
        f"{a} - {b}": {x: vars(measured.diff((a, scaling), (b, scaling), x)) for x in DIRECTIONS}
        for a, b in zip(CHAIN, CHAIN[1:])
    }
    walk_zoom = measured.diff((WALK, scaling), ("C_zoom", scaling))
    walk_grpo = measured.diff((WALK, scaling), (REFERENCE, scaling))
    noise_gap = measured.diff((REFERENCE, scaling), (WALK, scaling), "q", "noise_over_signal")
    rate = float(r.q_star.mean())
    prop2 = {
        "a": {
            "walk_minus_zoom": vars(walk_zoom),
            "walk_minus_grpo": vars(walk_grpo),
            "verdict": gs.prop2a_verdict(walk_zoom, walk_grpo),
            "detectable": gs.detectable(walk_zoom.se),
        },
        "b": {"grpo_minus_walk": vars(noise_gap), "verdict": gs.better_verdict(noise_gap)},
    }
    if not CHECKPOINT_RATE[0] <= rate <= CHECKPOINT_RATE[1]:
        prop2["a"]["verdict"] = prop2["b"]["verdict"] = gs.INCONCLUSIVE
    quality = {}
    for s in scalings:
        rows = {}
        for q in QUALITIES:
            key = (f"walk_q{q:.2f}", s)
            rows[f"{q:.2f}"] = {"gain": measured.value(key), "gain_se": measured.se(key)}
            rows[f"{q:.2f}"]["minus_grpo"] = vars(measured.diff(key, (REFERENCE, s)))
        quality[s] = {
            "rows": rows,
            "one_minus_zero": vars(measured.diff((f"walk_q{QUALITIES[-1]:.2f}", s), (f"walk_q{QUALITIES[0]:.2f}", s))),
            "break_even": gs.break_even(QUALITIES, [rows[f"{q:.2f}"]["minus_grpo"]["value"] for q in QUALITIES]),
        }
    clip = {}
    for name in CLIP_ARMS:
        z = replays[(name, scaling)].z
        z = z[~np.isnan(z)]
        clip[name] = {
            "z_valid": float(z.mean()) if z.size else math.nan,
            "z_minus_no_tool": float(z.mean()) - empty if z.size else math.nan,
            "minus_grpo": vars(measured.diff((name, scaling), (REFERENCE, scaling))),
            "gain": measured.value((name, scaling)),
            "gain_se": measured.se((name, scaling)),
        }
        if name.endswith("_centred"):
            plain = name.removesuffix("_centred")
            clip[name]["minus_plain"] = vars(measured.diff((name, scaling), (plain, scaling)))
    zoom_calls = [z for calls, zs in zip(r.walk, r.zoom) for v, z in zip(calls, zs) if v is not None]
    return {
        "checkpoint": m["checkpoint"],
        "seed": m["seed"],
        "rate": rate,
        "valid_rate": float(r.valid_call.mean()),
        "walk_rate": walk_rate(r.walk),
        "zoom_share": float(np.mean(zoom_calls)) if zoom_calls else math.nan,
        "projection": measured.point["projection"],
        "undefined_replicates": measured.undefined(),
        "rollouts": len(r.rollout_prompt),
        "steps": len(r.step_rollout),
        "prompts": d.prompts,
        "folds": folds,
        "bootstrap": bootstrap,
        "group": group,
        "batch_prompts": bp,
        "scaling": scaling,
        "table": table,
        "chain": chain,
        "prop1": proposition_1(r, group, bp, fold_of, bootstrap, seed),
        "prop2": prop2,
        "quality": quality,
        "clip": clip,
        "power": {
            "first_version": FIRST_VERSION,
            "prompts_needed": gs.prompts_needed(
                FIRST_VERSION["se"], FIRST_VERSION["prompts"], FIRST_VERSION["walk_minus_control"]
            ),
            "detectable_first": gs.detectable(FIRST_VERSION["se"]),
        },
    }


def analyse_replication(m: dict, folds: int, bootstrap: int, seed: int) -> dict:
    """The walk arm against `C_zoom` and GRPO on a measurement without replays (another checkpoint or seed)."""
    r, group, bp, scaling = m["rollouts"], m["group"], m["batch_prompts"], m["recipe_scaling"]
    d = Directions(r, group)
    arms = world_arms(r, d, m["recipe"], group, (scaling,), seed)
    fold_of = np.arange(d.prompts) * folds // d.prompts
    measured = measure_arms(arms, d, fold_of, bp, group, bootstrap, seed)
    walk_zoom = measured.diff((WALK, scaling), ("C_zoom", scaling))
    walk_grpo = measured.diff((WALK, scaling), (REFERENCE, scaling))
    return {
        "checkpoint": m["checkpoint"],
        "seed": m["seed"],
        "rollouts": len(r.rollout_prompt),
        "rate": float(r.q_star.mean()),
        "valid_rate": float(r.valid_call.mean()),
        "gain": {name: measured.value((name, scaling)) for name in (REFERENCE, WALK, *CONTROLS)},
        "walk_minus_zoom": vars(walk_zoom),
        "walk_minus_grpo": vars(walk_grpo),
        "verdict": gs.prop2a_verdict(walk_zoom, walk_grpo),
    }


# ------------------------------------------------------------------------------------------------- report
CRITERIA = f"""Stated before the numbers, in the code that judges them (`research.gradient_stats`). Every figure is
measured on the same rollouts for every arm, so differences are paired; standard errors (SE) come from a stratified
bootstrap over prompts of the whole pipeline (the references included); a difference counts when it exceeds
{gs.SIGMAS:g} SE. Each verdict is three-valued: **holds**, **fails** (the opposite is measured), or **inconclusive**
(then the smallest difference the run detects with 80% power, {gs.SIGMAS + gs.POWER_Z:.2f} SE, is given).

The primary metric is the **expected gain** of one normalised SGD step at its best size,
<grad J*, E g>^2 / (|grad J*|^2 E|g|^2), J* = E[Q*] (Q*: a well-formed rollout whose valid zoom call framed the
target), estimated without noise bias by pairing different prompts only (`gs.figures`). It does not reward a dense signal for
being dense: noise in g enters E|g|^2, and a batch without a gradient adds nothing to either side.

- **Proposition 1** (a group baseline removes the prompt-level part of the variance), in a world of mixed difficulty
  (inconclusive unless its intra-group correlation rho >= {RHO_MIN}: the (1 - rho) factor is untestable at rho near 0): the variance trace of batch
  gradients under `grpo` with `scale_rewards: none` (A = r - r-bar) over that under REINFORCE (A = r) is below 1 by
  more than {gs.SIGMAS:g} SE; fails above 1 by as much.
- **Proposition 2 (a)** (MAPO's gradient serves J* better, and because the crop framed the target): at the recipe's
  `semantic_beta` and `scale_rewards` and the 0.7 reader, `mapo_walk`'s expected gain beats its control `C_zoom`'s
  (z = c on every valid zoom call, c = the walk arm's mean z on valid calls: the same bonus for zooming, no word on
  which crop framed the target) by more than {gs.SIGMAS:g} SE, and GRPO's by more than {gs.SIGMAS:g} SE; fails when it
  is below `C_zoom`'s by more than {gs.SIGMAS:g} SE.
- **Proposition 2 (b)** (lower variance, made scale-free): at the recipe's scaling, `mapo_walk`'s noise over its signal
  projected on grad J*, tr Cov(g) / (<grad J*, E g>^2 / |grad J*|^2), is below `grpo`'s by more than {gs.SIGMAS:g} SE;
  fails above by as much.
- Proposition 2's verdicts are inconclusive when the primary checkpoint's sampled Q* rate lies outside
  {CHECKPOINT_RATE[0]:.2f} - {CHECKPOINT_RATE[1]:.2f}: then most groups of 4 tie and the question has no answer."""

NAMES = {
    "grpo": "GRPO on the 0.7 reader",
    "mapo_walk": "MAPO, walk verifier (z = 1 when the crop frames the target)",
    "C_zoom": "control: z = c on valid zoom calls",
    "C_valid": "control: z = c on every valid call",
    "C_all": "control: R_sem permuted within the group",
    "C_noise": "control: z drawn at the walk rate, blind to the calls",
    "mapo_exact": "MAPO, talk-and-walk verifier (the label must name the target too)",
    "mapo_clip_cosine": "MAPO, tiny CLIP, cosine",
    "mapo_clip_contrastive": "MAPO, tiny CLIP, contrastive",
    "mapo_clip_cosine_centred": "MAPO, tiny CLIP, cosine, centred on the batch",
    "mapo_clip_contrastive_centred": "MAPO, tiny CLIP, contrastive, centred on the batch",
    "hpo": "HPO",
    "mapo+hpo": "MAPO (walk) + HPO",
    "oracle": "GRPO on Q* itself",
    REINFORCE: "REINFORCE, A = r (reader), no baseline",
}
STEPS = {
    "mapo_walk - C_zoom": "which zoom framed the target (framing information)",
    "C_zoom - C_valid": "a bonus on zooms rather than on every valid call",
    "C_valid - C_all": "a bonus on valid calls rather than R_sem at random within the group",
    "C_all - grpo": "R_sem's values added at random within the group",
}


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}" if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def sci(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.3g}"


def pm(d: dict, digits: int = 4) -> str:
    """A difference ± its SE; n/a where the reference had no measurable norm."""
    if math.isnan(d["value"]):
        return "n/a (|grad J*|^2 not measurable)"
    return f"{d['value']:+.{digits}f} ± {d['se']:.{digits}f}"


def estimator_table(results: dict, scaling: str) -> str:
    rows = []
    for key, e in results["table"].items():
        name, scale = key.split("|")
        if scale != scaling:
            continue
        q, f = e["q"], e["framing"]
        descriptive = ["(mean products)"] * 3 if e["randomised"] else [
            fmt(q["with_gradient"], 2), fmt(q["cosine_given_gradient"], 4), fmt(q["cosine"], 4)]  # fmt: skip
        rows.append([
            f"`{name}`", NAMES.get(name, name), f"{sci(q['gain'])} ± {sci(q['gain_se'])}",
            pm(q["minus_grpo"], 5) if "minus_grpo" in q else "(reference)",
            f"{sci(f['gain'])} ± {sci(f['gain_se'])}", pm(f["minus_grpo"], 5) if "minus_grpo" in f else "(reference)",
            f"{sci(q['noise_over_signal'])} ± {sci(q['noise_over_signal_se'])}", *descriptive,
        ])  # fmt: skip
    header = ["arm", "what", "gain (Q*) ± SE", "minus grpo's", "gain (framing) ± SE", "minus grpo's",
              "noise / projected signal", "batches with a gradient", "cosine given one", "batch cosine"]  # fmt: skip
    return markdown_table(header, rows)


def significance(d: dict) -> str:
    """Whether a difference clears the bar, in words."""
    if d["value"] > gs.SIGMAS * d["se"]:
        return f"above 0 by more than {gs.SIGMAS:g} SE"
    if d["value"] < -gs.SIGMAS * d["se"]:
        return f"below 0 by more than {gs.SIGMAS:g} SE"
    return f"within {gs.SIGMAS:g} SE of 0"


def verdict_line(name: str, verdict: str, text: str) -> str:
    return f"- **{name} {verdict}** here: {text}"


def what_it_shows(results: dict, replications: list[dict], gate: dict | None) -> list[str]:
    """The report's findings, each worded from the figures and verdicts it states."""
    p1, p2, chain = results["prop1"], results["prop2"], results["chain"]
    lo, hi = CHECKPOINT_RATE
    rate = results["rate"]
    inside = "inside" if lo <= rate <= hi else "outside"
    a, b = p2["a"], p2["b"]
    mixed = p1["mixed"]
    lines = [
        f"- The primary checkpoint frames the target (Q*) in {rate:.1%} of sampled rollouts: {inside} {lo:.2f} - {hi:.2f}; "
        f"{results['valid_rate']:.1%} are well formed with a valid call (V).",
        verdict_line(
            "Proposition 1",
            mixed["verdict"],
            f"in the world of mixed difficulty (rho {mixed['moments']['rho']:.2f}) the group baseline's gradient variance is "
            f"{mixed['trace_ratio']:.3f} ± {mixed['trace_ratio_se']:.3f} of REINFORCE's; the reward-level prediction "
            f"(1 - 1/G)(1 - rho) sigma^2 / (sigma^2 + mu^2) is {mixed['moments']['predicted_ratio']:.3f}; the per-rollout "
            f"part alone is {mixed['per_rollout_ratio']:.3f} ± {mixed['per_rollout_ratio_se']:.3f} of REINFORCE's; the "
            f"measured ratio lies {gs.z_score(mixed['trace_ratio'] - mixed['moments']['predicted_ratio'], mixed['trace_ratio_se'])} "
            "from the prediction"
            + (
                "."
                if mixed["moments"]["rho"] >= RHO_MIN
                else f"; rho is below {RHO_MIN}, where the verdict cannot be read."
            ),
        ),
        verdict_line(
            "Proposition 2 (a)",
            a["verdict"],
            f"`mapo_walk`'s expected gain minus its zoom control's is {pm(a['walk_minus_zoom'], 5)}, minus GRPO's "
            f"{pm(a['walk_minus_grpo'], 5)}"
            + (
                ""
                if a["verdict"] != gs.INCONCLUSIVE
                else f"; the run detects a difference from `C_zoom` of {a['detectable']:.2g} (80% power)"
            )
            + ".",
        ),
        verdict_line(
            "Proposition 2 (b)",
            b["verdict"],
            f"GRPO's noise over projected signal minus `mapo_walk`'s is {pm(b['grpo_minus_walk'], 3)}.",
        ),
    ]
    significant = [
        f"`{k}`, {STEPS[k]}: {pm(v['q'], 5)}"
        for k, v in chain.items()
        if abs(v["q"]["value"]) > gs.SIGMAS * v["q"]["se"]
    ]
    lines.append(
        "- The walk arm's difference from GRPO, step by step (expected gain towards Q*): "
        + ("; ".join(significant) + " exceed 2 SE" if significant else "no step exceeds 2 SE")
        + "; the others do not."
    )
    for s, sweep in results["quality"].items():
        d = sweep["one_minus_zero"]
        lines.append(
            f"- Verifier quality (`scale_rewards: {s}`, E[z | valid] held fixed): the walk arm's gain minus GRPO's is "
            f"{pm(sweep['rows']['0.00']['minus_grpo'], 5)} at q = 0 (verdicts at random) and "
            f"{pm(sweep['rows']['1.00']['minus_grpo'], 5)} at q = 1; the verdicts' quality itself (q = 1 minus q = 0) "
            f"adds {pm(d, 5)}, {significance(d)}."
        )
    for name, c in results["clip"].items():
        d = c["minus_grpo"]
        line = (
            f"- `{name}`: E[z | valid] - no_tool_semantic = {c['z_minus_no_tool']:+.3f}; its expected gain minus GRPO's "
            f"is {pm(d, 5)}, {significance(d)}"
        )
        if "minus_plain" in c:
            line += f"; minus the uncentred arm's {pm(c['minus_plain'], 5)}, {significance(c['minus_plain'])}"
        lines.append(line + ".")
    if replications:
        agree = [x for x in replications if x["verdict"] == a["verdict"]]
        lines.append(
            f"- Replication: Proposition 2 (a) reads {a['verdict']} on {len(agree)} of {len(replications)} other runs ("
            + ", ".join(
                f"{x['checkpoint']} seed {x['seed']}, Q* {x['rate']:.0%}: {x['verdict']}" for x in replications
            )
            + ")."
        )
    if gate:
        lines.append(
            "- The tiny CLIP's walk AUC (a label on a crop that frames its target against a crop of the same image that "
            "does not): " + ", ".join(f"{k} {v['walk_auc']:.2f}" for k, v in gate.items()) + "."
        )
    return lines


def plot_quality(path: Path, results: dict) -> None:
    """The quality sweep's gain minus GRPO's, with 2 SE bars, one curve per scaling."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8), dpi=100)
    ax = fig.subplots()
    for s, sweep in results["quality"].items():
        rows = [sweep["rows"][f"{q:.2f}"]["minus_grpo"] for q in QUALITIES]
        ax.errorbar(QUALITIES, [x["value"] for x in rows], yerr=[gs.SIGMAS * x["se"] for x in rows], marker="o",
                    markersize=3, capsize=3, label=f"scale_rewards: {s}")  # fmt: skip
    ax.axhline(0.0, linestyle="--", color="gray", linewidth=1)
    ax.set_title("Walk verifier of quality q, E[z | valid] held fixed: expected gain minus GRPO's", fontsize=9)
    ax.set_xlabel("verifier quality q (0: verdicts at random at the same rate)")
    ax.set_ylabel("gain minus GRPO's (± 2 SE)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def write_report(report: Path, results: dict, replications: list[dict], setup: dict) -> Path:
    """The report (`report`), its PNG and results.json (in `report` without its suffix), from the analysis."""
    folder = report.with_suffix("")
    for stale in folder.glob("*.png"):
        stale.unlink()
    plot_quality(folder / "quality.png", results)
    payload = json.dumps(
        results | {"replications": replications, "setup": setup}, indent=1, sort_keys=True, default=str
    )
    (folder / "results.json").write_text(payload + "\n", encoding="utf-8")
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    rel, scaling = folder.name, results["scaling"]
    p1 = results["prop1"]
    power = results["power"]
    chain_rows = [[f"`{k}`", STEPS[k], pm(v["q"], 5), pm(v["framing"], 5)] for k, v in results["chain"].items()]
    p1_rows = [
        [world, fmt(e["moments"]["rho"], 3), fmt(e["moments"]["mu"], 3), fmt(e["moments"]["predicted_ratio"], 3),
         f"{e['trace_ratio']:.3f} ± {e['trace_ratio_se']:.3f}", f"{e['per_rollout_ratio']:.3f} ± {e['per_rollout_ratio_se']:.3f}",
         sci(e["cross"]["grpo"]), sci(e["cross"][REINFORCE]), e["verdict"]]
        for world, e in p1.items()
    ]  # fmt: skip
    q_rows = [
        [f"{q:.2f}", *[f"{sci(results['quality'][s]['rows'][f'{q:.2f}']['gain'])} ± {sci(results['quality'][s]['rows'][f'{q:.2f}']['gain_se'])}"
                       f" ({pm(results['quality'][s]['rows'][f'{q:.2f}']['minus_grpo'], 5)})" for s in results["quality"]]]
        for q in QUALITIES
    ]  # fmt: skip
    gate = setup.get("gate") or {}
    clip_rows = [
        [f"`{n}`", fmt(gate.get(ESTIMATORS[n]["semantic_score"], {}).get("walk_auc"), 2), fmt(c["z_valid"], 3),
         f"{c['z_minus_no_tool']:+.3f}", f"{sci(c['gain'])} ± {sci(c['gain_se'])}", pm(c["minus_grpo"], 5)]
        for n, c in results["clip"].items()
    ]  # fmt: skip
    rep_rows = [
        [x["checkpoint"], x["seed"], x["rollouts"], f"{x['rate']:.1%}", sci(x["gain"][REFERENCE]), sci(x["gain"][WALK]),
         sci(x["gain"]["C_zoom"]), pm(x["walk_minus_zoom"], 5), pm(x["walk_minus_grpo"], 5), x["verdict"]]
        for x in [{"checkpoint": results["checkpoint"], "seed": results["seed"], "rollouts": results["rollouts"],
                   "rate": results["rate"], "gain": {k: results["table"][f"{k}|{scaling}"]["q"]["gain"] for k in (REFERENCE, WALK, "C_zoom")},
                   "walk_minus_zoom": results["prop2"]["a"]["walk_minus_zoom"],
                   "walk_minus_grpo": results["prop2"]["a"]["walk_minus_grpo"], "verdict": results["prop2"]["a"]["verdict"]},
                  *replications]
    ]  # fmt: skip
    lines = [
        "# MAPO's gradient claims, measured on the trainer's own code",
        "",
        f"_Generated by `research/gradient_claims.py` on {setup['date']} from results `{digest}` "
        f'(`{rel}/results.json`); every section, "What it shows" included, is written from them: rerun it to '
        "regenerate._",
        "",
        *verdict_sections(CRITERIA, what_it_shows(results, replications, setup.get("gate")), setup["command"]),
        "",
        f"- Policies: the experiment world's SFT checkpoints under `{setup['start']}` (rounds of {setup['sft_steps']} "
        "steps of the tiny SFT recipe, each from the last, from the tiny Qwen2.5-VL; 768 px square images, region hints), "
        f"built once and cached, not timed below. Primary: `{results['checkpoint']}`.",
        f"- Rollouts (primary): {results['rollouts']} in groups of {results['group']} ({results['prompts']} training "
        f"prompts), {results['steps']} steps (assistant turns), sampled at the recipe's temperature through "
        "`MAPOTrainer._generate_and_score_completions` (TRL's tool loop, the real zoom-in tool), batches of "
        f"{results['batch_prompts']} prompts as the recipe trains.",
        "- Score vectors: per step, the gradient of the trainer's loss term without its advantage (`loss_type: grpo`: "
        f"the mean over the rollout's trained tokens, tool responses masked), over all {setup['parameters']:,} trainable "
        "parameters; kept as their Gram matrix. A slow test checks them against autograd through the trainer's "
        "`compute_loss` with one-hot advantages.",
        "- References: grad E[Q*] and grad E[V] (V: well formed with a valid call) from unnormalised sequence scores "
        "(each rollout's score vectors times its trained-token count, so their mean is 0) with a leave-one-out baseline; "
        "the framing direction is grad Q* with grad E[V] projected out (coefficient "
        f"{results['projection']:.3f}, estimated from products of different prompts). The arms keep the trainer's own loss terms.",
        "- Noise: every squared norm and squared inner product is an unbiased U-statistic over different prompts "
        "(a prompt never pairs with itself or, in a bootstrap replicate, with its own repeat), so the reference's own "
        "noise inflates no denominator; a batch's cosine is taken against the reference on the other "
        f"{results['folds'] - 1} of {results['folds']} folds and divided by that unbiased |grad J*|, not by the noisy "
        f"reference's norm. Randomised controls are averaged over {PERMUTATIONS} draws through their mean products, "
        "which gives their expected figures exactly.",
        f"- Standard errors: {results['bootstrap']} stratified bootstrap replicates over prompts (within folds) of the "
        "whole computation, the references included.",
        f"- Power: the first version's walk-minus-control difference was {power['first_version']['walk_minus_control']} "
        f"± {power['first_version']['se']} in batch cosine on {power['first_version']['prompts']} prompts; detecting it "
        f"with 80% power at the 2 SE bar needs {power['prompts_needed']:,} prompts, beyond any CPU budget. The run "
        f"takes {results['prompts']} (the score vectors of its {results['rollouts']:,} rollouts fill ~6 GB of memory; "
        "the time budget would allow more) and states what it can detect.",
        f"- Wall time: {setup['minutes']:.1f} min on {setup['cores']} cores ("
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in setup["timings"].items())
        + ").",
        "- Recipe: `research/recipes/config_experiment.yaml`; each arm overrides only `advantage_estimator`, "
        f"`semantic_verifier`, `semantic_score`, `reward_funcs` (oracle) and `scale_rewards` (recipe: `{scaling}`).",
        "",
        "## The walk arm, decomposed",
        "",
        f"Differences of expected gain at the recipe's scaling (`{scaling}`), each ± its paired SE; towards grad Q* and "
        f"towards the framing direction. c = {results['walk_rate']:.3f} (the walk arm's mean z on valid calls); "
        f"{results['zoom_share']:.0%} of valid calls are zooms (at most a quarter of the image).",
        "",
        markdown_table(["step", "what it adds", "towards grad Q*", "towards framing"], chain_rows),
        "",
        f"## Every arm, `scale_rewards: {scaling}` (the recipe's)",
        "",
        "Randomised controls' per-batch columns are not shown: their figures come from mean products.",
        "",
        estimator_table(results, scaling),
        "",
        "## Every arm, `scale_rewards: none` (A = r - mean of the group)",
        "",
        estimator_table(results, "none"),
        "",
        "## Proposition 1",
        "",
        f"The same rollouts read by the recipe's reader, and by a reader of mixed difficulty (even-numbered prompts "
        f"answered right with probability {EASY_P} wherever the policy looked). The variance trace of `grpo` "
        "(`scale_rewards: none`) over REINFORCE's, split exactly from the Gram matrix into the per-rollout terms "
        "A_i^2 |S_i|^2 and the rest (products of different rollouts, and the mean's):",
        "",
        markdown_table(
            [
                "world",
                "rho",
                "mu",
                "predicted ratio",
                "trace ratio ± SE",
                "per-rollout ratio ± SE",
                "cross part, grpo",
                "cross part, REINFORCE",
                "verdict",
            ],
            p1_rows,
        ),  # fmt: skip
        "",
        "## Verifier quality",
        "",
        "Among valid zoom calls, each verdict kept with probability q and otherwise drawn afresh at the verdicts' own "
        f"rate, so E[z | valid] is the same at every q ({PERMUTATIONS} draws, shared by every q). Expected gain "
        "towards grad Q* ± SE, and (minus GRPO's ± SE):",
        "",
        markdown_table(["q", *[f"scale_rewards: {s}" for s in results["quality"]]], q_rows),
        "",
        f"![quality sweep]({rel}/quality.png)",
        "",
        "## The tiny CLIP",
        "",
        "The verifier gate's walk AUC (`evaluation.verifier_check` on held-out gold crops) beside z_t's mean on valid "
        "calls minus the value of a rollout without calls: a positive gap is a bonus for calling, whatever the crop; "
        "centring on the batch removes it.",
        "",
        markdown_table(
            [
                "arm",
                "walk AUC (uncentred score)",
                "E[z | valid]",
                "minus no_tool_semantic",
                "gain (Q*) ± SE",
                "minus grpo's",
            ],
            clip_rows,  # fmt: skip
        ),
        "",
        "## Replication",
        "",
        "The walk arm against its zoom control and GRPO, at the recipe's scaling, on each checkpoint and seed:",
        "",
        markdown_table(
            [
                "checkpoint",
                "seed",
                "rollouts",
                "Q* rate",
                "gain grpo",
                "gain walk",
                "gain C_zoom",
                "walk - C_zoom",
                "walk - grpo",
                "Prop. 2 (a)",
            ],
            rep_rows,
        ),  # fmt: skip
        "",
        "## The learning-curve route",
        "",
        "`make experiment-curves` (`research/experiment.py`, report `research/reports/experiment_curves.md`) trains the arms with "
        "RL and compares greedy target-seen. Its last verdict: "
        + " ".join(setup.get("curves_verdict") or ["(no report)"]),
        "",
    ]
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


# ------------------------------------------------------------------------------------------------- main
def save_measurement(measurement: dict, path: Path) -> None:
    """`measure`'s output as plain containers (loadable whatever module ran it)."""
    plain = dict(measurement, rollouts=vars(measurement["rollouts"]))
    plain["replays"] = {f"{name}|{scale}": vars(rep) for (name, scale), rep in measurement["replays"].items()}
    torch.save(plain, path)


def load_measurement(path: Path) -> dict:
    """What `save_measurement` wrote."""
    plain = torch.load(path, weights_only=False)
    replays = {tuple(key.split("|")): Replayed(**rep) for key, rep in plain["replays"].items()}
    return dict(plain, rollouts=Rollouts(**plain["rollouts"]), replays=replays)


def checkpoint_path(start: Path, round_: int) -> Path:
    return start / f"sft-round{round_}"


def prepare_start(start: Path, sft_steps: int, rounds: int, image_side: int, log=print) -> None:
    """The fixed policies, built once by the demo's stages in the experiment's world and cached in `start`: the tiny
    CLIP verifier, the data (square images of `image_side`), and `rounds` runs of the tiny SFT recipe of `sft_steps`
    each, each from the last (`sft-round<i>`)."""
    kit = stages.tiny_kit()
    if not (start / "clip" / "open_clip_config.json").exists():
        log("the CLIP verifier")
        stages.train_verifier(start / "clip", kit, 300)
    if not (start / "data" / "dataset_dict.json").exists():
        log("the data")
        stages.make_data(start / "data", 1024, 128, min_size=image_side, max_size=image_side)
    previous = kit["policy"]
    for i in range(1, rounds + 1):
        out = checkpoint_path(start, i)
        if not (out / "config.json").exists():
            log(f"SFT round {i} of {rounds} ({sft_steps} steps)")
            stages.run_sft(previous, start / "data", out, sft_steps)
        previous = out


def tiny_clip_gate(start: Path, checkpoint: Path, rows: int) -> dict[str, dict]:
    """The verifier gate (talk and walk axes) of the start's tiny CLIP on the first `rows` test rows."""
    budget = pixel_budget(load_processor(checkpoint))
    tool = ToolConfig(clip_model=str(start / "clip")).resolved(budget)
    test = load_saved_split(str(start / "data"), "test").select(range(rows))
    make_env = make_environment_factory(tool, budget)
    gate = check_verifier(
        build_verifier("clip", tool), list(test), make_env, semantic_scores=("cosine", "contrastive")
    )
    return {score: result.as_dict() for score, result in gate.items()}


def runs(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(SFT round, seed, rollouts) of every measurement: the primary checkpoint at each seed, then the others at the
    first seed; the first is the primary measurement."""
    primary, *others = args.checkpoints
    first, *more = args.seeds
    out = [(primary, first, args.rollouts)]
    out += [(primary, s, args.replication_rollouts) for s in more]
    out += [(c, first, args.replication_rollouts) for c in others]
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    add("--rollouts", type=int, default=2560, help="rollouts of the primary measurement (groups of the recipe's G)")
    add("--replication_rollouts", type=int, default=1024, help="rollouts of every other checkpoint and seed")
    add("--checkpoints", type=ints, default=[2, 1, 3, 4], help="SFT rounds measured, the primary first")
    add("--seeds", type=ints, default=[0, 1], help="rollout seeds at the primary checkpoint, the primary first")
    add("--folds", type=int, default=4, help="folds by prompt (at least 4: the unbiased squares need 4)")
    add("--bootstrap", type=int, default=200, help="bootstrap replicates over prompts")
    add("--start", type=Path, default=Path("outputs/claims"), help="the cached checkpoints, data and CLIP")
    add("--sft_steps", type=int, default=900, help="SFT steps of each round, when a checkpoint is built")
    add("--image_side", type=int, default=768)
    add("--gate_rows", type=int, default=64, help="held-out rows of the tiny CLIP's verifier gate (0: skip)")
    add("--report", type=Path, default=REPORT, help="the PNG and results.json go in <report>/")
    add("--curves_report", type=Path, default=Path("research/reports/experiment_curves.md"))
    add("--reuse", action="store_true", help="reuse <start>/measurement-*.pt instead of measuring again")
    args = parser.parse_args(argv)
    if args.folds < 4 or args.bootstrap < 2:
        parser.error("--folds needs at least 4 and --bootstrap at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.time()
    prepare_start(args.start, args.sft_steps, max(args.checkpoints), args.image_side)
    measurements, timings = [], {}
    for i, (round_, seed, rollouts) in enumerate(runs(args)):
        saved = args.start / f"measurement-round{round_}-seed{seed}-n{rollouts}.pt"
        if args.reuse and saved.exists():
            measurements.append(load_measurement(saved))
        else:
            m, _ = measure(args, args.start, checkpoint_path(args.start, round_), rollouts, seed, replays=i == 0)
            save_measurement(m, saved)
            measurements.append(m)
        for k, v in measurements[-1]["timings"].items():
            timings[k] = timings.get(k, 0.0) + v
    t = time.time()
    primary, *others = measurements
    results = analyse(primary, args.folds, args.bootstrap, primary["seed"])
    replications = [analyse_replication(m, args.folds, args.bootstrap, m["seed"]) for m in others]
    timings["statistics"] = time.time() - t
    primary_path = checkpoint_path(args.start, args.checkpoints[0])
    gate = tiny_clip_gate(args.start, primary_path, args.gate_rows) if args.gate_rows else None
    setup = {
        "date": datetime.date.today().isoformat(),
        "command": command_line(argv),
        "start": str(args.start),
        "sft_steps": args.sft_steps,
        "parameters": primary["parameters"],
        "timings": timings,
        "minutes": sum(timings.values()) / 60,
        "cores": torch.get_num_threads(),
        "gate": gate,
        "curves_verdict": stages.experiment_verdict(args.curves_report) if args.curves_report.exists() else None,
    }
    report = write_report(args.report, results, replications, setup)
    print(f"report: {report} ({(time.time() - started) / 60:.1f} min in all)")
    return results


def command_line(argv: Sequence[str]) -> str:
    """The command that measures anew what this run reports (`--reuse` only skipped the measuring)."""
    measuring = [a for a in argv if a != "--reuse"]
    return f'make experiment ARGS="{" ".join(measuring)}"' if measuring else "make experiment"


if __name__ == "__main__":
    main()
