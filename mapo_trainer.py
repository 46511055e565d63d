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

Other advantage estimators on the same rollouts (`advantage_estimator`):
- "grpo": R_sem weighted 0 (stock GRPO's advantages, bit for bit; R_sem still logged).
- "hpo" / "mapo+hpo": HPO (`hpo.py`): every assistant turn gets its own advantage (A_E + omega * A_S) / (1 + omega),
  A_E being GRPO's ("hpo") or MAPO's composite ("mapo+hpo") episode advantage and A_S the step advantage from the
  Kantorovich potential of W1 between the group's step embeddings and a hindsight set of successful steps. The
  per-token (B, T) advantages go to TRL's loss unchanged (`_compute_loss` accepts them); tool-response tokens stay
  masked.
Every estimator logs `adv/variance` and `adv/zero_frac`, and optionally a gradient-variance probe on a fixed batch
(`variance_probe_steps`), so a run shows whether its estimator lowers gradient variance, as both papers claim.

Hooks overridden: `_calculate_rewards`, to withhold R_sem where the outcome is unscorable and log the group-level
metrics that need the rewards gathered across processes; `_generate_and_score_completions`, after TRL's own, to replace
the advantages with HPO's per-token ones and log the variance diagnostics. Rollouts are TRL's own multi-turn tool loop
(`environment_factory=ZoomInEnv`), and tool-response tokens stay out of the loss through TRL's `tool_mask`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from accelerate.utils import gather_object
from PIL import Image
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd, split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid

from agent import check_token_budget
from hpo import (
    StepEncoder,
    broadcast_to_tokens,
    combine_advantages,
    normalize_step_advantages,
    offline_group_step_advantages,
    online_group_step_advantages,
    step_segments,
    turn_index,
)
from hpo import kantorovich_potentials as kantorovich_potentials  # re-exported: HPO's W1 duals (issue 10)
from models import load_clip, pixel_budget
from resume import ExactResume
from tools import ToolConfig, ToolConfigRecorder, executed_calls, make_environment_factory
from vllm_images import VLLMImagePlaceholders, check_vllm_version

SEMANTIC_REWARD_NAME = "semantic"
SEMANTIC_SCORES = ("cosine", "clipscore")
ADVANTAGE_ESTIMATORS = ("grpo", "mapo", "hpo", "mapo+hpo")
HPO_HINDSIGHT = ("online", "offline")


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
            "'grpo': outcome rewards only; R_sem is still computed and logged, with weight 0. 'hpo': GRPO's episode "
            "advantage mixed per turn with HPO's step advantage (HPO eq. 17). 'mapo+hpo': the same with MAPO's "
            "composite episode advantage as A_E.",
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

    hpo_omega: float = field(
        default=0.5, metadata={"help": "omega of HPO eq. 17: A = (A_E + omega * A_S) / (1 + omega) (paper: 0.5)."}
    )
    hpo_hindsight: str = field(
        default="online",
        metadata={
            "help": "HPO's hindsight set. 'online': the steps of the group's own successful rollouts (a group with "
            "too few positive or negative steps falls back to A_E, counted in hpo/fallback_frac). 'offline': "
            "successful trajectories stored per prompt in the dataset column `hpo_hindsight_column`.",
            "choices": list(HPO_HINDSIGHT),
        },
    )
    hpo_hindsight_column: str = field(
        default="hindsight",
        metadata={
            "help": "Offline hindsight column: per row, a list of successful trajectories, each a list of step "
            "texts (segments 1..T, as hpo.step_segments renders a rollout) or of step embeddings (lists of floats, "
            "of the text encoder's width)."
        },
    )
    hpo_success_threshold: float = field(
        default=1.0,
        metadata={"help": "A rollout succeeded when its outcome reward (R_out, without R_sem) is at least this."},
    )
    hpo_min_positive_steps: int = field(
        default=4, metadata={"help": "Online HPO: fewest steps of successful rollouts a group needs (authors: 4)."}
    )
    hpo_min_negative_steps: int = field(
        default=4, metadata={"help": "Online HPO: fewest steps of failed rollouts a group needs (authors: 4)."}
    )
    hpo_max_offline_trajectories: int = field(
        default=8, metadata={"help": "Offline HPO: max_off_num; a prompt's step advantage scales by n_off / this."}
    )
    hpo_text_encoder: str = field(
        default="Qwen/Qwen3-Embedding-0.6B",
        metadata={"help": "Text encoder of HPO's intent space (HPO section 4.2), a hub name or local folder."},
    )
    hpo_encoder_max_length: int = field(
        default=8192, metadata={"help": "Longest token window the text encoder reads per step."}
    )
    variance_probe_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many steps (0: never), measure the variance of per-sample policy-gradient norms on "
            "a fixed batch (the first one, kept), logged as probe/grad_norm_var: whether an estimator lowers "
            "gradient variance, on your own run. Costs one backward pass per probed sample."
        },
    )
    variance_probe_rows: int = field(
        default=8, metadata={"help": "Rollouts of the fixed batch the gradient-variance probe uses."}
    )

    def __post_init__(self):
        super().__post_init__()
        check_vllm_version(self.use_vllm)  # TRL only warns about a vLLM outside its range
        if self.hpo_hindsight not in HPO_HINDSIGHT:
            raise ValueError(f"hpo_hindsight must be one of {HPO_HINDSIGHT}; got {self.hpo_hindsight!r}")
        if not self.hpo_omega >= 0:
            raise ValueError(f"hpo_omega must be >= 0; got {self.hpo_omega}")
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}; got {self.advantage_estimator!r}"
            )
        if self.semantic_score not in SEMANTIC_SCORES:
            raise ValueError(f"semantic_score must be one of {SEMANTIC_SCORES}; got {self.semantic_score!r}")
        if self.uses_semantic and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} normalises the composite R_out + beta * R_sem "
                "(eq. 3), which is multi_objective_aggregation='sum_then_normalize'; got "
                f"{self.multi_objective_aggregation!r}."
            )

    @property
    def uses_semantic(self) -> bool:
        """R_sem moves the policy (weight semantic_beta) rather than being logged only."""
        return self.advantage_estimator in ("mapo", "mapo+hpo")

    @property
    def uses_hpo(self) -> bool:
        """Advantages are per turn, mixed with HPO's step advantage."""
        return self.advantage_estimator in ("hpo", "mapo+hpo")


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
class MAPOTrainer(ExactResume, VLLMImagePlaceholders, GRPOTrainer):
    """GRPO with MAPO's semantic reward (see the module docstring for the method and its deviations).

    Builds its own `environment_factory` (`tools.ZoomInEnv`, which records every zoom-in call) and CLIP verifier from
    `tool_config`, the settings evaluation must replay; every checkpoint it saves records them (`tool_config.json`).
    Overrides `_calculate_rewards` (R_sem unscorable where the outcome is; group-level metrics) and
    `_generate_and_score_completions` (HPO's per-token advantages; variance diagnostics). R_sem enters as one more
    reward column, weighted `semantic_beta` ('mapo', 'mapo+hpo') or 0 ('grpo', 'hpo'). `ExactResume`
    mends two resume bugs of transformers/TRL (`resume.py`). `VLLMImagePlaceholders` overrides `_generate_single_turn`:
    in vLLM colocate mode each image, tool crops included, reaches vLLM as one placeholder (trl#6294; vllm_images.py).
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
        self.step_encoder = (
            StepEncoder(
                self.args.hpo_text_encoder, device=self.accelerator.device, max_length=self.args.hpo_encoder_max_length
            )
            if self.args.uses_hpo
            else None
        )
        self._outcome: torch.Tensor | None = None  # the last batch's R_out, gathered: HPO's success signal
        self._offline_embeddings: dict[str, tuple[torch.Tensor, int]] = {}
        self._probe_rows: list[dict] | None = None
        self._probe_done_at, self._probe_off = -1, False
        weight = self.args.semantic_beta if self.args.uses_semantic else 0.0
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
        self._outcome = outcome
        advantages = mapo_advantages(outcome, semantic, num_generations, weights[-1].item(), self.scale_rewards)
        grouped = outcome.view(-1, num_generations)
        all_equal = (grouped == grouped[:, :1]).all(dim=1).float().mean().item()
        self._metrics[mode]["mapo/frac_groups_outcome_all_equal"].append(all_equal)
        self._metrics[mode]["mapo/frac_unscorable"].append(unscorable.float().mean().item())
        self._metrics[mode]["mapo/advantage_std"].append(advantages.std().item() if advantages.numel() > 1 else 0.0)
        return rewards_per_func

    # ------------------------------------------------------------------------------------ HPO and diagnostics
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        if self.args.uses_hpo:
            out["advantages"] = self._hpo_advantages(inputs, out, mode)
        self._log_advantage_statistics(out, mode)
        if mode == "train" and self.args.variance_probe_steps > 0:
            self._probe_gradient_variance(out)
        return out

    def _hpo_advantages(self, inputs: list[dict], out: dict, mode: str) -> torch.Tensor:
        """Per-token advantages (B, T): HPO eq. 17 over this process's rollouts, A_E being TRL's (GRPO or MAPO).

        Every process embeds its own rollouts' steps; the embeddings are gathered so that each group, possibly split
        across processes, is transported whole, and every process computes the same batch statistics (eq. 16's std).
        """
        args = self.args
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        pads = [self._image_pad_token_id, self._video_pad_token_id]
        segments = step_segments(
            self._tokenizer,
            out["prompt_ids"],
            out["prompt_mask"],
            out["completion_ids"],
            out["completion_mask"],
            out.get("tool_mask"),
            drop_token_ids=[t for t in pads if t is not None],
        )
        steps = gather_object(self.step_encoder.embed(segments))
        success = (self._outcome >= args.hpo_success_threshold).cpu()  # NaN (unscorable) is no success
        if args.hpo_hindsight == "offline":
            offline = gather_object([row.get(args.hpo_hindsight_column) for row in inputs])
            prompts = gather_object([rollout[0] for rollout in segments])
        groups, sizes = [], []
        for first in range(0, len(steps), num_generations):
            rows = range(first, first + num_generations)
            sizes.append([len(steps[r]) for r in rows])
            emb = torch.cat([steps[r] for r in rows])
            rollout = torch.cat([torch.full((len(steps[r]),), k) for k, r in enumerate(rows)])
            step = torch.cat([torch.arange(len(steps[r])) for r in rows])
            if args.hpo_hindsight == "online":
                group = online_group_step_advantages(
                    emb,
                    rollout,
                    step,
                    success[first : first + num_generations],
                    min_positive=args.hpo_min_positive_steps,
                    min_negative=args.hpo_min_negative_steps,
                    nonfinite="fallback",
                )
            else:
                hindsight, n_off = self._offline_hindsight(offline[first], prompts[first], row=first)
                group = offline_group_step_advantages(
                    emb, step, hindsight, n_off, max_off_trajectories=args.hpo_max_offline_trajectories,
                    nonfinite="fallback",
                )  # fmt: skip
            groups.append(group)
        batch = normalize_step_advantages(groups)
        per_row = [v for values, counts in zip(batch.values, sizes) for v in values.split(counts)]
        fallback = [f for f in batch.fallback for _ in range(num_generations)]
        local = slice(self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs))
        turns = turn_index(out["completion_mask"], out.get("tool_mask"))
        step_adv = broadcast_to_tokens(per_row[local], turns)
        advantages = combine_advantages(out["advantages"], step_adv, args.hpo_omega, episode_only=fallback[local])

        self._metrics[mode]["hpo/fallback_frac"].append(batch.n_fallback / len(groups))
        self._metrics[mode]["hpo/step_adv_sigma"].append(batch.sigma)
        used = [g.w1 for g in groups if not g.fallback]
        self._metrics[mode]["hpo/w1"].append(sum(used) / len(used) if used else 0.0)
        a_e = gather_object(out["advantages"].tolist())
        turn_values = [
            " | ".join(f"{(a + args.hpo_omega * v) / (1 + args.hpo_omega):.3f}" for v in values[1:].tolist())
            if not fb
            else " | ".join(f"{a:.3f}" for _ in values[1:])
            for a, values, fb in zip(a_e, per_row, fallback)
        ]
        self._logs["extra"]["turn_advantages"].extend(turn_values)
        return advantages.to(out["advantages"].dtype)

    def _offline_hindsight(self, trajectories, prompt_segment: str, row: int) -> tuple[torch.Tensor, int]:
        """The offline hindsight cloud of one prompt (every step of its stored successful trajectories, the prompt
        included), embedded once and cached, and how many trajectories it holds."""
        column = self.args.hpo_hindsight_column
        trajectories = [t for t in trajectories or [] if t]
        if not trajectories:
            return torch.zeros(0, self.step_encoder.width), 0
        if all(isinstance(step, str) for trajectory in trajectories for step in trajectory):
            key = prompt_segment + "\x00" + "\x00".join("\x01".join(t) for t in trajectories)
            if key not in self._offline_embeddings:
                embedded = self.step_encoder.embed([[prompt_segment, *t] for t in trajectories])
                self._offline_embeddings[key] = (torch.cat(embedded), len(trajectories))
            return self._offline_embeddings[key]
        steps = torch.tensor([step for trajectory in trajectories for step in trajectory], dtype=torch.float32)
        if steps.dim() != 2 or steps.shape[1] != self.step_encoder.width:
            raise ValueError(
                f"column {column!r}, row {row}: stored step embeddings have width "
                f"{steps.shape[-1] if steps.dim() else 0}, the text encoder {self.args.hpo_text_encoder!r} "
                f"{self.step_encoder.width}: embed the offline set with the same encoder, or store step texts"
            )
        return steps, len(trajectories)

    def _log_advantage_statistics(self, out: dict, mode: str) -> None:
        """Per step, for every estimator: the variance of the advantages over trained tokens and the fraction of
        trained tokens whose advantage is 0 (no learning signal), over all processes."""
        mask = out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
        advantages = out["advantages"]
        per_token = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
        values = per_token[mask.bool()].double()
        local = torch.stack(
            [values.sum(), values.square().sum(), values.new_tensor(values.numel()), (values.abs() < 1e-8).sum()]
        )
        total, square, count, zero = self.accelerator.reduce(local, reduction="sum").tolist()
        count = max(count, 1.0)
        self._metrics[mode]["adv/variance"].append(square / count - (total / count) ** 2)
        self._metrics[mode]["adv/zero_frac"].append(zero / count)

    def _probe_gradient_variance(self, out: dict) -> None:
        """Every `variance_probe_steps` steps: per-sample policy-gradient norms on a fixed batch, and their variance.

        The fixed batch is the first `variance_probe_rows` rollouts of the first generation batch, with the
        advantages this run's estimator gave them; so the probe compares estimators on the same rollouts (the first
        batch is drawn before any update, hence identical across estimators for the same seed). The per-sample
        gradient is that of -sum_t A_t log pi(a_t) / |tau| (the clipped surrogate's gradient at the sampling policy),
        taken with `torch.autograd.grad`, so the optimizer's gradients are untouched.
        """
        if self._probe_off:
            return
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            warnings.warn("variance_probe_steps: the probe needs unsharded parameters; it is off.", stacklevel=2)
            self._probe_off = True
            return
        if self._probe_rows is None:
            batch = split_pixel_values_by_grid({k: v for k, v in out.items() if v is not None})
            rows = split_tensor_dict(batch, len(out["prompt_ids"]))
            self._probe_rows = [unsplit_pixel_values_by_grid(r) for r in rows[: self.args.variance_probe_rows]]
        step = self.state.global_step
        if step % self.args.variance_probe_steps or step == self._probe_done_at:
            return
        self._probe_done_at = step
        params = [p for p in self.model.parameters() if p.requires_grad]
        norms = []
        for row in self._probe_rows:
            mask = (
                row["completion_mask"] if row.get("tool_mask") is None else row["completion_mask"] * row["tool_mask"]
            )
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                torch.cat([row["prompt_ids"], row["completion_ids"]], dim=1),
                torch.cat([row["prompt_mask"], row["completion_mask"]], dim=1),
                row["completion_ids"].size(1),
                pixel_values=row.get("pixel_values"),
                image_grid_thw=row.get("image_grid_thw"),
                num_images=row.get("num_images"),
                mm_token_type_ids=row.get("mm_token_type_ids"),
            )
            advantages = row["advantages"] if row["advantages"].dim() == 2 else row["advantages"][:, None]
            loss = -(advantages * logps * mask).sum() / mask.sum().clamp(min=1)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            norms.append(torch.sqrt(sum(g.float().square().sum() for g in grads if g is not None)))
        norms = self.accelerator.gather(torch.stack(norms)).double()
        self._metrics["train"]["probe/grad_norm_mean"].append(norms.mean().item())
        self._metrics["train"]["probe/grad_norm_var"].append(norms.var().item() if norms.numel() > 1 else 0.0)
