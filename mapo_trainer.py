"""MAPO: Multimodal Agentic Policy Optimization (Walk the Talk, section 3), as a TRL `GRPOTrainer` subclass.

The algorithm, for a prompt with G rollouts:
1. "Talk": every zoom-in call t of a rollout carries a label y_t naming what the model expects to see.
2. "Walk": a frozen CLIP scores the label against the crop I_t the call really returned,
   z_t = cos(CLIP_text(y_t), CLIP_image(I_t))                                                          (eq. 1)
3. The T calls of a rollout form a discounted semantic score
   R_sem = (1/T) * sum_{t=1..T} lambda^(T-t) * z_t                                                    (eq. 2)
4. The composite R_out + beta * R_sem is normalised within each group of G rollouts into the advantage, and the
   policy takes TRL's clipped surrogate step on it                                                     (eq. 3)

How this differs from the paper and from textbook GRPO:
- Step 4 is exactly GRPO's `sum_then_normalize` over the reward columns [outcome rewards..., R_sem] with weights
  [w..., beta]. So the trainer adds R_sem as one more reward column, weighted beta, and TRL computes the advantage:
  there is no second advantage code path to drift from GRPO (`mapo_advantages` states the same computation on its own,
  and the tests check the trainer against it). With `advantage_estimator="grpo"` the column is weighted 0: R_sem is
  still measured and logged, as in the paper's GRPO baseline curves, but does not move the policy.
- The paper leaves R_sem for a rollout without tool calls (T = 0) and the scale of z_t open; both are fields of
  `MAPOConfig` (`no_tool_semantic`, default 0.0; `semantic_score`, default the raw cosine).
- A call whose label or box was rejected, or that TRL could not run (e.g. label missing), returned no crop to score:
  it counts as z_t = 0 and stays in T, so a rollout cannot raise R_sem by dropping its label. So does a label CLIP
  cannot score or a NaN similarity (counted in `semantic/unscorable_frac`, warned once).
- Calls whose response TRL dropped for overflowing `max_completion_length` are not in the trained completion and are
  not scored (`tools.executed_calls`).

Hooks overridden: `_calculate_rewards` only, to log the group-level metrics that need the rewards gathered across
processes. Rollouts are TRL's own multi-turn tool loop (`environment_factory=ZoomInEnv`), and tool-response tokens stay
out of the loss through TRL's `tool_mask`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from PIL import Image
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from agent import check_token_budget
from models import load_clip, pixel_budget
from resume import ExactResume
from tools import ToolConfig, ToolConfigRecorder, executed_calls, make_environment_factory

SEMANTIC_REWARD_NAME = "semantic"
SEMANTIC_SCORES = ("cosine", "clipscore")
ADVANTAGE_ESTIMATORS = ("grpo", "mapo")


# ------------------------------------------------------------------------------------------------ pure functions
def semantic_reward(scores: Sequence[float], lam: float, empty: float = 0.0) -> float:
    """R_sem of one rollout, eq. 2: (1/T) * sum_{t=1..T} lam^(T-t) * z_t.

    Later calls weigh more (the last one has weight 1), and the 1/T factor discounts long trajectories. A NaN score
    counts as 0 (an unscorable call earns nothing). `empty` is returned when there are no calls (T = 0).
    """
    T = len(scores)
    if T == 0:
        return float(empty)
    return sum(lam ** (T - t) * (0.0 if math.isnan(z) else z) for t, z in enumerate(scores, start=1)) / T


def mapo_advantages(
    outcome: torch.Tensor,
    semantic: torch.Tensor,
    num_generations: int,
    beta: float,
    scale_rewards: str = "group",
) -> torch.Tensor:
    """MAPO's group-normalised advantage (eq. 3) of the composite R_out + beta * R_sem.

    Rows are ordered group by group (G = `num_generations` consecutive rows per prompt), as TRL orders them.
    Normalisation follows TRL's GRPO exactly, so that beta = 0 gives GRPO's advantages bit for bit: minus the group
    mean, then divided by (group std + 1e-4) for "group", by (batch std + 1e-4) for "batch", by nothing for "none".
    NaN rows (unscorable outcome) are left out of the statistics and get advantage 0.
    """
    rewards = outcome + beta * semantic
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations) if num_generations > 1 else None
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else None
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none'; got {scale_rewards!r}")
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / ((std if std is not None else torch.zeros_like(rewards)) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def scale_similarity(cosine: torch.Tensor, how: str) -> torch.Tensor:
    """z_t from a CLIP cosine: "cosine" keeps it (in [-1, 1]); "clipscore" is 2.5 * max(cos, 0) (Hessel et al., 2021),
    which stretches CLIP's narrow cosine band (about 0.15-0.35 for real CLIP) towards [0, 1] and ignores negatives."""
    if how == "cosine":
        return cosine
    if how == "clipscore":
        return 2.5 * cosine.clamp(min=0)
    raise ValueError(f"semantic_score must be one of {SEMANTIC_SCORES}; got {how!r}")


