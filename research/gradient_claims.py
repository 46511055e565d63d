"""`make experiment`: MAPO's gradient claims (Walk the Talk, section 4) measured on the trainer's own code, at one
fixed policy, on CPU.

RL on 2 cores cannot move the tiny policy (docs/experiment_curves.md), but section 4 argues about the policy-gradient
estimate at a fixed policy, not about training curves, and that can be measured here:

1. **A fixed policy where the question has an answer**: an SFT checkpoint of the experiment's world (region hint,
   768 px squares, the simulated reader of `research.rewards`) whose sampled rate of framing the target (Q*,
   `target_in_view_reward`: a well-formed rollout with a valid call whose crop frames the target) is reported; built
   once by the demo's stages and cached (`--start`).
2. **Rollouts and score vectors, once** (`collect`): groups of G through the trainer's own rollout path
   (`MAPOTrainer._generate_and_score_completions`: TRL's tool loop, the real zoom-in tool), and for every step
   (assistant turn) of every rollout the gradient of the trainer's loss term without its advantage
   (`utils.diagnostics.policy_gradient_loss` with the step's tokens as the advantage: the loss's own token mask and
   per-sequence normalisation). Only their Gram matrix is kept.
3. **Every estimator's advantages from the code that trains** (`replay`): for each estimator and each
   `scale_rewards`, a `MAPOTrainer` built as `rl.py` builds it replays the recorded rollouts (its `_generate` returns
   them and restores the environments' calls); its rewards, R_sem, TRL's advantages and HPO's per-token ones are
   its own. REINFORCE (A = r) takes the reader's column. The sweeps (reader noise, `semantic_beta`, a walk verifier
   of controlled quality) recombine the recorded reward columns with `mapo.mapo_advantages`, which this run first
   checks equal to every replayed MAPO trainer's advantages.
4. **Statistics** (`research.gradient_stats`): cross-fitted folds by prompt (each batch is scored against the
   gradient of Q* estimated with a leave-one-out baseline on the other folds), a stratified bootstrap over prompts of
   the whole pipeline for standard errors, verdicts stated before the numbers.

    make experiment                                   # start (cached), rollouts, replays, report: docs/experiment.md
    make experiment ARGS="--rollouts 256 --bootstrap 50"
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import set_seed

import rl
from data.benchmarks import load_saved_split
from evaluation.verifier_check import check_verifier
from hpo.steps import turn_index
from mapo import mapo_advantages, semantic_reward
from mapo_trainer import MAPOTrainer
from research import gradient_stats as gs
from research.report import markdown_table, verdict_sections
from research.rewards import READER_HIT_P, READER_MISS_P, reader_draw, reader_outcome, target_seen
from research.verifiers import WalkVerifier
from rewards.outcome import format_reward
from rewards.verifiers import Scene, build_verifier
from tiny import stages
from tools import ToolConfig, make_environment_factory
from utils.diagnostics import completion_logps, policy_gradient_loss, rollout_rows, trained_token_mask
from utils.models import load_processor, pixel_budget

RECIPE = "research/recipes/config_experiment.yaml"
# The estimators of the main table: the fields each sets on the recipe (whose verifier is the walk verifier, and
# whose reward is the 0.7 reader). `grpo` is what each is paired against; `oracle` is GRPO on Q* itself.
ESTIMATORS: dict[str, dict] = {
    "grpo": {"advantage_estimator": "grpo"},
    "mapo_walk": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact_walk"},
    "mapo_shuffled": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:shuffled_exact_walk"},
    "mapo_exact": {"advantage_estimator": "mapo", "semantic_verifier": "research.verifiers:exact"},
    "mapo_clip_cosine": {"advantage_estimator": "mapo", "semantic_verifier": "clip", "semantic_score": "cosine"},
    "mapo_clip_contrastive": {
        "advantage_estimator": "mapo",
        "semantic_verifier": "clip",
        "semantic_score": "contrastive",
    },
    "hpo": {"advantage_estimator": "hpo"},
    "mapo+hpo": {"advantage_estimator": "mapo+hpo", "semantic_verifier": "research.verifiers:exact_walk"},
    "oracle": {"advantage_estimator": "grpo", "reward_funcs": ["research.rewards:target_in_view_reward"]},
}
REINFORCE = "reinforce"  # A = r, the reader's outcome, no baseline: Proposition 1's comparison
REFERENCE = "grpo"
WALK, SHUFFLED = "mapo_walk", "mapo_shuffled"
# The sweeps (recipe's scale_rewards): the reader right with these probabilities when the target was framed
# (READER_MISS_P otherwise), these betas, these verifiers' R_sem columns, and a walk verifier right with probability q.
READERS = (1.0, 0.85, 0.7, 0.55)
BETAS = (0.0, 0.2, 0.4, 0.8)
SWEEP_VERIFIERS = ("mapo_walk", "mapo_shuffled", "mapo_exact", "mapo_clip_cosine", "mapo_clip_contrastive")
QUALITIES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
BATCH_ROLLOUTS = (8, 16, 32, 64, 128, 256)  # the cosine against batch size
CHECKPOINT_RATE = (0.10, 0.90)  # Q*'s sampled rate must lie here for the question to have an answer
REPLAY_TOLERANCE = 1e-5  # mapo_advantages against a replayed trainer's advantages (float32)


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
    reward columns of the last batch (`rewards`)."""

    replay: tuple | None = None
    rewards: torch.Tensor | None = None

    def _generate(self, prompts):
        generated, calls = self.replay
        for env, recorded in zip(self.environments, calls, strict=True):
            env.calls = list(recorded)
        return generated

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.rewards = rewards.detach().clone()
        return rewards


def parse_run(start: Path, kit: dict, name: str, **fields) -> tuple:
    """The recipe's parsed arguments from the start checkpoint, as `rl.py` parses them, with `fields` on top."""
    argv = stages.rl_argv(
        start / "sft",
        start / "data",
        start / "clip",
        start / "trainers" / name,
        1,
        recipe=RECIPE,
        hpo_text_encoder=kit["text_encoder"],
        **fields,
    )
    return stages.rl_args(argv)


