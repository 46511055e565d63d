"""`make experiment`: MAPO's gradient claims (Walk the Talk, section 4) measured on the trainer's own code, at fixed
policies, on CPU.

Section 4 argues about the policy-gradient estimate at a fixed policy, not about training curves (RL's own test is
`make experiment-curves`, research/reports/experiment_curves.md), and that can be measured here:

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
import os
import resource
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
from research.report import markdown_table, unbacked_numbers, verdict_sections
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
# Prompts per optimizer step of the paper's recipe (recipes/mapo_paper.yaml on the 8-GPU accelerate configs): 8 rollouts
# a device x 4 accumulation steps x 8 processes, over G = 8 rollouts a prompt. The gain is reported there too.
RECIPE_PROMPTS = 32
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
    """Draw the rollouts of the train split's rows `prompts` through `trainer`'s own path, batch by batch (each seeded
    by (`seed`, batch)), and keep what every estimator needs: the recorded batches (for `replay`), and `Rollouts`
    (whose prompts are numbered from 0 in the order of `prompts`)."""
    group = trainer.num_generations
    dataset = trainer.train_dataset
    batches, vectors, step_rollout, rollout_prompt, tokens = [], [], [], [], []
    well_formed, seen, draws, walk, zoom = [], [], [], [], []
    verdicts = WalkVerifier()
    started = time.time()
    local = {p: i for i, p in enumerate(prompts)}
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
        rollout_prompt += [local[p] for p in chunk for _ in range(group)]
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
    first_prompt: int = 0,
) -> tuple[dict, list[dict]]:
    """`rollouts` rollouts at `checkpoint` (seeded by `seed`) on the train split's rows from `first_prompt` on, their
    Gram matrix and, with `replays`, every estimator's replay; and the recorded batches. `recording_cls` draws the
    rollouts (a test scripts its calls)."""
    kit = stages.tiny_kit()
    recorder = build(start, checkpoint, kit, "recording", recording_cls, **ESTIMATORS[REFERENCE])
    group = recorder.num_generations
    batch_prompts = recorder.args.per_device_train_batch_size // group
    prompts = rollouts // group
    if first_prompt + prompts > len(recorder.train_dataset):
        raise ValueError(
            f"{rollouts} rollouts from prompt {first_prompt}: the train split has {len(recorder.train_dataset)} prompts"
        )
    recipe_scaling = recorder.scale_rewards
    parameters = sum(p.numel() for p in recorder.model.parameters() if p.requires_grad)  # the score vectors' size
    timings = {}
    t = time.time()
    log(
        f"{checkpoint.name}, seed {seed}: {rollouts} rollouts in groups of {group} from prompt {first_prompt}, "
        f"{batch_prompts} prompts a batch"
    )
    batches, recorded = collect(recorder, range(first_prompt, first_prompt + prompts), batch_prompts, seed, log)
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
        "first_prompt": first_prompt,
        "prompt_rows": list(range(first_prompt, first_prompt + prompts)),
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


def gain_key(batch: int) -> str:
    """The name of the signed expected gain at `batch` prompts a batch (`gs.expected_gain`)."""
    return f"gain_b{batch}"


def figure_of(stats: dict, figure: str):
    """A figure from an arm's statistics (`gs.moments`, floats or arrays of replicates): `gain_b<B>`
    (`gs.expected_gain` at B prompts), `noise_over_signal` (`gs.noise_over_signal`), or a statistic itself."""
    if figure.startswith("gain_b"):
        return gs.expected_gain(stats, float(figure.removeprefix("gain_b")))
    if figure == "noise_over_signal":
        return gs.noise_over_signal(stats)
    return stats[figure]


@dataclass
class Run:
    """One measurement ready for the statistics: its arms' products by (name, scaling), its reference directions and
    each prompt's fold."""

    arms: dict
    d: Directions
    fold_of: np.ndarray


def draw_statistics(runs: Sequence[Run], draws: Sequence[gs.Draw], bp: int, group: int, describe: bool) -> list:
    """Every arm's `gs.moments` (with `describe`, also `gs.batch_figures`) on one draw of each run, towards grad Q*
    and towards the framing direction; the framing direction's projection coefficient pools the runs' products
    (`gs.projection_coefficient` on one run). Per run: {"projection": c, key: {direction: statistics}}."""
    weights = [gs.DrawWeights(draw, run.d.prompts, bp, group) for run, draw in zip(runs, draws, strict=True)]
    shares = [run.d.prompts for run in runs]
    products = gs.pool(
        [{"qv": w.pair_mean(run.d.qv), "vv": w.pair_mean(run.d.vv)} for run, w in zip(runs, weights)], shares
    )
    c = float(products["qv"] / products["vv"]) if products["vv"] > 0 else 0.0
    out = []
    for run, w in zip(runs, weights):
        framing = gs.framing_products(run.d.qq, run.d.qv, run.d.vv, c)
        stats = {"projection": c}
        for key, arm in run.arms.items():
            towards = {
                "q": (gs.Arm(arm.own, arm.q), run.d.qq),
                "framing": (gs.Arm(arm.own, arm.q - c * arm.v), framing),
            }
            stats[key] = {}
            for x, (a, ref) in towards.items():
                stats[key][x] = gs.moments(a, ref, w) | (gs.batch_figures(a, ref, w) if describe else {})
        out.append(stats)
    return out


@dataclass
class Measured:
    """An arm set's statistics on the sample (`point`: key -> direction -> statistic) and on every bootstrap replicate
    (`replicates`, arrays); every figure (`figure_of`) is formed from them."""

    point: dict
    replicates: dict

    def value(self, key, direction: str = "q", figure: str = "gain_b2") -> float:
        return float(figure_of(self.point[key][direction], figure))

    def reps(self, key, direction: str = "q", figure: str = "gain_b2") -> np.ndarray:
        return np.asarray(figure_of(self.replicates[key][direction], figure), dtype=np.float64)

    def se(self, key, direction: str = "q", figure: str = "gain_b2") -> float:
        reps = self.reps(key, direction, figure)
        reps = reps[np.isfinite(reps)]
        return float(reps.std(ddof=1)) if reps.size > 1 else math.nan

    def interval(self, key, direction: str = "q", figure: str = "gain_b2") -> list[float]:
        return list(gs.percentile_interval(self.reps(key, direction, figure)))

    def undefined(self, direction: str = "q") -> int:
        """Replicates whose reference (grad Q* by default) had no measurable norm (|grad J|^2 <= 0): they define no
        figure towards it and are left out of its SEs."""
        first = next(iter(self.replicates.values()))
        return int((~(np.asarray(first[direction]["ref2"]) > 0)).sum())

    def measurable(self, direction: str = "q") -> bool:
        """Whether the sample itself measures |grad J*|^2 > 0 (else no figure towards it is defined)."""
        first = next(v for k, v in self.point.items() if k != "projection")
        return bool(first[direction]["ref2"] > 0)

    def diff(self, a, b, direction: str = "q", figure: str = "gain_b2") -> gs.Difference:
        """a minus b, paired over replicates."""
        return gs.paired_difference(
            self.value(a, direction, figure),
            self.value(b, direction, figure),
            self.reps(a, direction, figure),
            self.reps(b, direction, figure),
        )


def _stack(per_replicate: list[dict]) -> dict:
    """Replicates' statistics (key -> direction -> statistic -> float) as arrays."""
    first = per_replicate[0]
    return {
        key: {x: {k: np.asarray([r[key][x][k] for r in per_replicate]) for k in first[key][x]} for x in DIRECTIONS}
        for key in first
        if key != "projection"
    }