# ---------------------------------------------------------------------------------------------------- config
@dataclass
class MAPOConfig(GRPOConfig):
    """`GRPOConfig` plus the MAPO fields. Every GRPO field keeps its meaning."""

    advantage_estimator: str = field(
        default="mapo",
        metadata={
            "help": "How advantages are formed. 'mapo': group-normalised R_out + semantic_beta * R_sem (eq. 3). "
            "'grpo': outcome rewards only; R_sem is still computed and logged, with weight 0.",
            "choices": list(ADVANTAGE_ESTIMATORS),
        },
    )
    semantic_beta: float = field(
        default=0.4, metadata={"help": "beta, the weight of R_sem in the composite reward (paper: 0.4)."}
    )
    semantic_lambda: float = field(
        default=0.95,
        metadata={"help": "lambda, the trajectory discount in R_sem = (1/T) sum_t lambda^(T-t) z_t (paper: 0.95)."},
    )
    semantic_score: str = field(
        default="cosine",
        metadata={
            "help": "Scale of z_t (the paper does not say). 'cosine': the raw CLIP cosine of L2-normalised "
            "embeddings, in [-1, 1]. 'clipscore': 2.5 * max(cosine, 0) (Hessel et al., 2021).",
            "choices": list(SEMANTIC_SCORES),
        },
    )
    no_tool_semantic: float = field(
        default=0.0,
        metadata={
            "help": "R_sem of a rollout that made no zoom-in call (T = 0; the paper does not say). 0.0 makes "
            "'no call' score like a call whose crop is unrelated to its label under the raw cosine."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}; got {self.advantage_estimator!r}"
            )
        if self.semantic_score not in SEMANTIC_SCORES:
            raise ValueError(f"semantic_score must be one of {SEMANTIC_SCORES}; got {self.semantic_score!r}")
        if self.advantage_estimator == "mapo" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "advantage_estimator='mapo' normalises the composite R_out + beta * R_sem (eq. 3), which is "
                "multi_objective_aggregation='sum_then_normalize'; got "
                f"{self.multi_objective_aggregation!r}."
            )


# -------------------------------------------------------------------------------------------------- verifier
class ClipVerifier:
    """Frozen open_clip model scoring (label, crop) pairs: z_t = cosine of the L2-normalised embeddings.

    It lives beside the policy, not inside it: never wrapped by DeepSpeed/accelerate, no gradients, eval mode,
    half precision on GPU. `similarity` scores a whole generation batch in one call. Built from a `ToolConfig`, so
    training and evaluation score with the same model and the same preprocessing: by default each crop is letterboxed
    to CLIP's square input (`clip_resize: pad`), since open_clip's default centre crop would score only the middle
    square of an elongated crop.
    """

    def __init__(self, config: ToolConfig, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        # Building the model draws its random init from the global RNG; fork it so adding the verifier does not
        # change the policy's sampling (MAPO with beta = 0 must reproduce GRPO on the same seed).
        with torch.random.fork_rng(devices=[]):
            self.model, self.preprocess, self.tokenizer = load_clip(
                config.clip_model, config.clip_pretrained, resize=config.clip_resize
            )
        self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)

    @torch.no_grad()
    def similarity(self, labels: Sequence[str], images: Sequence[Image.Image]) -> torch.Tensor:
        """Cosine similarity of each label with its image, shape (N,), float32 on CPU."""
        if not labels:
            return torch.zeros(0)
        pixels = torch.stack([self.preprocess(image) for image in images]).to(self.device, self.dtype)
        tokens = self.tokenizer(list(labels)).to(self.device)
        image_emb = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
        text_emb = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return (image_emb * text_emb).sum(dim=-1).cpu()