def build(start: Path, kit: dict, name: str, trainer_cls: type[MAPOTrainer], **fields) -> MAPOTrainer:
    """`rl.build_trainer` on the recipe with `fields`, its model in training mode (what `train` would set)."""
    trainer = rl.build_trainer(*parse_run(start, kit, name, **fields), trainer_cls=trainer_cls)
    trainer.model.train()
    return trainer


# ------------------------------------------------------------------------------------------------- collection
@dataclass
class Rollouts:
    """What the recorded rollouts give every estimator: per step, its rollout; per rollout, its prompt, trained tokens,
    format, whether a call framed the target, the reader's draw and every call's walk verdict (None: failed call);
    and the Gram matrix of the step score vectors."""

    step_rollout: np.ndarray
    rollout_prompt: np.ndarray
    tokens: np.ndarray
    well_formed: np.ndarray
    seen: np.ndarray
    draws: np.ndarray
    walk: list[list[float | None]]
    gram: np.ndarray

    @property
    def step_prompt(self) -> np.ndarray:
        return self.rollout_prompt[self.step_rollout]


def batch_inputs(dataset, prompts: Sequence[int], group: int) -> list[dict]:
    """One generation batch: each prompt's row `group` times, consecutively (TRL's sampler's order)."""
    return [dataset[i] for i in prompts for _ in range(group)]


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
    parameters in float64."""
    stacked = torch.stack(vectors)
    gram = torch.zeros(len(vectors), len(vectors), dtype=torch.float64)
    for start in range(0, stacked.shape[1], chunk):
        block = stacked[:, start : start + chunk]
        gram += (block @ block.T).double()
    return gram.numpy()


def collect(trainer: RecordingTrainer, prompts: Sequence[int], batch_prompts: int, seed: int, log=print):
    """Draw the rollouts through `trainer`'s own path, batch by batch (each seeded by (`seed`, batch)), and keep
    what every estimator needs: the recorded batches (for `replay`), and `Rollouts`."""
    group = trainer.num_generations
    dataset = trainer.train_dataset
    batches, vectors, step_rollout, rollout_prompt, tokens = [], [], [], [], []
    well_formed, seen, draws, walk = [], [], [], []
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
    R_sem (the last column)."""

    advantages: np.ndarray
    outcome: np.ndarray
    semantic: np.ndarray
    scale_rewards: str
    semantic_weight: float


def replay(trainer: ReplayTrainer, batches: list[dict]) -> Replayed:
    """Every recorded batch through `trainer`'s `_generate_and_score_completions`."""
    advantages, outcome, semantic = [], [], []
    weights = trainer.reward_weights
    for batch in batches:
        trainer.replay = batch["replay"]
        out = trainer._generate_and_score_completions(batch["inputs"])
        advantages += step_advantages(out["advantages"], batch["turns"])
        rewards = trainer.rewards
        outcome += (rewards[:, :-1] * weights[:-1]).nansum(dim=1).tolist()
        semantic += rewards[:, -1].tolist()
    return Replayed(
        np.asarray(advantages),
        np.asarray(outcome),
        np.asarray(semantic),
        trainer.scale_rewards,
        float(weights[-1]),
    )