def measure_arms(runs: Sequence[Run], bp: int, group: int, bootstrap: int, seed: int) -> tuple[Measured, list]:
    """`draw_statistics` on the sample and on `bootstrap` replicates, each drawing every run's prompts with
    replacement within its folds (`gs.Draw.of`); the runs' statistics pooled by their prompts (`gs.pool`). Returns the
    pooled `Measured` and each run's."""
    shares = [run.d.prompts for run in runs]

    def pooled(per_run: list[dict]) -> dict:
        keys = [k for k in per_run[0] if k != "projection"]
        out = {key: {x: gs.pool([p[key][x] for p in per_run], shares) for x in DIRECTIONS} for key in keys}
        return out | {"projection": per_run[0]["projection"]}

    points = draw_statistics(runs, [gs.Draw.of(run.fold_of) for run in runs], bp, group, describe=True)
    rngs = [np.random.default_rng([seed, k]) for k in range(len(runs))]
    replicates = [[] for _ in runs]
    pooled_replicates = []
    for _ in range(bootstrap):
        stats = draw_statistics(runs, [gs.Draw.of(run.fold_of, rng) for run, rng in zip(runs, rngs)], bp, group, False)
        for k, s in enumerate(stats):
            replicates[k].append(s)
        pooled_replicates.append(pooled(stats))
    per_run = [Measured(p, _stack(r)) for p, r in zip(points, replicates)]
    return Measured(pooled(points), _stack(pooled_replicates)), per_run


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


def proposition_1(runs: Sequence[tuple[Rollouts, np.ndarray]], group: int, bp: int, bootstrap: int, seed: int):
    """Proposition 1 in the recipe's world and in the world of mixed difficulty (`EASY_P`), on the runs pooled by
    their prompts: the variance trace of the group baseline (A = r - r-bar) over REINFORCE's (A = r), each split into
    per-rollout and cross-rollout parts; its SE and percentile interval; its distance from 1 and from the reward-level
    prediction in SE. `runs`: each run's rollouts and prompts' folds."""
    shares = [len(r.rollout_prompt) // group for r, _ in runs]
    out = {}
    for world in ("recipe", "mixed"):
        outcomes, parts = [], []
        for r, _ in runs:
            reader = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P))
            easy = r.rollout_prompt % 2 == 0
            outcome = reader if world == "recipe" else np.where(easy, r.well_formed * (r.draws < EASY_P), reader)
            gram = r.rollout_gram()
            outcomes.append(outcome)
            parts.append({
                arm: gs.rollout_split(coef, gram, group)
                for arm, coef in (("grpo", gs.group_advantages(outcome, group)), (REINFORCE, outcome))
            })  # fmt: skip

        def split(draws, parts=parts):
            """Each arm's (trace, per-rollout, cross) pooled over the runs."""
            per_run = [
                {
                    arm: np.asarray(gs.trace_split(own, self_part, draw, bp, group))
                    for arm, (own, self_part) in p.items()
                }
                for p, draw in zip(parts, draws)
            ]
            return gs.pool(per_run, shares)

        point = split([gs.Draw.of(fold_of) for _, fold_of in runs])
        rngs = [np.random.default_rng([seed, 3, k]) for k in range(len(runs))]
        reps = [split([gs.Draw.of(fold_of, rng) for (_, fold_of), rng in zip(runs, rngs)]) for _ in range(bootstrap)]

        def ratio(figs, i):
            return float(figs["grpo"][i] / figs[REINFORCE][i]) if figs[REINFORCE][i] else math.nan

        moments = gs.reward_moments(np.concatenate(outcomes), group)
        entry = {"moments": vars(moments) | {"predicted_ratio": moments.predicted_ratio}}
        for i, part in enumerate(("trace", "per_rollout", "cross")):
            entry[part] = {arm: float(point[arm][i]) for arm in point}
            entry[f"{part}_ratio"] = ratio(point, i)
            values = np.asarray([ratio(x, i) for x in reps])
            entry[f"{part}_ratio_se"] = float(np.nanstd(values, ddof=1))
            entry[f"{part}_ratio_interval"] = list(gs.percentile_interval(values))
        se = entry["trace_ratio_se"]
        entry["below_one_z"] = (1.0 - entry["trace_ratio"]) / se if se > 0 else math.nan
        entry["prediction_z"] = (entry["trace_ratio"] - moments.predicted_ratio) / se if se > 0 else math.nan
        entry["prediction"] = "matches" if abs(entry["prediction_z"]) <= gs.SIGMAS else "misses"
        entry["verdict"] = gs.better_verdict(gs.Difference(1.0 - entry["trace_ratio"], se))
        if not moments.rho >= RHO_MIN:  # the (1 - rho) factor cannot show
            entry["verdict"] = gs.INCONCLUSIVE
        out[world] = entry
    return out


def difference(d: gs.Difference) -> dict:
    """A `gs.Difference` for results.json, with its size in SE (`z`)."""
    return vars(d) | {"z": d.value / d.se if d.se > 0 else math.nan}


def prop2a(measured: Measured, scaling: str, batches: Sequence[int], rate: float) -> dict:
    """Proposition 2 (a)'s primary figures at each batch size (`gs.prop2a_verdict`): the framing information
    (`mapo_walk` minus the walk verifier at quality 0, `Q0`), the bonus's density (`Q0` minus `C_zoom`), their sum
    (walk minus `C_zoom`) and walk minus GRPO, signed expected gains towards grad Q*; and the batch size where each
    contrast's point estimates cross 0 (`gs.crossing`)."""
    walk, q0, zoom, grpo = (WALK, scaling), (Q0, scaling), ("C_zoom", scaling), (REFERENCE, scaling)
    out = {}
    for b in batches:
        g = gain_key(b)
        information, walk_grpo = measured.diff(walk, q0, "q", g), measured.diff(walk, grpo, "q", g)
        walk_gain = measured.value(walk, "q", g)
        verdict = gs.prop2a_verdict(information, walk_grpo, walk_gain)
        if not CHECKPOINT_RATE[0] <= rate <= CHECKPOINT_RATE[1]:
            verdict = gs.INCONCLUSIVE
        out[f"b{b}"] = {
            "information": difference(information),
            "density": difference(measured.diff(q0, zoom, "q", g)),
            "walk_minus_zoom": difference(measured.diff(walk, zoom, "q", g)),
            "walk_minus_grpo": difference(walk_grpo),
            "walk_gain": walk_gain,
            "verdict": verdict,
            "detectable": gs.detectable(information.se),
        }
    point = {key: measured.point[key]["q"] for key in (walk, q0, zoom, grpo)}
    out["point"] = {
        key[0]: {k: point[key][k] for k in ("inner", "along", "ref2", "mean2", "single2")} for key in point
    }
    out["crossing"] = {
        "information": gs.crossing(point[walk], point[q0]),
        "density": gs.crossing(point[q0], point[zoom]),
        "walk_minus_grpo": gs.crossing(point[walk], point[grpo]),
    }
    return out


def prop2b(measured: Measured, scaling: str) -> dict:
    """Proposition 2 (b) as log(GRPO's noise over signal / `mapo_walk`'s) (`gs.noise_over_signal`: free of the batch
    size), judged by its percentile interval (`gs.interval_verdict`): a replicate where an arm's step does not climb
    J* has infinite noise over signal, where an SE means nothing."""
    grpo, walk = (REFERENCE, scaling), (WALK, scaling)
    value = gs.log_ratio(
        measured.value(grpo, "q", "noise_over_signal"), measured.value(walk, "q", "noise_over_signal")
    )
    reps = gs.log_ratio(measured.reps(grpo, "q", "noise_over_signal"), measured.reps(walk, "q", "noise_over_signal"))
    lo, hi = gs.percentile_interval(reps)
    return {
        "log_ratio": value,
        "interval": [lo, hi],
        "undefined": int(np.isnan(reps).sum()),
        "infinite": int(np.isinf(reps).sum()),
        "grpo": measured.value(grpo, "q", "noise_over_signal"),
        "walk": measured.value(walk, "q", "noise_over_signal"),
        "verdict": gs.interval_verdict(lo, hi),
    }