# --------------------------------------------------------------------------------------------------- trainer
class MAPOTrainer(ExactResume, GRPOTrainer):
    """GRPO with MAPO's semantic reward (see the module docstring for the method and its deviations).

    Builds its own `environment_factory` (`tools.ZoomInEnv`, which records every zoom-in call) and CLIP verifier from
    `tool_config`, the settings evaluation must replay; every checkpoint it saves records them (`tool_config.json`).
    Overrides one hook, `_calculate_rewards`: it marks R_sem unscorable where the outcome is, and logs group-level
    metrics. R_sem enters as one more reward column, weighted `semantic_beta` ('mapo') or 0 ('grpo'). `ExactResume`
    mends two resume bugs of transformers/TRL (`resume.py`).
    """

    _tag_names = ["trl", "grpo", "mapo"]

    def __init__(self, *args, processing_class, tool_config: ToolConfig | None = None, **kwargs):
        if "environment_factory" in kwargs or "tools" in kwargs:
            raise ValueError("MAPOTrainer builds its zoom-in environment from `tool_config`; pass that instead.")
        tool_config = tool_config or ToolConfig()
        budget = pixel_budget(processing_class)
        for name in ("min_pixels", "max_pixels"):
            wanted = getattr(tool_config, name)
            if wanted is not None and wanted != getattr(budget, name):
                raise ValueError(
                    f"tool_config.{name}={wanted} but the processor resizes images with {name}="
                    f"{getattr(budget, name)}: load it with models.load_processor(..., {name}={wanted})."
                )
        super().__init__(
            *args,
            processing_class=processing_class,
            environment_factory=make_environment_factory(tool_config, budget),
            **kwargs,
        )
        self.tool_config = tool_config.resolved(budget)
        self.add_callback(
            ToolConfigRecorder(
                self.tool_config.as_record(),
                max_completion_length=self.args.max_completion_length,
                max_tool_calling_iterations=self.args.max_tool_calling_iterations,
            )
        )
        check_token_budget(
            processing_class,
            self.tool_config,
            max_completion_length=self.args.max_completion_length,
            max_tool_calling_iterations=self.args.max_tool_calling_iterations,
            context_length=self.model.config.get_text_config().max_position_embeddings,
        )
        self.verifier = ClipVerifier(self.tool_config, device=self.accelerator.device)
        self._warned_unscorable = False
        weight = self.args.semantic_beta if self.args.advantage_estimator == "mapo" else 0.0
        self.reward_funcs.append(self._semantic_reward)
        self.reward_func_names.append(SEMANTIC_REWARD_NAME)
        self.reward_processing_classes.append(None)
        self.reward_weights = torch.cat([self.reward_weights, torch.tensor([weight], dtype=self.reward_weights.dtype)])

    def _semantic_reward(self, completions, environments, log_metric, log_extra, **kwargs) -> list[float]:
        """R_sem (eq. 2) for this process's rollouts, with every crop of the batch scored in one CLIP call."""
        args = self.args
        calls = [executed_calls(env, completion) for env, completion in zip(environments, completions)]
        scored = [call for rollout in calls for call in rollout if call.ok]
        cosine = self._score([c.label for c in scored], [c.crop for c in scored])
        unscorable = torch.isnan(cosine)
        z = scale_similarity(torch.nan_to_num(cosine, nan=0.0), args.semantic_score).tolist()
        z_of = {id(call): value for call, value in zip(scored, z)}

        scores = [[z_of.get(id(call), 0.0) for call in rollout] for rollout in calls]
        rewards = [semantic_reward(s, args.semantic_lambda, empty=args.no_tool_semantic) for s in scores]

        for rollout in calls:
            log_metric("tools/zoom_calls_per_rollout", float(len(rollout)))
            for call in rollout:
                log_metric("tools/zoom_error_rate", float(not call.ok))
                if call.label is not None:
                    log_metric("semantic/label_words", float(len(call.label.split())))
        for value, bad in zip(z, unscorable.tolist()):
            log_metric("semantic/unscorable_frac", float(bad))
            if not bad:
                log_metric("semantic/z_mean", value)
        log_extra("zoom_labels", [" | ".join(str(c.label) for c in rollout) for rollout in calls])
        log_extra("z_t", [" | ".join(f"{v:.3f}" for v in s) for s in scores])
        return rewards

    def _score(self, labels: list[str], crops: list[Image.Image]) -> torch.Tensor:
        """One batched CLIP call; if the batch fails, score pair by pair so one bad label costs only its own z_t."""
        try:
            return self.verifier.similarity(labels, crops)
        except Exception as err:  # noqa: BLE001 - a bad label must never crash a training step
            self._warn_unscorable(err)
        out = torch.full((len(labels),), float("nan"))
        for i, (label, crop) in enumerate(zip(labels, crops)):
            try:
                out[i] = self.verifier.similarity([label], [crop])[0]
            except Exception:  # noqa: BLE001
                pass
        return out

    def _warn_unscorable(self, err: Exception) -> None:
        if not self._warned_unscorable:
            warnings.warn(f"CLIP could not score a label ({err!r}); such calls count as z_t = 0.", stacklevel=2)
            self._warned_unscorable = True

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        # Everything below is gathered over processes, so groups split across ranks are seen whole.
        # TRL treats a row as unscorable only when every column is NaN, and R_sem is never NaN: a row whose outcome
        # rewards all returned None (a judge that timed out) would be trained as R_out = 0. Its R_sem is made NaN
        # too, so TRL leaves it out of its group's statistics and gives it advantage 0, as stock GRPO does.
        unscorable = torch.isnan(rewards_per_func[:, :-1]).all(dim=1)
        rewards_per_func[unscorable, -1] = torch.nan
        semantic = rewards_per_func[:, -1]
        weights = self.reward_weights.to(rewards_per_func.device)
        outcome = (rewards_per_func[:, :-1] * weights[:-1]).nansum(dim=1)
        outcome[unscorable] = torch.nan
        advantages = mapo_advantages(outcome, semantic, num_generations, weights[-1].item(), self.scale_rewards)
        grouped = outcome.view(-1, num_generations)
        all_equal = (grouped == grouped[:, :1]).all(dim=1).float().mean().item()
        self._metrics[mode]["mapo/frac_groups_outcome_all_equal"].append(all_equal)
        self._metrics[mode]["mapo/frac_unscorable"].append(unscorable.float().mean().item())
        self._metrics[mode]["mapo/advantage_std"].append(advantages.std().item() if advantages.numel() > 1 else 0.0)
        return rewards_per_func
