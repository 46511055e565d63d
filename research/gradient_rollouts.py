"""The rollouts `make experiment` (`research.gradient_claims`) measures, and every estimator's replay of them: a
trainer that records each generation batch and one that replays it, the step score vectors kept as their Gram matrix
(`collect`), and each step's advantage as the replayed trainer computed it (`replay`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import set_seed

from hpo.steps import turn_index
from mapo import scale_similarity
from mapo_trainer import MAPOTrainer
from research import gradient_stats as gs
from research.rewards import is_zoom, reader_draw, target_seen
from research.verifiers import WalkVerifier
from rewards.outcome import format_reward
from rewards.verifiers import Scene
from utils.diagnostics import completion_logps, policy_gradient_loss, rollout_rows, trained_token_mask


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