def run_summary(m: dict, measured: Measured, batches: Sequence[int]) -> dict:
    """One run's identity, Q* rate, undefined replicates and Proposition 2 (a)'s figures on it alone."""
    r = m["rollouts"]
    rate = float(r.q_star.mean())
    out = {
        "checkpoint": m["checkpoint"],
        "seed": m["seed"],
        "first_prompt": m.get("first_prompt", 0),
        "prompts": len(r.rollout_prompt) // m["group"],
        "prompt_range": [m.get("first_prompt", 0), m.get("first_prompt", 0) + len(r.rollout_prompt) // m["group"] - 1],
        "rollouts": len(r.rollout_prompt),
        "rate": rate,
        "valid_rate": float(r.valid_call.mean()),
        "undefined_replicates": measured.undefined(),
        "measurable": measured.measurable(),
    }
    if out["measurable"]:
        scaling = m["recipe_scaling"]
        out["gain"] = {
            name: {f"b{b}": measured.value((name, scaling), "q", gain_key(b)) for b in batches}
            for name in (REFERENCE, WALK, Q0, "C_zoom")
        }
        out["prop2a"] = {scaling: prop2a(measured, scaling, batches, rate)}
    return out


def analyse(ms: Sequence[dict], folds: int, bootstrap: int, log=print) -> dict:
    """Every table and verdict of the report from the measurements at the primary checkpoint (`measure` with
    replays), pooled by their prompts: the primary run first, then the independent ones."""
    m = ms[0]
    group, bp, scaling = m["group"], m["batch_prompts"], m["recipe_scaling"]
    scalings = tuple(dict.fromkeys((scaling, "none")))
    batches = tuple(dict.fromkeys((bp, RECIPE_PROMPTS)))
    t = time.time()
    runs = [primary_run(x, folds) for x in ms]
    log(f"  products of {len(runs[0].arms)} arms on {len(runs)} runs: {time.time() - t:.0f} s")
    t = time.time()
    measured, per_run = measure_arms(runs, bp, group, bootstrap, m["seed"])
    log(f"  bootstrap: {time.time() - t:.0f} s")
    rollouts = [x["rollouts"] for x in ms]
    q_star = np.concatenate([r.q_star for r in rollouts])
    rate = float(q_star.mean())

    def entry(key) -> dict:
        out = {"randomised": runs[0].arms[key].randomised}
        for x in DIRECTIONS:
            e = dict(measured.point[key][x])
            for b in batches:
                g = gain_key(b)
                e[g], e[f"{g}_se"], e[f"{g}_interval"] = (
                    measured.value(key, x, g),
                    measured.se(key, x, g),
                    measured.interval(key, x, g),
                )
                if key[0] != REFERENCE and (REFERENCE, key[1]) in runs[0].arms:
                    e[f"minus_grpo_b{b}"] = difference(measured.diff(key, (REFERENCE, key[1]), x, g))
            e["noise_over_signal"] = measured.value(key, x, "noise_over_signal")
            out[x] = e
        return out

    table = {f"{name}|{s}": entry((name, s)) for name, s in runs[0].arms if not name.startswith("walk_q")}
    chain = {
        f"{a} - {b}": {
            x: {f"b{n}": difference(measured.diff((a, scaling), (b, scaling), x, gain_key(n))) for n in batches}
            for x in DIRECTIONS
        }
        for a, b in zip(CHAIN, CHAIN[1:])
    }
    quality = {}
    for s in scalings:
        rows = {}
        for q in QUALITIES:
            key = (quality_arm(q), s)
            rows[f"{q:.2f}"] = {
                f"b{b}": {
                    "gain": measured.value(key, "q", gain_key(b)),
                    "gain_se": measured.se(key, "q", gain_key(b)),
                    "minus_grpo": difference(measured.diff(key, (REFERENCE, s), "q", gain_key(b))),
                }
                for b in batches
            }
        ends = ((quality_arm(QUALITIES[-1]), s), (Q0, s))
        quality[s] = {
            "rows": rows,
            "one_minus_zero": {f"b{b}": difference(measured.diff(*ends, "q", gain_key(b))) for b in batches},
            "break_even": {
                f"b{b}": gs.break_even(
                    QUALITIES, [rows[f"{q:.2f}"][f"b{b}"]["minus_grpo"]["value"] for q in QUALITIES]
                )
                for b in batches
            },
        }
    empty = m["recipe"]["no_tool_semantic"]
    clip = {}
    for name in CLIP_ARMS:
        z = np.concatenate([x["replays"][(name, scaling)].z for x in ms])
        z = z[~np.isnan(z)]
        key = (name, scaling)
        clip[name] = {
            "z_valid": float(z.mean()) if z.size else math.nan,
            "z_minus_no_tool": float(z.mean()) - empty if z.size else math.nan,
        }
        for b in batches:
            g = gain_key(b)
            clip[name][f"b{b}"] = {
                "gain": measured.value(key, "q", g),
                "gain_se": measured.se(key, "q", g),
                "minus_grpo": difference(measured.diff(key, (REFERENCE, scaling), "q", g)),
            }
            if name.endswith("_centred"):
                plain = (name.removesuffix("_centred"), scaling)
                clip[name][f"b{b}"]["minus_plain"] = difference(measured.diff(key, plain, "q", g))
    walk = [v for r in rollouts for calls in r.walk for v in calls]
    zoom_calls = [z for r in rollouts for calls, zs in zip(r.walk, r.zoom) for v, z in zip(calls, zs) if v is not None]
    return {
        "checkpoint": m["checkpoint"],
        "seed": m["seed"],
        "seeds": [x["seed"] for x in ms],
        "runs": [run_summary(x, mx, batches) for x, mx in zip(ms, per_run)],
        "rate": rate,
        "valid_rate": float(np.concatenate([r.valid_call for r in rollouts]).mean()),
        "walk_rate": walk_rate([walk]),
        "zoom_share": float(np.mean(zoom_calls)) if zoom_calls else math.nan,
        "projection": measured.point["projection"],
        "undefined_replicates": measured.undefined(),
        "undefined_replicates_framing": measured.undefined("framing"),
        "rollouts": len(q_star),
        "steps": sum(len(r.step_rollout) for r in rollouts),
        "prompts": sum(run.d.prompts for run in runs),
        "folds": folds,
        "bootstrap": bootstrap,
        "group": group,
        "batch_prompts": bp,
        "batch_sizes": list(batches),
        "scaling": scaling,
        "criteria": {
            "sigmas": gs.SIGMAS,
            "coverage": math.erf(gs.SIGMAS / math.sqrt(2)),
            "rate_bounds": list(CHECKPOINT_RATE),
            "rho_min": RHO_MIN,
            "ratio_bar": 1.0,
            "qualities": list(QUALITIES),
            "power": 0.8,
            "power_z": gs.POWER_Z,
        },
        "table": table,
        "chain": chain,
        "prop1": proposition_1([(r, run.fold_of) for r, run in zip(rollouts, runs)], group, bp, bootstrap, m["seed"]),
        "prop2": {
            "a": {s: prop2a(measured, s, batches, rate) for s in scalings},
            "b": prop2b(measured, scaling),
        },
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


def analyse_replication(m: dict, folds: int, bootstrap: int, batches: Sequence[int]) -> dict:
    """Proposition 2 (a)'s figures on a measurement without replays (another checkpoint), alone (`run_summary`)."""
    r, group, scaling = m["rollouts"], m["group"], m["recipe_scaling"]
    d = Directions(r, group)
    arms = world_arms(r, d, m["recipe"], group, (scaling,), m["seed"], qualities=(QUALITIES[0],))
    measured, _ = measure_arms(
        [Run(arms, d, folds_of(d.prompts, folds))], m["batch_prompts"], group, bootstrap, m["seed"]
    )
    return run_summary(m, measured, batches)


# ------------------------------------------------------------------------------------------------- report
COVERAGE = math.erf(gs.SIGMAS / math.sqrt(2))
CRITERIA = f"""Stated before the numbers, in the code that judges them (`research.gradient_stats`); this third version's rules
were fixed after reading the second version's results (issue 50) and before this run. Every figure is measured on the
same rollouts for every arm, so differences are paired; standard errors (SE) come from a stratified bootstrap over
prompts of the whole pipeline (the references included), each printed beside the percentile interval of the same
replicates (coverage {COVERAGE:.1%}, a normal's within {gs.SIGMAS:g} SE); a difference counts when it exceeds
{gs.SIGMAS:g} SE. Each verdict is three-valued: **holds**, **fails** (the opposite is measured), or **inconclusive**
(then the smallest difference the run detects with 80% power, {gs.SIGMAS + gs.POWER_Z:.2f} SE, is given).

The primary metric is the **signed expected gain** of one normalised SGD step at its best size on a batch of B
prompts, sign(<grad J*, E g>) <grad J*, E g>^2 / (|grad J*|^2 E|g_B|^2), J* = E[Q*] (Q*: a well-formed rollout whose
valid zoom call framed the target). Every term is an unbiased U-statistic over different prompts (`gs.moments`), and
E|g_B|^2 = |E g|^2 + tr Cov_1 / B (tr Cov_1: one prompt's gradient noise), so the same statistics give the gain at
B = 2 (the experiment recipe's batch) and at B = {RECIPE_PROMPTS} (the paper's recipe, `recipes/mapo_paper.yaml`: 8
rollouts a device x 4 accumulation steps x 8 GPUs over G = 8; this world's groups stay G = 4). At B = 2 the noise
term dominates, so the gain is nearly a signal-to-noise ratio; the larger B, the more the direction of E g counts. The
sign of the pair sum <grad J*, E g> says whether the step climbs J* at all, which the square alone loses. The primary
measurement pools independent runs at the primary checkpoint (new seed, prompts not used before) by their prompts.

- **Proposition 1** (a group baseline removes the prompt-level part of the variance), in the recipe's world and in a
  world of mixed difficulty: the variance trace of batch gradients under `grpo` with `scale_rewards: none`
  (A = r - r-bar) over that under REINFORCE (A = r) is below 1 by more than {gs.SIGMAS:g} SE; fails above 1 by as
  much; inconclusive in a world whose intra-group correlation rho is below {RHO_MIN} (the (1 - rho) factor cannot
  show at rho near 0). Beside it, in both worlds, the ratio's distance in SE from the reward-level prediction
  (1 - 1/G)(1 - rho) sigma^2 / (sigma^2 + mu^2): the prediction matches within {gs.SIGMAS:g} SE and misses beyond.
- **Proposition 2 (a)** (MAPO's gradient serves J* better, and because the crop framed the target), at each B, at the
  recipe's `semantic_beta` and `scale_rewards` and the 0.7 reader. Its primary figures split the walk arm's
  difference from its zoom control `C_zoom` (z = c on every valid zoom call, c the walk arm's mean z on valid calls) in
  two: the **information** contrast, `mapo_walk` minus the same verifier with its verdicts on valid zoom calls drawn
  at random at their own rate (q = 0: the same density of bonus, no word on which crop framed the target), and the
  **density** contrast, that q = 0 arm minus `C_zoom` (a 0/1 bonus at the walk rate against a constant c on every
  zoom). Holds when the information is above {gs.SIGMAS:g} SE, `mapo_walk` beats GRPO by more than {gs.SIGMAS:g} SE
  and its own signed gain is positive; fails when the information is below -{gs.SIGMAS:g} SE or `mapo_walk` is below
  GRPO by more than {gs.SIGMAS:g} SE. The density contrast is no part of MAPO's claim: it is reported with its SE.
- **Proposition 2 (b)** (lower variance, made scale-free): log of GRPO's noise over projected signal,
  tr Cov_1 / (sign(<grad J*, E g>) <grad J*, E g>^2 / |grad J*|^2), over `mapo_walk`'s, at the recipe's scaling; free
  of B (a batch divides both by B). A replicate where an arm's step does not climb J* has infinite noise over signal,
  so the verdict reads the percentile interval, not an SE: holds when it lies above 0, fails when below.
- Proposition 2's verdicts are inconclusive when the pooled primary's sampled Q* rate lies outside
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
    "mapo_walk - C_zoom": "which zoom framed the target, and the bonus's density",
    "C_zoom - C_valid": "a bonus on zooms rather than on every valid call",
    "C_valid - C_all": "a bonus on valid calls rather than R_sem at random within the group",
    "C_all - grpo": "R_sem's values added at random within the group",
}
CONTRASTS = {
    "information": "`mapo_walk` - q = 0 (framing information)",
    "density": "q = 0 - `C_zoom` (the bonus's density)",
    "walk_minus_zoom": "`mapo_walk` - `C_zoom` (their sum)",
    "walk_minus_grpo": "`mapo_walk` - `grpo`",
}
BATCH_DEPENDENT = ("hpo", "mapo+hpo", "mapo_clip_cosine_centred", "mapo_clip_contrastive_centred")


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}" if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def sci(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.3g}"


def interval(pair: Sequence[float], digits: int = 5, signed: bool = True) -> str:
    """A percentile interval, [lo, hi]."""
    if not signed:
        return f"[{fmt(pair[0], digits)}, {fmt(pair[1], digits)}]"
    return f"[{fmt_signed(pair[0], digits)}, {fmt_signed(pair[1], digits)}]"


def fmt_signed(value: float, digits: int) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:+.{digits}f}" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")


def pm(d: dict, digits: int = 5) -> str:
    """A difference ± its SE; n/a where the reference had no measurable norm."""
    if math.isnan(d["value"]):
        return "n/a (|grad J*|^2 not measurable)"
    return f"{d['value']:+.{digits}f} ± {d['se']:.{digits}f}"


def pm_z(d: dict, digits: int = 5) -> str:
    """A difference ± its SE and its size in SE."""
    if math.isnan(d["value"]) or math.isnan(d["z"]):
        return pm(d, digits)
    return f"{pm(d, digits)} ({d['z']:+.1f} SE)"


def pm_full(d: dict, digits: int = 5) -> str:
    """A difference ± its SE, its size in SE and its percentile interval."""
    if math.isnan(d["value"]) or math.isnan(d["z"]):
        return pm(d, digits)
    return f"{pm(d, digits)} ({d['z']:+.1f} SE; interval {interval((d['lo'], d['hi']), digits)})"


def batches_with_words(results: dict) -> dict[int, str]:
    bp = results["batch_prompts"]
    return {b: "the experiment's batch" if b == bp else "the paper recipe's batch" for b in results["batch_sizes"]}


def estimator_table(results: dict, scaling: str) -> str:
    small, large = results["batch_sizes"][0], results["batch_sizes"][-1]
    rows = []
    for key, e in results["table"].items():
        name, scale = key.split("|")
        if scale != scaling:
            continue
        q, f = e["q"], e["framing"]
        descriptive = ["(mean products)"] * 3 if e["randomised"] else [
            fmt(q["with_gradient"], 2), fmt(q["cosine_given_gradient"], 4), fmt(q["cosine"], 4)]  # fmt: skip

        def cells(x, b):
            g = gain_key(b)
            minus = pm(x[f"minus_grpo_b{b}"]) if f"minus_grpo_b{b}" in x else "(reference)"
            return [f"{sci(x[g])} ± {sci(x[f'{g}_se'])}", minus]

        rows.append([f"`{name}`" + (" (b)" if name in BATCH_DEPENDENT else ""), NAMES.get(name, name),
                     *cells(q, small), *cells(q, large), *cells(f, large), *descriptive])  # fmt: skip
    header = [
        "arm", "what", f"gain (Q*), B = {small}", "minus grpo's", f"gain (Q*), B = {large}", "minus grpo's",
        f"gain (framing), B = {large}", "minus grpo's", "batches with a gradient", "cosine given one", "batch cosine",
    ]  # fmt: skip
    return markdown_table(header, rows)


def significance(d: dict) -> str:
    """Whether a difference clears the bar, in words."""
    if d["value"] > gs.SIGMAS * d["se"]:
        return f"above 0 by more than {gs.SIGMAS:g} SE"
    if d["value"] < -gs.SIGMAS * d["se"]:
        return f"below 0 by more than {gs.SIGMAS:g} SE"
    return f"within {gs.SIGMAS:g} SE of 0"


def crossing_words(value: float) -> str:
    return f"at B = {value:.1f} prompts" if math.isfinite(value) else "at no batch size"


def prompts_of(run: dict) -> str:
    return f"prompts {run['prompt_range'][0]} to {run['prompt_range'][1]}"


def p1_verdict(e: dict) -> str:
    """Proposition 1's verdict in one world with its percentile interval: the 2 SE rule can hold while the interval,
    which the ratio's skew stretches upwards, still contains 1."""
    lo, hi = e["trace_ratio_interval"]
    span = interval(e["trace_ratio_interval"], 3, signed=False)
    if e["verdict"] != gs.INCONCLUSIVE and lo <= 1.0 <= hi:
        return f"{e['verdict']} by the {gs.SIGMAS:g} SE rule, though its percentile interval {span} contains 1"
    return f"{e['verdict']}, percentile interval {span}"


def constant_noise(results: dict) -> dict[str, float]:
    """Noise over projected signal of the constant bonuses (`CONSTANT_BONUSES`) at the recipe's scaling."""
    s = results["scaling"]
    return {arm: results["table"][f"{arm}|{s}"]["q"]["noise_over_signal"] for arm in CONSTANT_BONUSES}


def prop2b_words(results: dict) -> str:
    """Proposition 2 (b)'s verdict with its interval and the arms' noise over signal; a lower figure than the walk's
    for a constant bonus says the walk's advantage over GRPO needs no information on which crop framed the target."""
    b = results["prop2"]["b"]
    constants = constant_noise(results)
    figures = ", ".join(f"`{arm}` {fmt(v, 1)}" for arm, v in constants.items())
    figures += f", `{WALK}` {fmt(b['walk'], 1)}, `{REFERENCE}` {fmt(b['grpo'], 1)}"
    words = f"{b['verdict']} (interval {interval(b['interval'], 3)})"
    if min(constants.values()) <= b["walk"]:
        return (
            f"{words}, but the information-free constant bonuses do as well or better on point estimates (noise "
            f"over signal: {figures})"
        )
    return f"{words} (noise over signal: {figures})"


def what_it_shows(results: dict, replications: list[dict], gate: dict | None) -> list[str]:
    """The report's findings, each worded from the figures and verdicts of results.json (`headline_check` holds every
    number of them to it): Proposition 2 (a)'s contrasts at each batch size first, then Proposition 1 in both worlds."""
    p1, p2, chain = results["prop1"], results["prop2"], results["chain"]
    scaling, sizes = results["scaling"], results["batch_sizes"]
    a, b = p2["a"][scaling], p2["b"]
    seeds = " and ".join(str(s) for s in results["seeds"])
    lines = []
    for n, words in batches_with_words(results).items():
        x = a[f"b{n}"]
        lines.append(
            f"- **Proposition 2 (a), B = {n} ({words}), `scale_rewards: {scaling}`: {x['verdict']}.** On the pooled "
            f"primary (`{results['checkpoint']}`, seeds {seeds}, {results['prompts']:,} prompts), signed expected gain "
            f"towards grad Q*: the walk verdicts' framing information (`mapo_walk` - q = 0) is "
            f"{pm_full(x['information'])}; the bonus's density (q = 0 - `C_zoom`) is {pm_full(x['density'])}; "
            f"`mapo_walk` - GRPO is {pm_full(x['walk_minus_grpo'])}; `mapo_walk`'s own gain is {fmt_signed(x['walk_gain'], 5)}"
            + (
                f"; the run detects an information contrast of {x['detectable']:.5f} (80% power)."
                if x["verdict"] == gs.INCONCLUSIVE
                else "."
            )
        )
    cross = a["crossing"]
    lines.append(
        "- Where the contrasts change sign with the batch size (point estimates): the information "
        f"{crossing_words(cross['information'])}, the density {crossing_words(cross['density'])}, `mapo_walk` - GRPO "
        f"{crossing_words(cross['walk_minus_grpo'])}."
    )
    if "none" in p2["a"] and scaling != "none":
        nn = p2["a"]["none"]
        lines.append(
            "- Under `scale_rewards: none` (A = r - r-bar), Proposition 2 (a) reads "
            + " and ".join(f"{nn[f'b{n}']['verdict']} at B = {n}" for n in sizes)
            + ": the information is "
            + " and ".join(pm_z(nn[f"b{n}"]["information"]) for n in sizes)
            + ", the density "
            + " and ".join(pm_z(nn[f"b{n}"]["density"]) for n in sizes)
            + ", `mapo_walk` - `C_zoom` "
            + " and ".join(pm(nn[f"b{n}"]["walk_minus_zoom"]) for n in sizes)
            + "."
        )
    for world, words in (("mixed", "the world of mixed difficulty"), ("recipe", "the recipe's world")):
        e = p1[world]
        rho = e["moments"]["rho"]
        rule = "" if rho >= RHO_MIN else f" (below {RHO_MIN:g}: by the rule fixed before the data, no verdict)"
        lines.append(
            f"- **Proposition 1, {words}: {p1_verdict(e)}.** rho {rho:.3f}{rule}; the group baseline's gradient "
            f"variance is {e['trace_ratio']:.3f} ± {e['trace_ratio_se']:.3f} of REINFORCE's, below 1 by "
            f"{e['below_one_z']:.1f} SE; the reward-level "
            f"prediction is {e['moments']['predicted_ratio']:.3f}, "
            f"and the measured ratio lies {e['prediction_z']:+.1f} SE from it: the prediction {e['prediction']}."
        )
    lines.append(
        f"- **Proposition 2 (b), any B, `scale_rewards: {scaling}`: {prop2b_words(results)}.** log(GRPO's noise over "
        f"projected signal / `mapo_walk`'s) is {fmt_signed(b['log_ratio'], 3)}; of "
        f"{results['bootstrap']} replicates, {b['infinite']} put one arm's step at no measurable climb of J* (an infinite "
        f"ratio) and {b['undefined']} both (undefined). On a log scale because such replicates make an SE of the "
        "ratio meaningless."
    )
    lo, hi = CHECKPOINT_RATE
    inside = "inside" if lo <= results["rate"] <= hi else "outside"
    per_run = "; ".join(f"seed {r['seed']} ({prompts_of(r)}) {r['undefined_replicates']}" for r in results["runs"])
    lines.append(
        f"- The pooled primary frames the target (Q*) in {results['rate']:.1%} of sampled rollouts ({inside} "
        f"{lo:.2f} - {hi:.2f}); {results['valid_rate']:.1%} are well formed with a valid call (V). Bootstrap "
        f"replicates without a measurable |grad J*|^2 (left out of every SE), of {results['bootstrap']}: pooled "
        f"{results['undefined_replicates']}; {per_run}."
    )
    for n in sizes:
        significant = [
            f"`{k}` ({STEPS[k]}) {pm(v['q'][f'b{n}'])}" for k, v in chain.items()
            if abs(v["q"][f"b{n}"]["value"]) > gs.SIGMAS * v["q"][f"b{n}"]["se"]
        ]  # fmt: skip
        lines.append(
            f"- The walk arm's difference from GRPO, step by step, at B = {n}: "
            + (
                "; ".join(significant) + f" exceed {gs.SIGMAS:g} SE"
                if significant
                else f"no step exceeds {gs.SIGMAS:g} SE"
            )
            + (", the others do not." if significant else ".")
        )
    for name, c in results["clip"].items():
        parts = [
            f"{pm(c[f'b{n}']['minus_grpo'])} at B = {n} ({significance(c[f'b{n}']['minus_grpo'])})" for n in sizes
        ]
        line = (
            f"- `{name}`: E[z | valid] - no_tool_semantic = {c['z_minus_no_tool']:+.3f}; its signed gain minus GRPO's is "
            + " and ".join(parts)
        )
        if "minus_plain" in c[f"b{sizes[0]}"]:
            line += "; minus the uncentred arm's " + " and ".join(
                f"{pm(c[f'b{n}']['minus_plain'])} at B = {n}" for n in sizes
            )
        lines.append(line + ".")
    if replications:
        n = sizes[-1]
        measurable = [x for x in replications if x["measurable"]]
        unmeasured = [x for x in replications if not x["measurable"]]
        parts = []
        if measurable:
            parts.append(
                f"Proposition 2 (a) at B = {n} reads "
                + "; ".join(
                    f"{x['checkpoint']} (Q* {x['rate']:.1%}) {x['prop2a'][scaling][f'b{n}']['verdict']}, information "
                    f"{pm(x['prop2a'][scaling][f'b{n}']['information'])}, {x['undefined_replicates']} of "
                    f"{results['bootstrap']} replicates undefined"
                    for x in measurable
                )
            )
        if unmeasured:
            parts.append(
                "not measurable (|grad J*|^2 <= 0 on the sample itself, so no figure of it is defined): "
                + ", ".join(f"{x['checkpoint']} (Q* {x['rate']:.1%})" for x in unmeasured)
            )
        lines.append(f"- Other checkpoints, each alone at seed {replications[0]['seed']}: " + "; ".join(parts) + ".")
    if gate:
        lines.append(
            "- The tiny CLIP's walk AUC (a label on a crop that frames its target against a crop of the same image that "
            "does not): " + ", ".join(f"{k} {v['walk_auc']:.2f}" for k, v in gate.items()) + "."
        )
    return lines


def summary(results: dict) -> str:
    """The verdicts in one paragraph with their qualifiers (world, batch size, scaling, SE), from results.json: what
    the README and docs/demo.md quote (a test holds them to it)."""
    s = results["scaling"]
    a, p1, b = results["prop2"]["a"][s], results["prop1"], results["prop2"]["b"]

    def world(e: dict) -> str:
        return (
            f"rho {e['moments']['rho']:.3f}: the group baseline's variance is {e['trace_ratio']:.3f} ± "
            f"{e['trace_ratio_se']:.3f} of REINFORCE's, {e['below_one_z']:.1f} SE below 1 and {e['prediction_z']:+.1f} "
            f"SE from its prediction {e['moments']['predicted_ratio']:.3f}"
        )

    def at(n: int) -> str:
        x = a[f"b{n}"]
        return (
            f"{x['verdict']} at B = {n} (the walk verdicts' framing information {pm_z(x['information'])}, the bonus's "
            f"density {pm_z(x['density'])}, the walk arm minus GRPO {pm_z(x['walk_minus_grpo'])})"
        )

    mixed, recipe = p1["mixed"], p1["recipe"]
    return (
        f"Proposition 1, in a world of mixed difficulty: {p1_verdict(mixed)} ({world(mixed)}); in the recipe's own "
        f"world: {p1_verdict(recipe)} ({world(recipe)}). Proposition 2 (a), the signed expected gain towards Q* under "
        f"`scale_rewards: {s}` on {results['prompts']:,} prompts, is "
        + " and ".join(at(n) for n in results["batch_sizes"])
        + f". Proposition 2 (b), the log of GRPO's noise over signal over the walk arm's "
        f"({fmt_signed(b['log_ratio'], 3)}): {prop2b_words(results)}."
    )


def short_summary(results: dict) -> str:
    """The verdicts in one sentence, each with its qualifier (world, batch size, scaling, SE), for the README; the
    figures behind them are `summary`'s (docs/demo.md, the report)."""
    s = results["scaling"]
    a, p1 = results["prop2"]["a"][s], results["prop1"]
    mixed, recipe = p1["mixed"], p1["recipe"]
    sizes = results["batch_sizes"]
    verdicts = {a[f"b{n}"]["verdict"] for n in sizes}
    if len(verdicts) == 1:  # one verdict at every batch size: said once, for the README's word limit
        gains = (
            f"{verdicts.pop()} at "
            + " and ".join(f"B = {n}" for n in sizes)
            + " (framing information "
            + " and ".join(f"{a[f'b{n}']['information']['z']:+.1f} SE" for n in sizes)
            + ")"
        )
    else:
        gains = " and ".join(
            f"{a[f'b{n}']['verdict']} at B = {n} (framing information {a[f'b{n}']['information']['z']:+.1f} SE)"
            for n in sizes
        )
    return (
        f"Proposition 1, in a world of mixed difficulty: {p1_verdict(mixed)}; in the recipe's own world: "
        f"{recipe['verdict']}. Proposition 2 (a), under `scale_rewards: {s}` on {results['prompts']:,} prompts, is "
        f"{gains}. Proposition 2 (b) {prop2b_words(results)}."
    )


def plot_quality(path: Path, results: dict) -> None:
    """The quality sweep's signed gain minus GRPO's, with 2 SE bars, one panel per batch size, one curve per
    scaling."""
    from matplotlib.figure import Figure

    sizes = results["batch_sizes"]
    fig = Figure(figsize=(9.6, 3.8), dpi=100)
    axes = fig.subplots(1, len(sizes), squeeze=False)[0]
    for ax, n in zip(axes, sizes):
        for s, sweep in results["quality"].items():
            rows = [sweep["rows"][f"{q:.2f}"][f"b{n}"]["minus_grpo"] for q in QUALITIES]
            ax.errorbar(QUALITIES, [x["value"] for x in rows], yerr=[gs.SIGMAS * x["se"] for x in rows], marker="o",
                        markersize=3, capsize=3, label=f"scale_rewards: {s}")  # fmt: skip
        ax.axhline(0.0, linestyle="--", color="gray", linewidth=1)
        ax.set_title(f"B = {n} prompts: signed gain minus GRPO's", fontsize=9)
        ax.set_xlabel("verifier quality q (0: verdicts at random at the same rate)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("gain minus GRPO's (± 2 SE)")
    fig.suptitle("Walk verifier of quality q, E[z | valid] held fixed (pooled primary)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def plot_batch(path: Path, results: dict) -> None:
    """The signed expected gain of GRPO, the walk arm, its q = 0 arm and `C_zoom` against the batch size, from the
    pooled primary's point statistics (`gs.expected_gain`), at the recipe's scaling."""
    from matplotlib.figure import Figure

    s = results["scaling"]
    sizes = np.geomspace(1, 4 * RECIPE_PROMPTS, 200)
    fig = Figure(figsize=(6.4, 3.8), dpi=100)
    ax = fig.subplots()
    for name, label in ((REFERENCE, "grpo"), (WALK, "mapo_walk"), (Q0, "walk verdicts at random (q = 0)"),
                        ("C_zoom", "C_zoom")):  # fmt: skip
        stats = results["prop2"]["a"][s]["point"][name]
        ax.plot(sizes, [gs.expected_gain(stats, n) for n in sizes], label=label)
    for n in results["batch_sizes"]:
        ax.axvline(n, linestyle=":", color="gray", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("prompts a batch (B)")
    ax.set_ylabel("signed expected gain towards grad Q*")
    ax.set_title(f"Signed expected gain against the batch size (scale_rewards: {s}, point estimates)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def contrast_rows(results: dict) -> list[list]:
    rows = []
    for s, a in results["prop2"]["a"].items():
        for n in results["batch_sizes"]:
            for key, words in CONTRASTS.items():
                d = a[f"b{n}"][key]
                cross = a["crossing"].get(key)
                reading = f"Prop. 2 (a) {a[f'b{n}']['verdict']}" if key == "information" else significance(d)
                rows.append([f"`{s}`", n, words, pm(d), fmt(d["z"], 1), interval((d["lo"], d["hi"])),
                             "" if cross is None else crossing_words(cross), reading])  # fmt: skip
    return rows


def run_rows(results: dict, replications: list[dict]) -> list[list]:
    s = results["scaling"]
    sizes = results["batch_sizes"]
    pooled = {
        "checkpoint": results["checkpoint"], "seed": " + ".join(str(x) for x in results["seeds"]), "label": "pooled",
        "prompts": results["prompts"], "rollouts": results["rollouts"], "rate": results["rate"],
        "undefined_replicates": results["undefined_replicates"], "measurable": True, "prop2a": results["prop2"]["a"],
    }  # fmt: skip
    rows = []
    for x in [pooled, *results["runs"], *replications]:
        label = x.get("label") or (prompts_of(x) if "prompt_range" in x else "")
        if not x["measurable"]:
            rows.append([x["checkpoint"], x["seed"], label, x["rollouts"], f"{x['rate']:.1%}", x["undefined_replicates"],
                         *["not measurable"] * (2 * len(sizes) + 1)])  # fmt: skip
            continue
        a = x["prop2a"][s]
        rows.append([
            x["checkpoint"], x["seed"], label, x["rollouts"], f"{x['rate']:.1%}", x["undefined_replicates"],
            *[pm(a[f"b{n}"]["information"]) for n in sizes], *[pm(a[f"b{n}"]["density"]) for n in sizes],
            " / ".join(a[f"b{n}"]["verdict"] for n in sizes),
        ])  # fmt: skip
    return rows


def write_report(report: Path, results: dict, replications: list[dict], setup: dict) -> Path:
    """The report (`report`), its PNGs and results.json (in `report` without its suffix), from the analysis; refuses
    to write a headline with a number results.json does not hold (`headline_check`)."""
    folder = report.with_suffix("")
    shows = what_it_shows(results, replications, setup.get("gate"))
    record = results | {"replications": replications, "setup": setup}
    unbacked = unbacked_numbers("\n".join(shows), json.loads(json.dumps(record, default=str)))
    if unbacked:
        raise AssertionError(f"the headline states numbers results.json does not hold: {unbacked}")
    for stale in folder.glob("*.png"):
        stale.unlink()
    plot_quality(folder / "quality.png", results)
    plot_batch(folder / "gain_vs_batch.png", results)
    payload = json.dumps(record, indent=1, sort_keys=True, default=str)
    (folder / "results.json").write_text(payload + "\n", encoding="utf-8")
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    rel, scaling, sizes = folder.name, results["scaling"], results["batch_sizes"]
    p1 = results["prop1"]
    power = results["power"]
    chain_rows = [
        [f"`{k}`", STEPS[k], *[pm(v[x][f"b{n}"]) for x in DIRECTIONS for n in sizes]]
        for k, v in results["chain"].items()
    ]
    p1_rows = [
        [world, fmt(e["moments"]["rho"], 3), fmt(e["moments"]["mu"], 3), fmt(e["moments"]["predicted_ratio"], 3),
         f"{e['trace_ratio']:.3f} ± {e['trace_ratio_se']:.3f}", interval(e["trace_ratio_interval"], 3, signed=False),
         fmt(e["below_one_z"], 1), f"{fmt(e['prediction_z'], 1)} ({e['prediction']})",
         f"{e['per_rollout_ratio']:.3f} ± {e['per_rollout_ratio_se']:.3f}",
         sci(e["cross"]["grpo"]), sci(e["cross"][REINFORCE]), e["verdict"]]
        for world, e in p1.items()
    ]  # fmt: skip
    q_rows = [
        [f"{q:.2f}", *[f"{sci(r[f'b{n}']['gain'])} ± {sci(r[f'b{n}']['gain_se'])} ({pm(r[f'b{n}']['minus_grpo'])})"
                       for s in results["quality"] for n in sizes for r in [results["quality"][s]["rows"][f"{q:.2f}"]]]]
        for q in QUALITIES
    ]  # fmt: skip
    gate = setup.get("gate") or {}
    clip_rows = [
        [f"`{n}`", fmt(gate.get(ESTIMATORS[n]["semantic_score"], {}).get("walk_auc"), 2), fmt(c["z_valid"], 3),
         f"{c['z_minus_no_tool']:+.3f}", *[pm(c[f"b{b}"]["minus_grpo"]) for b in sizes]]
        for n, c in results["clip"].items()
    ]  # fmt: skip
    runs = results["runs"]
    b = results["prop2"]["b"]
    lines = [
        "# MAPO's gradient claims, measured on the trainer's own code",
        "",
        f"_Generated by `research/gradient_claims.py` on {setup['date']} from results `{digest}` "
        f'(`{rel}/results.json`); every section, "What it shows" included, is written from them, and every number of '
        '"What it shows" is checked against them: rerun it to regenerate._',
        "",
        *verdict_sections(CRITERIA, shows, setup["command"]),
        "",
        f"- Policies: the experiment world's SFT checkpoints under `{setup['start']}` (rounds of {setup['sft_steps']} "
        "steps of the tiny SFT recipe, each from the last, from the tiny Qwen2.5-VL; 768 px square images, region hints), "
        f"built once and cached, not timed below. Primary: `{results['checkpoint']}`.",
        f"- The pooled primary: {len(runs)} independent runs at `{results['checkpoint']}`, "
        + ", ".join(
            f"seed {r['seed']} on {prompts_of(r)} of the train split ({r['rollouts']:,} rollouts)" for r in runs
        )
        + f"; {results['rollouts']:,} rollouts in groups of {results['group']} ({results['prompts']:,} prompts), "
        f"{results['steps']:,} steps (assistant turns), sampled at the recipe's temperature through "
        "`MAPOTrainer._generate_and_score_completions` (TRL's tool loop, the real zoom-in tool), batches of "
        f"{results['batch_prompts']} prompts as the experiment's recipe trains. Each run's statistics are unbiased on "
        "their own; pooled by their prompts (`gs.pool`) they stay so, and the figures are formed from the pooled ones. "
        "Every arm is replayed on each run; `C_zoom`'s c and the q = 0 arm's rate are each run's own.",
        "- Score vectors: per step, the gradient of the trainer's loss term without its advantage (`loss_type: grpo`: "
        f"the mean over the rollout's trained tokens, tool responses masked), over all {setup['parameters']:,} trainable "
        "parameters; kept as their Gram matrix. A slow test checks them against autograd through the trainer's "
        "`compute_loss` with one-hot advantages.",
        "- References: grad E[Q*] and grad E[V] (V: well formed with a valid call) from unnormalised sequence scores "
        "(each rollout's score vectors times its trained-token count, so their mean is 0) with a leave-one-out baseline; "
        "the framing direction is grad Q* with grad E[V] projected out (coefficient "
        f"{results['projection']:.3f}, estimated from products of different prompts, pooled). The arms keep the "
        "trainer's own loss terms.",
        "- Noise: every squared norm and squared inner product is an unbiased U-statistic over different prompts "
        "(a prompt never pairs with itself or, in a bootstrap replicate, with its own repeat), so the reference's own "
        "noise inflates no denominator; the per-batch columns (batches with a gradient, cosines) are the experiment's "
        f"batches of {results['batch_prompts']}, each cosine against the reference on the other {results['folds'] - 1} "
        f"of {results['folds']} folds over the unbiased |grad J*|. Randomised controls are averaged over {PERMUTATIONS} "
        "draws through their mean products, which gives their expected figures exactly.",
        f"- B = {sizes[-1]}: arms marked (b) compute their advantages over the batch (HPO's normalisation, the centred "
        f"CLIP's centring); their figures at B = {sizes[-1]} keep the advantages of batches of {results['batch_prompts']}.",
        f"- Standard errors and intervals: {results['bootstrap']} stratified bootstrap replicates over prompts (within "
        "each run's folds) of the whole computation, the references included.",
        f"- Power: the first version's walk-minus-control difference was {power['first_version']['walk_minus_control']} "
        f"± {power['first_version']['se']} in batch cosine on {power['first_version']['prompts']} prompts; detecting it "
        f"with 80% power at the 2 SE bar needs {power['prompts_needed']:,} prompts, beyond any CPU budget. The pooled "
        f"primary takes {results['prompts']:,} (the score vectors of 640 prompts fill ~6 GB of memory, so each run "
        "is measured on its own) and states what it can detect.",
        f"- Time: {setup['minutes']:.1f} min wall on {setup['cores']} cores ("
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in setup["timings"].items())
        + f"), {setup['cpu_minutes']:.1f} min of CPU; the load average was {setup['load']:.1f} at the end"
        + (
            " (the machine was shared with other jobs, which inflates the wall time)."
            if setup["load"] > setup["cores"]
            else "."
        ),
        "- Recipe: `research/recipes/config_experiment.yaml`; each arm overrides only `advantage_estimator`, "
        f"`semantic_verifier`, `semantic_score`, `reward_funcs` (oracle) and `scale_rewards` (recipe: `{scaling}`).",
        "",
        "## Proposition 2 (a): information and density",
        "",
        "Signed expected gain towards grad Q* on the pooled primary, each contrast ± its paired SE, its size in SE, its "
        "percentile interval, and the batch size where its point estimate changes sign:",
        "",
        markdown_table(
            ["scaling", "B", "contrast", "value ± SE", "SE units", "interval", "changes sign", "reading"],
            contrast_rows(results),
        ),  # fmt: skip
        "",
        f"![gain against the batch size]({rel}/gain_vs_batch.png)",
        "",
        "## Runs",
        "",
        "The pooled primary, each of its runs alone, and the other checkpoints alone (recipe's scaling; undefined: "
        f"bootstrap replicates of {results['bootstrap']} without a measurable |grad J*|^2):",
        "",
        markdown_table(
            [
                "checkpoint",
                "seed",
                "prompts",
                "rollouts",
                "Q* rate",
                "undefined",
                *[f"information, B = {n}" for n in sizes],
                *[f"density, B = {n}" for n in sizes],
                "Prop. 2 (a), B = " + " / ".join(str(n) for n in sizes),
            ],
            run_rows(results, replications),
        ),  # fmt: skip
        "",
        "## Proposition 2 (b)",
        "",
        f"Noise over projected signal (one prompt; a batch of B divides it by B): `grpo` {fmt(b['grpo'], 1)}, "
        f"`mapo_walk` {fmt(b['walk'], 1)}; log ratio {fmt_signed(b['log_ratio'], 3)}, interval "
        f"{interval(b['interval'], 3)}. The constant bonuses, which say nothing of which crop framed the target: "
        + ", ".join(f"`{arm}` {fmt(v, 1)}" for arm, v in constant_noise(results).items())
        + ". It carries the information of Proposition 2 (a)'s walk - GRPO on a reciprocal "
        "scale (1 / gain less the squared cosine of E g with grad J*), where a replicate with no measurable signal sends "
        "it to infinity: an SE of the raw ratio measures those replicates, not the arms.",
        "",
        "## The walk arm, decomposed",
        "",
        f"Differences of signed expected gain at the recipe's scaling (`{scaling}`), each ± its paired SE; towards grad Q* "
        f"and towards the framing direction. c = {results['walk_rate']:.3f} (the walk arm's mean z on valid calls); "
        f"{results['zoom_share']:.0%} of valid calls are zooms (at most a quarter of the image).",
        "",
        markdown_table(
            ["step", "what it adds", *[f"towards {x}, B = {n}" for x in ("grad Q*", "framing") for n in sizes]],
            chain_rows,
        ),  # fmt: skip
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
        "A_i^2 |S_i|^2 and the rest (products of different rollouts, and the mean's), pooled over the runs:",
        "",
        markdown_table(
            [
                "world",
                "rho",
                "mu",
                "predicted ratio",
                "trace ratio ± SE",
                "interval",
                "below 1 (SE)",
                "from the prediction (SE)",
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
        f"rate, so E[z | valid] is the same at every q ({PERMUTATIONS} draws, shared by every q). Signed expected gain "
        "towards grad Q* ± SE, and (minus GRPO's ± SE); q = 1 minus q = 0 is the information contrast above:",
        "",
        markdown_table(["q", *[f"`{s}`, B = {n}" for s in results["quality"] for n in sizes]], q_rows),
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
                *[f"minus grpo's, B = {n}" for n in sizes],
            ],
            clip_rows,
        ),  # fmt: skip
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


def runs(args: argparse.Namespace) -> list[tuple[int, int, int, int]]:
    """(SFT round, seed, rollouts, first prompt) of every measurement: the primary checkpoint at each seed, each on
    the train split's prompts after the previous seed's (the first is the primary run, the others are pooled with
    it), then the other checkpoints at the first seed from prompt 0."""
    primary, *others = args.checkpoints
    first, *more = args.seeds
    out = [(primary, first, args.rollouts, 0)]
    for seed in more:
        _, _, rollouts, start = out[-1]
        out.append((primary, seed, args.pooled_rollouts, start + rollouts // args.group))
    out += [(c, first, args.replication_rollouts, 0) for c in others]
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    add("--rollouts", type=int, default=2560, help="rollouts of the primary measurement (groups of the recipe's G)")
    add(
        "--pooled_rollouts",
        type=int,
        default=1536,
        help="rollouts of each further seed at the primary checkpoint, on prompts no earlier run used (1536: the train "
        "split's last 384 prompts after the primary's 640)",
    )
    add("--replication_rollouts", type=int, default=1024, help="rollouts of every other checkpoint")
    add("--checkpoints", type=ints, default=[2, 1, 3, 4], help="SFT rounds measured, the primary first")
    add(
        "--seeds",
        type=ints,
        default=[0, 2],
        help="rollout seeds at the primary checkpoint, the primary first; the others are independent runs pooled with "
        "it (2: a seed the second version did not use)",
    )
    add("--group", type=int, default=4, help="the recipe's num_generations, to place each run's prompts")
    add("--folds", type=int, default=4, help="folds by prompt (at least 4: the unbiased squares need 4)")
    add("--bootstrap", type=int, default=200, help="bootstrap replicates over prompts")
    add("--start", type=Path, default=Path("outputs/claims"), help="the cached checkpoints, data and CLIP")
    add("--sft_steps", type=int, default=900, help="SFT steps of each round, when a checkpoint is built")
    add("--image_side", type=int, default=768)
    add("--gate_rows", type=int, default=64, help="held-out rows of the tiny CLIP's verifier gate (0: skip)")
    add("--report", type=Path, default=REPORT, help="the PNG and results.json go in <report>/")
    add("--reuse", action="store_true", help="reuse <start>/measurement-*.pt instead of measuring again")
    add(
        "--render", action="store_true", help="rewrite the report from its results.json alone (its words, not figures)"
    )
    args = parser.parse_args(argv)
    if args.folds < 4 or args.bootstrap < 2:
        parser.error("--folds needs at least 4 and --bootstrap at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.render:
        record = json.loads((args.report.with_suffix("") / "results.json").read_text(encoding="utf-8"))
        replications, setup = record.pop("replications"), record.pop("setup")
        print(f"report: {write_report(args.report, record, replications, setup)} (rewritten from its results.json)")
        return record
    prepare_start(args.start, args.sft_steps, max(args.checkpoints), args.image_side)
    started, cpu = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    measurements, timings = [], {}
    plan = runs(args)
    pooled = sum(1 for round_, *_ in plan if round_ == args.checkpoints[0])
    for i, (round_, seed, rollouts, first) in enumerate(plan):
        saved = args.start / f"measurement-round{round_}-seed{seed}-n{rollouts}-p{first}.pt"
        if args.reuse and saved.exists():
            measurements.append(load_measurement(saved))
        else:
            m, _ = measure(
                args, args.start, checkpoint_path(args.start, round_), rollouts, seed, replays=i < pooled,
                first_prompt=first,
            )  # fmt: skip
            save_measurement(m, saved)
            measurements.append(m)
        if measurements[-1]["group"] != args.group:
            raise ValueError(f"--group {args.group}: the recipe's num_generations is {measurements[-1]['group']}")
        for k, v in measurements[-1]["timings"].items():
            timings[k] = timings.get(k, 0.0) + v
    t = time.time()
    primary, others = measurements[:pooled], measurements[pooled:]
    check_independent(primary)
    results = analyse(primary, args.folds, args.bootstrap)
    replications = [analyse_replication(m, args.folds, args.bootstrap, results["batch_sizes"]) for m in others]
    timings["statistics"] = time.time() - t
    primary_path = checkpoint_path(args.start, args.checkpoints[0])
    gate = tiny_clip_gate(args.start, primary_path, args.gate_rows) if args.gate_rows else None
    used = resource.getrusage(resource.RUSAGE_SELF)
    setup = {
        "date": datetime.date.today().isoformat(),
        "command": command_line(argv),
        "start": str(args.start),
        "sft_steps": args.sft_steps,
        "parameters": primary[0]["parameters"],
        "timings": timings,
        "minutes": (time.time() - started) / 60,
        "cpu_minutes": (used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime) / 60,
        "load": os.getloadavg()[0],
        "cores": torch.get_num_threads(),
        "gate": gate,
    }
    report = write_report(args.report, results, replications, setup)
    print(f"report: {report} ({setup['minutes']:.1f} min wall, {setup['cpu_minutes']:.1f} min CPU)")
    return results


def check_independent(ms: Sequence[dict]) -> None:
    """Runs pooled as one sample must be independent draws: no train-split prompt measured twice."""
    seen: dict[int, int] = {}
    for m in ms:
        for row in m["prompt_rows"]:
            if row in seen:
                raise ValueError(f"prompt {row} is measured by the runs of seeds {seen[row]} and {m['seed']}: pooled "
                                 "runs need prompts no other run used")  # fmt: skip
            seen[row] = m["seed"]


def command_line(argv: Sequence[str]) -> str:
    """The command that measures anew what this run reports (`--reuse` only skipped the measuring)."""
    measuring = [a for a in argv if a != "--reuse"]
    return f'make experiment ARGS="{" ".join(measuring)}"' if measuring else "make experiment"


if __name__ == "__main__":
    main()