def measure(
    args: argparse.Namespace, start: Path, log=print, recording_cls: type[RecordingTrainer] = RecordingTrainer
) -> tuple[dict, list[dict]]:
    """The rollouts (`args.rollouts`, seeded by `args.seed`), their Gram matrix and every estimator's replay; and the
    recorded batches. `recording_cls` draws the rollouts (a test scripts its calls)."""
    kit = stages.tiny_kit()
    recorder = build(start, kit, "recording", recording_cls, **ESTIMATORS[REFERENCE])
    group, batch_prompts = (
        recorder.num_generations,
        recorder.args.per_device_train_batch_size // recorder.num_generations,
    )
    prompts = args.rollouts // group
    if prompts > len(recorder.train_dataset):
        raise ValueError(f"--rollouts {args.rollouts}: the train split has {len(recorder.train_dataset)} prompts")
    recipe_scaling = recorder.scale_rewards
    parameters = sum(p.numel() for p in recorder.model.parameters() if p.requires_grad)  # the score vectors' size
    timings = {}
    t = time.time()
    log(f"rollouts: {args.rollouts} in groups of {group}, {batch_prompts} prompts a batch")
    batches, rollouts = collect(recorder, range(prompts), batch_prompts, args.seed, log)
    timings["rollouts and score vectors"] = time.time() - t
    del recorder
    replays = {}
    t = time.time()
    for name, fields in ESTIMATORS.items():
        for scaling in dict.fromkeys((recipe_scaling, "none")):
            trainer = build(start, kit, f"{name}-{scaling}", ReplayTrainer, scale_rewards=scaling, **fields)
            replays[(name, scaling)] = replay(trainer, batches)
            log(f"  replayed {name} (scale_rewards {scaling}): {time.time() - t:.0f} s")
            del trainer
    timings["replays"] = time.time() - t
    measurement = {
        "rollouts": rollouts,
        "replays": replays,
        "group": group,
        "batch_prompts": batch_prompts,
        "recipe_scaling": recipe_scaling,
        "parameters": parameters,
        "recipe": {k: v for part in parse_run(start, kit, "recipe") for k, v in vars(part).items()},
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


def noisy_walk_semantic(walk: list[list[float | None]], quality: float, lam: float, empty: float, seed: int):
    """R_sem (eq. 2) of every rollout under a walk verifier right with probability `quality`: each scored call's
    verdict kept when its uniform draw is under `quality`, else flipped (one draw per call for every quality: common
    random numbers); failed calls score 0, as the trainer scores them."""
    rng = np.random.default_rng(seed)
    out = []
    for calls in walk:
        draws = rng.random(len(calls))
        z = [0.0 if v is None else (v if u < quality else 1.0 - v) for v, u in zip(calls, draws)]
        out.append(semantic_reward(z, lam, empty=empty))
    return np.asarray(out)


def episode_advantages(outcome, semantic, group: int, beta: float, scaling: str) -> np.ndarray:
    """`mapo.mapo_advantages` (eq. 3, TRL's normalisation) on per-rollout columns, as float32 like the trainer's."""
    t = torch.tensor
    return mapo_advantages(
        t(outcome, dtype=torch.float32), t(semantic, dtype=torch.float32), group, beta, scaling
    ).numpy()


def rollout_norms(gram: np.ndarray, step_rollout: np.ndarray, rollouts: int) -> np.ndarray:
    """Each rollout's squared score norm |sum_k s_ik|^2, from the steps' Gram matrix."""
    indicator = np.zeros((len(step_rollout), rollouts))
    indicator[np.arange(len(step_rollout)), step_rollout] = 1.0
    return ((gram @ indicator) * indicator).sum(axis=0)


def ratio(a: float, b: float) -> float:
    """a / b, NaN when b is 0."""
    return a / b if b else math.nan


def figures(products: gs.Products, draw: gs.Draw, batch_prompts: int, group: int) -> dict[str, float]:
    """One estimator on one draw: mean batch cosine with the gradient of Q*, variance trace, fold signal."""
    return {
        "cosine": float(gs.batch_cosines(products, draw, batch_prompts).mean()),
        "trace": gs.variance_trace(products.own, draw, batch_prompts, group),
        "signal": gs.fold_signal(products.own, draw, group),
    }


def analyse(m: dict, folds: int, bootstrap: int, seed: int, log=print) -> dict:
    """Every table, verdict and curve of the report from a measurement (`measure`)."""
    r, replays, group, bp = m["rollouts"], m["replays"], m["group"], m["batch_prompts"]
    recipe, scaling = m["recipe"], m["recipe_scaling"]
    prompts = len(r.rollout_prompt) // group
    steps_of = r.step_rollout
    q_star = r.well_formed * r.seen
    reader = replays[(REFERENCE, scaling)].outcome
    check_close(
        "Q* from the recorded calls against the oracle trainer's reward", replays[("oracle", scaling)].outcome, q_star
    )
    check_close(
        "the 0.7 reader recomputed against the trainer's",
        reader_outcome(r.well_formed, r.seen, r.draws, READER_HIT_P, READER_MISS_P),
        reader,
    )
    # mapo_advantages is what the sweeps use: it must give every replayed scalar estimator's advantages.
    for (name, scale), rep in replays.items():
        if "hpo" in name:
            continue
        ep = episode_advantages(rep.outcome, rep.semantic, group, rep.semantic_weight, scale)
        check_close(
            f"mapo_advantages against the {name} trainer (scale_rewards {scale})", ep[steps_of], rep.advantages
        )
    walk_sem = noisy_walk_semantic(r.walk, 1.0, recipe["semantic_lambda"], recipe["no_tool_semantic"], seed)
    check_close(
        "R_sem of the recorded walk verdicts against the walk trainer's", walk_sem, replays[(WALK, scaling)].semantic
    )

    ref_coef = gs.loo_advantages(q_star, group)[steps_of]
    step_prompt = r.step_prompt
    ref = gs.prompt_products(r.gram, step_prompt, ref_coef, ref_coef, prompts)

    def products(coef: np.ndarray) -> gs.Products:
        own = gs.prompt_products(r.gram, step_prompt, coef, coef, prompts)
        return gs.Products(own, gs.prompt_products(r.gram, step_prompt, coef, ref_coef, prompts), ref)

    fold_of = np.arange(prompts) * folds // prompts
    sample = gs.Draw.of(fold_of)
    main = {key: rep.advantages for key, rep in replays.items()}
    main[(REINFORCE, "none")] = reader[steps_of]
    main_products = {key: products(coef) for key, coef in main.items()}
    point = {key: figures(p, sample, bp, group) for key, p in main_products.items()}
    u = gs.batch_indicators(gs.batches_of(list(range(prompts)), bp), prompts)
    for key, p in main_products.items():  # batches whose gradient is zero: every advantage 0 (groups that tie)
        point[key]["zero_batches"] = float(np.mean(((u @ p.own) * u).sum(axis=1) <= 0))
    rng = np.random.default_rng(seed)
    reps = {key: {name: [] for name in ("cosine", "trace", "signal")} for key in main}
    ratio_reps = []
    for _ in range(bootstrap):
        draw = gs.Draw.of(fold_of, rng)
        for key, p in main_products.items():
            for name, value in figures(p, draw, bp, group).items():
                reps[key][name].append(value)
        ratio_reps.append(ratio(reps[(REFERENCE, "none")]["trace"][-1], reps[(REINFORCE, "none")]["trace"][-1]))
    reps = {key: {name: np.asarray(v) for name, v in figs.items()} for key, figs in reps.items()}

    def diff(key, figure, reference=(REFERENCE, scaling), sign=1.0) -> gs.Difference:
        d = gs.paired_difference(
            point[key][figure], point[reference][figure], reps[key][figure], reps[reference][figure]
        )
        return gs.Difference(sign * d.value, d.se)

    table = {}
    for key in main:
        entry = dict(point[key])
        entry["cosine_se"] = float(reps[key]["cosine"].std(ddof=1)) if bootstrap > 1 else math.nan
        entry["trace_se"] = float(reps[key]["trace"].std(ddof=1)) if bootstrap > 1 else math.nan
        reference = (REFERENCE, key[1])
        if key != reference and reference in point:
            d = diff(key, "cosine", reference)
            entry["cosine_diff"], entry["cosine_diff_se"] = d.value, d.se
        table[f"{key[0]}|{key[1]}"] = entry

    # Proposition 1: rewards, then gradients.
    moments = gs.reward_moments(reader, group)
    measured = ratio(point[(REFERENCE, "none")]["trace"], point[(REINFORCE, "none")]["trace"])
    ratio_se = float(np.std(ratio_reps, ddof=1)) if bootstrap > 1 else math.nan
    # Where the gradient ratio parts from the reward-level prediction: each rollout's own squared score norm n_i.
    # Weighting the prediction by n_i (no products between rollouts) isolates the norms' dependence on the reward.
    norms = rollout_norms(r.gram, steps_of, len(r.rollout_prompt))
    centred = gs.group_advantages(reader, group)
    success = reader > 0
    prop1 = {
        "moments": vars(moments) | {"predicted_ratio": moments.predicted_ratio},
        "norm_weighted_ratio": ratio(float((centred**2 * norms).sum()), float((reader**2 * norms).sum())),
        "norm_success": float(norms[success].mean()) if success.any() else math.nan,
        "norm_failure": float(norms[~success].mean()) if (~success).any() else math.nan,
        "ratio": measured,
        "ratio_se": ratio_se,
        "verdict": gs.better_verdict(gs.Difference(1.0 - measured, ratio_se)),
        "from_prediction_se": (measured - moments.predicted_ratio) / ratio_se if ratio_se > 0 else math.nan,
    }
    # Proposition 2: (a) cosine at the recipe's beta and scaling; (b) the variance under `none`.
    walk, shuffled = diff((WALK, scaling), "cosine"), diff((SHUFFLED, scaling), "cosine")
    var_gap = diff((WALK, "none"), "trace", (REFERENCE, "none"), sign=-1.0)
    prop2 = {
        "cosine": {"walk": vars(walk), "shuffled": vars(shuffled), "verdict": gs.prop2_cosine_verdict(walk, shuffled)},
        "variance": {"grpo_minus_walk": vars(var_gap), "verdict": gs.better_verdict(var_gap)},
    }
    rate = float(q_star.mean())
    if not CHECKPOINT_RATE[0] <= rate <= CHECKPOINT_RATE[1]:
        prop2["cosine"]["verdict"] = prop2["variance"]["verdict"] = gs.INCONCLUSIVE

    # The cosine against batch size, at the recipe's scaling.
    per_fold = prompts // folds
    sizes = [n for n in BATCH_ROLLOUTS if n // group <= per_fold and n % group == 0]
    by_size = {
        name: [float(gs.batch_cosines(main_products[(name, scaling)], sample, n // group).mean()) for n in sizes]
        for name in ESTIMATORS
    }

    # The sweeps, at the recipe's scaling: every advantage from mapo_advantages on the recorded columns.
    lam, empty = recipe["semantic_lambda"], recipe["no_tool_semantic"]
    semantic = {v: replays[(v, scaling)].semantic for v in SWEEP_VERIFIERS}
    semantic |= {f"walk_q{q:.2f}": noisy_walk_semantic(r.walk, q, lam, empty, seed) for q in QUALITIES[:-1]}
    semantic[f"walk_q{QUALITIES[-1]:.2f}"] = semantic[WALK]

    def sweep_cosine(outcome, sem, beta) -> float:
        coef = episode_advantages(outcome, sem, group, beta, scaling)[steps_of]
        return float(gs.batch_cosines(products(coef), sample, bp).mean())

    sweep = {}
    t = time.time()
    for p_hit in READERS:
        outcome = np.asarray(reader_outcome(r.well_formed, r.seen, r.draws, p_hit, READER_MISS_P))
        baseline = sweep_cosine(outcome, np.zeros_like(outcome), 0.0)
        row = {"grpo": baseline, "rate": float(outcome.mean())}
        for beta in BETAS[1:]:
            row[beta] = {v: sweep_cosine(outcome, sem, beta) for v, sem in semantic.items()}
            curve = [row[beta][f"walk_q{q:.2f}"] for q in QUALITIES]
            row[beta]["break_even"] = gs.break_even(QUALITIES, curve, baseline)
        sweep[p_hit] = row
    log(f"  sweeps: {time.time() - t:.0f} s")
    return {
        "rate": rate,
        "rollouts": len(r.rollout_prompt),
        "steps": len(steps_of),
        "prompts": prompts,
        "folds": folds,
        "bootstrap": bootstrap,
        "group": group,
        "batch_prompts": bp,
        "scaling": scaling,
        "table": table,
        "prop1": prop1,
        "prop2": prop2,
        "by_size": {"sizes": sizes, "cosine": by_size},
        "sweep": {str(k): {str(b): v for b, v in row.items()} for k, row in sweep.items()},
    }


# ------------------------------------------------------------------------------------------------- report
CRITERIA = f"""Stated before the numbers, in the code that judges them (`research.gradient_stats`). Every figure is
measured on the same rollouts for every estimator, so differences are paired; standard errors (SE) come from a
stratified bootstrap over prompts of the whole pipeline (the reference gradient included); a difference counts
when it exceeds {gs.SIGMAS:g} SE. Each verdict is three-valued: **holds**, **fails** (the opposite is measured), or
**inconclusive** (then the smallest difference the run could have detected, {gs.SIGMAS:g} SE, is given).

- **Proposition 1** (a group baseline removes the prompt-level part of the variance): the trace of the covariance of
  batch gradients under `grpo` with `scale_rewards: none` (A = r - r-bar) over that under REINFORCE (A = r) is below
  1 by more than {gs.SIGMAS:g} SE. Reported beside the prediction (1 - 1/G)(1 - rho) sigma^2 / (sigma^2 + mu^2),
  which holds when score vectors are independent of rewards; the reward-level identity
  E(r_i - r-bar)^2 = (1 - 1/G)(1 - rho) sigma^2 is checked on the sampled rewards.
- **Proposition 2 (a)** (what it is meant to buy: MAPO's batch gradient lies closer to the gradient of Q*): at the
  recipe's `semantic_beta` and `scale_rewards` and the 0.7 reader, the mean cosine of a batch's gradient with the
  gradient of Q* under `mapo_walk` beats `grpo`'s by more than {gs.SIGMAS:g} SE, and its shuffled control's
  (`mapo_shuffled`: the same z_t values permuted among the batch's valid calls) does not; fails if `mapo_walk`'s is below
  `grpo`'s by more than {gs.SIGMAS:g} SE.
  The control permutes z_t among valid calls, so a rollout without one still scores 0: it keeps the information
  "made a valid call", which Q* requires, and loses only which call framed the target.
- **Proposition 2 (b)** (the literal inequality): under `scale_rewards: none`, the variance trace of `mapo_walk`'s
  batch gradient is below `grpo`'s by more than {gs.SIGMAS:g} SE; fails if above by more than {gs.SIGMAS:g} SE.
- Every verdict is inconclusive when the checkpoint's sampled Q* rate lies outside {CHECKPOINT_RATE[0]:.2f} -
  {CHECKPOINT_RATE[1]:.2f}: then most groups of 4 tie and the question has no answer."""

NAMES = {
    "grpo": "GRPO on the 0.7 reader",
    "mapo_walk": "MAPO, walk verifier (z = 1 when the crop frames the target)",
    "mapo_shuffled": "MAPO, walk z_t shuffled within the batch (information control)",
    "mapo_exact": "MAPO, talk-and-walk verifier (the label must name the target too)",
    "mapo_clip_cosine": "MAPO, tiny CLIP, cosine",
    "mapo_clip_contrastive": "MAPO, tiny CLIP, contrastive",
    "hpo": "HPO",
    "mapo+hpo": "MAPO (walk) + HPO",
    "oracle": "GRPO on Q* itself",
    REINFORCE: "REINFORCE, A = r (reader), no baseline",
}


def fmt(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def sci(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3g}"


def estimator_table(results: dict, scaling: str) -> str:
    rows = []
    for key, entry in results["table"].items():
        name, scale = key.split("|")
        if scale != scaling and not (name == REINFORCE and scaling == "none"):
            continue
        diff = (
            f"{entry['cosine_diff']:+.4f} ± {entry['cosine_diff_se']:.4f}" if "cosine_diff" in entry else "(reference)"
        )
        noise = entry["trace"] / entry["signal"] if entry["signal"] > 0 else math.inf
        rows.append(
            [
                f"`{name}`",
                NAMES[name],
                f"{entry['cosine']:.4f} ± {entry['cosine_se']:.4f}",
                diff if name != REFERENCE else "(reference)",
                sci(entry["trace"]),
                sci(entry["signal"]),
                sci(noise),
                fmt(entry["zero_batches"], 2),
            ]
        )
    header = ["estimator", "what", "mean cosine ± SE", "minus grpo's ± SE", "variance trace", "signal", "trace / signal",
              "zero batches"]  # fmt: skip
    return markdown_table(header, rows)


def plot(
    path: Path, title: str, xlabel: str, curves: dict[str, tuple[list, list]], hlines: dict | None = None
) -> None:
    """One PNG of `curves` (label: (x, y)) with optional horizontal reference lines."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8), dpi=100)
    ax = fig.subplots()
    for label, (x, y) in curves.items():
        ax.plot(x, y, marker="o", markersize=3, label=label)
    for label, y in (hlines or {}).items():
        ax.axhline(y, linestyle="--", color="gray", linewidth=1)
        ax.text(ax.get_xlim()[0], y, f" {label}", fontsize=7, va="bottom", color="gray")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean cosine with the gradient of Q*")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def plots(results: dict, folder: Path, recipe_beta: float) -> dict[str, str]:
    """The report's PNGs: cosine against batch size, against the reader's noise, against beta, against q."""
    for stale in folder.glob("*.png"):
        stale.unlink()
    sweep = results["sweep"]
    readers = [float(p) for p in sweep]
    beta_key = str(recipe_beta)
    files = {}
    sizes = results["by_size"]["sizes"]
    plot(
        folder / "batch_size.png",
        "Cosine with the gradient of Q* against batch size",
        "rollouts per batch",
        {name: (sizes, values) for name, values in results["by_size"]["cosine"].items()},
    )
    files["batch_size"] = "batch_size.png"
    curves = {"grpo": (readers, [sweep[str(p)]["grpo"] for p in readers])}
    curves |= {v: (readers, [sweep[str(p)][beta_key][v] for p in readers]) for v in SWEEP_VERIFIERS}
    plot(
        folder / "reader.png",
        f"Against the reader's reliability (beta {recipe_beta})",
        "P(reader right | framed)",
        curves,
    )
    files["reader"] = "reader.png"
    reader = str(READER_HIT_P)
    betas = [0.0, *[float(b) for b in list(sweep[reader])[2:]]]
    curves = {
        v: (betas, [sweep[reader]["grpo"]] + [sweep[reader][str(b)][v] for b in betas[1:]]) for v in SWEEP_VERIFIERS
    }
    plot(folder / "beta.png", f"Against semantic_beta ({READER_HIT_P} reader)", "semantic_beta", curves)
    files["beta"] = "beta.png"
    curves = {
        f"reader {p}": (list(QUALITIES), [sweep[str(p)][beta_key][f"walk_q{q:.2f}"] for q in QUALITIES])
        for p in readers
    }
    plot(
        folder / "quality.png",
        f"A walk verifier right with probability q (beta {recipe_beta}); dashed: GRPO",
        "verifier quality q",
        curves,
        {f"grpo, reader {p}": sweep[str(p)]["grpo"] for p in readers},
    )
    files["quality"] = "quality.png"
    return files


def what_it_shows(results: dict, gate: dict | None) -> list[str]:
    p1, p2 = results["prop1"], results["prop2"]
    m = p1["moments"]
    rate = results["rate"]
    inside = CHECKPOINT_RATE[0] <= rate <= CHECKPOINT_RATE[1]
    walk, shuffled = p2["cosine"]["walk"], p2["cosine"]["shuffled"]
    var = p2["variance"]["grpo_minus_walk"]
    outside = "" if inside else " (inconclusive whatever the figures: the checkpoint's Q* rate is outside the range)"
    lines = [
        f"- The checkpoint frames the target (Q*) in {rate:.1%} of sampled rollouts: "
        + ("inside" if inside else "**outside**")
        + f" {CHECKPOINT_RATE[0]:.2f} - {CHECKPOINT_RATE[1]:.2f}.",
        f"- **Proposition 1 {p1['verdict']}** here: the group baseline's gradient variance is {p1['ratio']:.3f} ± "
        f"{p1['ratio_se']:.3f} of REINFORCE's (the verdict's bar: below 1 by {gs.SIGMAS:g} SE); the reward-level "
        f"prediction (1 - 1/G)(1 - rho) sigma^2 / (sigma^2 + mu^2) is {m['predicted_ratio']:.3f} (rho {m['rho']:.3f}, "
        f"mu {m['mu']:.3f}, sigma^2 {m['sigma2']:.3f}); the measurement lies {abs(p1['from_prediction_se']):.1f} SE "
        f"{'below' if p1['from_prediction_se'] < 0 else 'above'} it.",
        f"- **Proposition 2 (a) {p2['cosine']['verdict']}** here: `mapo_walk`'s batch gradient lies closer to the "
        f"gradient of Q* than `grpo`'s by {walk['value']:+.4f} ± {walk['se']:.4f} in cosine; the shuffled control "
        f"by {shuffled['value']:+.4f} ± {shuffled['se']:.4f}" + outside + control_reason(walk, shuffled) + ".",
        f"- **Proposition 2 (b) {p2['variance']['verdict']}** here: under `scale_rewards: none`, `grpo`'s variance "
        f"trace minus `mapo_walk`'s is {sci(var['value'])} ± {sci(var['se'])}" + outside + ".",
    ]
    table = results["table"]
    for name in ("mapo_clip_cosine", "mapo_clip_contrastive"):
        entry = table[f"{name}|{results['scaling']}"]
        d = gs.Difference(entry["cosine_diff"], entry["cosine_diff_se"])
        direction = {
            gs.HOLDS: "towards",
            gs.FAILS: "away from",
            gs.INCONCLUSIVE: "measurably neither towards nor away from",
        }
        lines.append(
            f"- The tiny CLIP's z_t (`{name}`) pushes the batch gradient {direction[gs.better_verdict(d)]} the gradient "
            f"of Q*, against `grpo`: {d.value:+.4f} ± {d.se:.4f} in cosine."
        )
    sweep = results["sweep"]
    beta = str(results.get("recipe_beta"))
    q_star = {p: sweep[p][beta]["break_even"] for p in sweep}
    lines.append(
        "- Break-even verifier quality q* (a walk verifier right with probability q beats GRPO's cosine above it), "
        f"at beta {beta}: " + ", ".join(f"reader {p}: {fmt_q(q)}" for p, q in q_star.items()) + "."
    )
    if gate:
        lines.append(
            "- The tiny CLIP's walk AUC (its z for a label on a crop that frames the label's target against a crop of "
            "the same image that does not): "
            + ", ".join(f"{score} {g['walk_auc']:.2f}" for score, g in gate.items())
            + "; for a symmetric binary verifier this AUC is q."
        )
    return lines


def control_reason(walk: dict, shuffled: dict) -> str:
    """Why (a) is inconclusive when the information control gains too."""
    if gs.Difference(**walk).above() and gs.Difference(**shuffled).above():
        return (
            "; the control gains too, so the walk verifier's gain is not shown to come from which call framed the "
            "target (the control keeps z_t's sizes and which rollouts made a valid call)"
        )
    return ""


def fmt_q(q: float) -> str:
    if math.isinf(q):
        return "never (above 1)"
    return f"<= {q:.2f} (a verifier at chance already does)" if q <= QUALITIES[0] else f"{q:.2f}"


def write_report(report: Path, results: dict, setup: dict) -> Path:
    """docs/experiment.md, its plots and `results.json` (in `docs/experiment/`), every section generated."""
    folder = report.with_suffix("")
    files = plots(results, folder, setup["recipe_beta"])
    payload = json.dumps(results | {"setup": setup}, indent=1, sort_keys=True, default=str)
    (folder / "results.json").write_text(payload + "\n", encoding="utf-8")
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    p1, sweep, scaling = results["prop1"], results["sweep"], results["scaling"]
    m = p1["moments"]
    beta = str(setup["recipe_beta"])
    rel = folder.name
    break_even = [
        [f"{p}", fmt(float(sweep[p]["rate"]), 3)] + [fmt_q(sweep[p][b]["break_even"]) for b in list(sweep[p])[2:]]
        for p in sweep
    ]
    sweep_rows = [
        [f"{p}", fmt(sweep[p]["grpo"], 4)] + [fmt(sweep[p][beta][v], 4) for v in SWEEP_VERIFIERS] for p in sweep
    ]
    size_rows = [[f"`{name}`", *[fmt(v, 4) for v in values]] for name, values in results["by_size"]["cosine"].items()]
    lines = [
        "# MAPO's gradient claims, measured on the trainer's own code",
        "",
        f"_Generated by `research/gradient_claims.py` on {setup['date']} from results `{digest}` "
        f'(`{rel}/results.json`); every section, "What it shows" included, is written from them: rerun it to '
        "regenerate._",
        "",
        *verdict_sections(
            CRITERIA,
            what_it_shows(results | {"recipe_beta": setup["recipe_beta"]}, setup.get("gate")),
            setup["command"],
        ),
        "",
        f"- Policy: `{setup['start']}/sft`, the experiment world's SFT ({setup['sft_steps']} steps, each from the last, from the tiny "
        "Qwen2.5-VL, 768 px square images, region hints), built once and cached; not timed below.",
        f"- Rollouts: {results['rollouts']} in groups of {results['group']} ({results['prompts']} training prompts), "
        f"{results['steps']} steps (assistant turns), sampled at the recipe's temperature through "
        "`MAPOTrainer._generate_and_score_completions` (TRL's tool loop, the real zoom-in tool), batches of "
        f"{results['batch_prompts']} prompts as the recipe trains.",
        "- Score vectors: per step, the gradient of the trainer's loss term without its advantage (`loss_type: grpo`: "
        "the mean over the rollout's trained tokens, tool responses masked), over all "
        f"{setup['parameters']:,} trainable parameters; kept as their Gram matrix.",
        f"- Reference: the gradient of Q* (`target_in_view_reward`: a well-formed rollout with a valid call whose crop "
        "frames the target, so it is gated on a valid call), estimated with a leave-one-out baseline and no std "
        f"division on the other {results['folds'] - 1} of {results['folds']} folds of prompts (cross-fitting).",
        f"- Standard errors: {results['bootstrap']} stratified bootstrap replicates over prompts (within folds) of the "
        "whole computation, the reference included.",
        f"- Wall time of the measurement: {setup['minutes']:.1f} min on {setup['cores']} cores ("
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in setup["timings"].items())
        + ").",
        "- Recipe: `research/recipes/config_experiment.yaml`; each estimator overrides only `advantage_estimator`, "
        f"`semantic_verifier`, `semantic_score`, `reward_funcs` (oracle) and `scale_rewards` (recipe: `{scaling}`).",
        "",
        "The cosine of a batch's gradient with the gradient of Q* predicts the progress of a normalised SGD step on "
        "E[Q*] (step along g / |g|), and only roughly Adam's, whose per-coordinate scaling turns the direction. A batch "
        "whose advantages are all 0 (both groups tie) has no gradient and counts as cosine 0: no progress.",
        "",
        f"## Every estimator, `scale_rewards: {scaling}` (the recipe's)",
        "",
        estimator_table(results, scaling),
        "",
        "## Every estimator, `scale_rewards: none` (A = r - mean of the group)",
        "",
        "Variances are compared here only: dividing by the group's std revives groups whose outcomes tie and changes "
        "the scale by construction. Signal: the inner product of two disjoint folds' mean gradients (unbiased for "
        "|E g|^2, where the squared norm of one mean is biased upwards by the noise).",
        "",
        estimator_table(results, "none"),
        "",
        "## Proposition 1",
        "",
        f"Rewards (the 0.7 reader, {results['rollouts']} rollouts): mu {m['mu']:.4f}, sigma^2 {m['sigma2']:.4f}, "
        f"intra-group correlation rho {m['rho']:.4f}; E(r_i - r-bar)^2 = {m['lhs']:.6f} and (1 - 1/G)(1 - rho) "
        f"sigma^2 = {m['rhs']:.6f} (with plug-in moments the identity is exact: this checks the formula).",
        "",
        f"Gradients: the variance trace under the group baseline over REINFORCE's is **{p1['ratio']:.3f} ± "
        f"{p1['ratio_se']:.3f}**; predicted {m['predicted_ratio']:.3f} if score vectors were independent of "
        f"rewards. They part by {abs(p1['from_prediction_se']):.1f} SE: " + prop1_gap(p1),
        "",
        "## Cosine against batch size",
        "",
        f"![cosine against batch size]({rel}/{files['batch_size']})",
        "",
        markdown_table(["estimator", *map(str, results["by_size"]["sizes"])], size_rows),
        "",
        f"## Where the semantic signal acts (beta {beta}, `scale_rewards: {scaling}`)",
        "",
        "The same rollouts read by a reader right with probability p when the target was framed (0.1 otherwise: the "
        "same uniform draws, so the readers are coupled), every advantage from `mapo.mapo_advantages` on the recorded "
        "columns (checked equal to every replayed trainer's first).",
        "",
        f"![against the reader]({rel}/{files['reader']}) ![against beta]({rel}/{files['beta']})",
        "",
        markdown_table(["reader p", "grpo", *SWEEP_VERIFIERS], sweep_rows),
        "",
        "A walk verifier of controlled quality (its verdict right with probability q, one draw per call shared by "
        "every q) gives the break-even q* above which MAPO's gradient lies closer to Q*'s than GRPO's:",
        "",
        f"![against q]({rel}/{files['quality']})",
        "",
        markdown_table(
            ["reader p", "Q-rate of the reader", *[f"q* at beta {b}" for b in list(sweep[next(iter(sweep))])[2:]]],
            break_even,
        ),
        "",
        *gate_section(setup.get("gate")),
        "## What carries over to a real CLIP",
        "",
        "A real CLIP gives a continuous z_t with a narrow cosine band, and a real benchmark's outcome noise is unknown; "
        "so q* does not transfer as a number. What does: the measurement itself (a verifier's walk AUC on a converted "
        "cold-start set, `python -m evaluation.verifier_check`), and the shape of the sweep: the noisier the outcome, "
        "the lower the verifier quality MAPO needs to help; a verifier below q* pushes the gradient away from Q*.",
        "",
        "## The learning-curve route",
        "",
        "`make experiment-curves` (`research/experiment.py`, report `docs/experiment_curves.md`) trains the arms with "
        "RL and compares greedy target-seen. Its last verdict: "
        + " ".join(setup.get("curves_verdict") or ["(no report)"]),
        "",
    ]
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def prop1_gap(p1: dict) -> str:
    """Where the measured ratio parts from the prediction, from the measured score norms."""
    head = (
        "within the bootstrap's error."
        if math.isnan(p1["from_prediction_se"]) or abs(p1["from_prediction_se"]) <= gs.SIGMAS
        else "more than the bootstrap's error."
    )
    return (
        f"{head} The prediction assumes score vectors independent of rewards. Measured: a rollout's squared score norm "
        f"is {sci(p1['norm_success'])} on average where the reader paid and {sci(p1['norm_failure'])} where it did "
        f"not; weighting each rollout by its own norm (no products between rollouts) predicts "
        f"{fmt(p1['norm_weighted_ratio'])}; the rest of the gap is the products between rollouts (rollouts of one "
        "prompt share its gradient directions, which the group baseline's zero-sum advantages partly cancel)."
    )


def gate_section(gate: dict | None) -> list[str]:
    if not gate:
        return []
    rows = [[score, fmt(g["auc"], 3), fmt(g["walk_auc"], 3), g.get("walk_rows", "")] for score, g in gate.items()]
    return [
        "## The verifier gate's walk axis",
        "",
        "`evaluation.verifier_check` on the held-out rows' gold crops: the talk AUC (the right label against other "
        "labels on a crop) and the walk AUC (a label on a crop that frames its target against a crop of the same "
        "image that does not; for a symmetric binary verifier right with probability q it equals q). The tiny CLIP's "
        "walk AUC sits beside the break-even q* above.",
        "",
        markdown_table(["tiny CLIP, semantic_score", "talk AUC", "walk AUC", "rows"], rows),
        "",
    ]


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


def prepare_start(start: Path, sft_steps: int, rounds: int, image_side: int, log=print) -> None:
    """The fixed policy, built once by the demo's stages in the experiment's world and cached in `start`: the tiny
    CLIP verifier, the data (square images of `image_side`), and the SFT checkpoint: `rounds` runs of the tiny SFT
    recipe of `sft_steps` each, each from the last (`sft-round<i>`, the last `sft`). One round of 900 frames the
    target in 5% of sampled rollouts; two in 14% (docs/experiment.md)."""
    kit = stages.tiny_kit()
    if not (start / "clip" / "open_clip_config.json").exists():
        log("the CLIP verifier")
        stages.train_verifier(start / "clip", kit, 300)
    if not (start / "data" / "dataset_dict.json").exists():
        log("the data")
        stages.make_data(start / "data", 1024, 128, min_size=image_side, max_size=image_side)
    previous = kit["policy"]
    for i in range(1, rounds + 1):
        out = start / ("sft" if i == rounds else f"sft-round{i}")
        if not (out / "config.json").exists():
            log(f"SFT round {i} of {rounds} ({sft_steps} steps)")
            stages.run_sft(previous, start / "data", out, sft_steps)
        previous = out


def tiny_clip_gate(start: Path, rows: int) -> dict[str, dict]:
    """The verifier gate (talk and walk axes) of the start's tiny CLIP on the first `rows` test rows."""
    budget = pixel_budget(load_processor(start / "sft"))
    tool = ToolConfig(clip_model=str(start / "clip")).resolved(budget)
    test = load_saved_split(str(start / "data"), "test").select(range(rows))
    make_env = make_environment_factory(tool, budget)
    gate = check_verifier(
        build_verifier("clip", tool), list(test), make_env, semantic_scores=("cosine", "contrastive")
    )
    return {score: result.as_dict() for score, result in gate.items()}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--rollouts", type=int, default=1024, help="rollouts drawn at the fixed policy (groups of the recipe's G)")
    add("--folds", type=int, default=4, help="folds by prompt (cross-fitting of the reference)")
    add("--bootstrap", type=int, default=200, help="bootstrap replicates over prompts")
    add("--seed", type=int, default=0)
    add("--start", type=Path, default=Path("outputs/claims"), help="the cached checkpoint, data and CLIP")
    add("--sft_steps", type=int, default=900, help="SFT steps of each round, when the checkpoint is built")
    add("--sft_rounds", type=int, default=2, help="SFT rounds, each from the last (the tiny recipe's schedule each)")
    add("--image_side", type=int, default=768)
    add("--gate_rows", type=int, default=64, help="held-out rows of the tiny CLIP's verifier gate (0: skip)")
    add("--report", type=Path, default=Path("docs/experiment.md"), help="plots and results.json in <report>/")
    add("--curves_report", type=Path, default=Path("docs/experiment_curves.md"))
    add("--reuse", action="store_true", help="reuse <start>/measurement.pt instead of measuring again")
    args = parser.parse_args(argv)
    if args.folds < 2 or args.bootstrap < 2:
        parser.error("--folds and --bootstrap need at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.time()
    prepare_start(args.start, args.sft_steps, args.sft_rounds, args.image_side)
    saved = args.start / "measurement.pt"
    if args.reuse and saved.exists():
        measurement = load_measurement(saved)
    else:
        measurement, _ = measure(args, args.start)
        save_measurement(measurement, saved)
    t = time.time()
    results = analyse(measurement, args.folds, args.bootstrap, args.seed)
    measurement["timings"]["statistics"] = time.time() - t
    gate = tiny_clip_gate(args.start, args.gate_rows) if args.gate_rows else None
    recipe = measurement["recipe"]
    setup = {
        "date": datetime.date.today().isoformat(),
        "command": command_line(argv),
        "start": str(args.start),
        "sft_steps": f"{args.sft_rounds} rounds of {args.sft_steps}",
        "recipe_beta": recipe["semantic_beta"],
        "parameters": measurement["parameters"],
        "timings": measurement["timings"],
        "minutes": sum(measurement["timings"].values()) / 60,
        "cores": torch.get_num_threads(),
        "gate": gate,
        "curves_verdict": stages.experiment_verdict(args.curves_report) if args.curves_report.exists() else None,
    }
    report = write_report(args.report, results, setup)
    print(f"report: {report} ({(time.time() - started) / 60:.1f} min in all)")
    return results


def command_line(argv: Sequence[str]) -> str:
    """The command that measures anew what this run reports (`--reuse` only skipped the measuring)."""
    measuring = [a for a in argv if a != "--reuse"]
    return f'make experiment ARGS="{" ".join(measuring)}"' if measuring else "make experiment"


if __name__ == "__main__":
    main()
