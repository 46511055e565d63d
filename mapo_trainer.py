"""`MAPOTrainer`: TRL's `GRPOTrainer` with MAPO's semantic reward (Walk the Talk, section 3), HPO's step advantage
as an alternative estimator, and the repairs this repo needs from TRL 1.16 (exact resume, vLLM tool images).

The method and every equation it implements, with where this departs from the papers: `docs/method.md`. The math is
pure and lives apart (`mapo.py`: eq. 2 and 3; `hpo/`: HPO eq. 13-17); the CLIP verifier is `rewards.verifiers.ClipVerifier`;
the fields are `configs.MAPOConfig`'s. Rollouts are TRL's own multi-turn tool loop (`environment_factory`:
`tools.ZoomInEnv`), and tool-response tokens stay out of the loss through TRL's `tool_mask`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from trl import GRPOTrainer

from configs import MAPOConfig
from data import prompts_in_box_convention
from hpo import kantorovich_potentials
from hpo.trainer import HPOSteps
from mapo import groups_outcome_all_equal, reference_advantages, scale_similarity, semantic_reward
from repairs.over_turn import OverTurnMask
from repairs.response_parser import guard_response_parser
from repairs.resume import ExactResume
from repairs.rollout import ban_placeholder_tokens, over_turn
from repairs.token_budget import check_token_budget
from repairs.tool_rounds import AgreedToolRounds
from repairs.vllm_images import VLLMImagePlaceholders
from repairs.vllm_setup import VLLMSetup
from rewards.verifiers import ClipVerifier, Scene, build_verifier
from tools import (
    ToolConfig,
    ToolConfigRecorder,
    ZoomCall,
    calls_per_tool,
    executed_calls,
    get_tools,
    make_environment_factory,
)
from utils.checks import check_vllm_server
from utils.diagnostics import LearningSignalCheck, advantage_statistics, sampling_mismatch
from utils.models import context_length, pixel_budget
from utils.probes import GradientProbes

# What users import from here, wherever it is defined.
__all__ = [
    "ClipVerifier",
    "MAPOConfig",
    "MAPOTrainer",
    "RewardColumn",
    "kantorovich_potentials",
    "reference_advantages",
    "semantic_reward",
]

SEMANTIC_REWARD_NAME = "semantic"


class RewardColumn(NamedTuple):
    """One column of eq. 3's composite reward: TRL calls `func` as a reward function and sums the columns x `weight`."""

    name: str
    func: Callable
    weight: float
    processing_class: Any = None


class MAPOTrainer(
    GradientProbes,
    ExactResume,
    AgreedToolRounds,
    VLLMImagePlaceholders,
    OverTurnMask,
    HPOSteps,
    VLLMSetup,
    GRPOTrainer,
):
    """GRPO with MAPO's semantic reward R_sem as one more reward column, weighted `semantic_beta` ('mapo',
    'mapo+hpo') or 0 ('grpo', 'hpo': R_sem logged only), so TRL's `sum_then_normalize` computes eq. 3. Eq. 3's columns
    and weights come from one method, `reward_columns`: override it to change eq. 3.

    Builds its own `environment_factory` (`tools.ZoomInEnv` with the tools `tool_config.tools` enables) from
    `tool_config`, which every checkpoint records (`tool_config.json`). z_t comes from the verifier
    `semantic_verifier` names (`rewards.verifiers.VERIFIERS`), scaled by `semantic_score` (`mapo.scale_similarity`).
    Composed in, and idle unless a recipe asks: HPO (`hpo.trainer.HPOSteps`), the over-turn mask
    (`repairs.over_turn.OverTurnMask`), the gradient-variance probes (`utils.probes.GradientProbes`), vLLM's engine
    or server (`repairs.vllm_setup.VLLMSetup`).

    Methods it overrides from TRL's `GRPOTrainer` and transformers' `Trainer`, its mixins included (a test checks
    this list against the class hierarchy):
    - `__init__`: the datasets' prompts in `tool_config`'s box convention and tools (`data.prompts_in_box_convention`),
      the token-budget check (before any engine or verifier loads), the environment, the verifier, the R_sem reward
      column, the warning of a run that cannot learn (`utils.diagnostics.LearningSignalCheck`), the gradient-variance
      probes (`GradientProbes`), HPO's step encoder (`HPOSteps`), vLLM's engine or server (`VLLMSetup`; a server that
      serves another model or pixel budget fails naming the fields); generation
      in either backend kept from sampling image and video placeholders (`repairs.rollout.ban_placeholder_tokens`);
      any completion TRL cannot parse read as plain text, never raised (`repairs.response_parser`);
    - `_calculate_rewards`: R_sem withheld where the outcome is unscorable; group-level metrics; which rollouts ended
      on a tool call that never ran (`repairs.rollout.over_turn`, logged as `tools/over_turn_frac`);
    - `_generate_and_score_completions`: HPO's per-token advantages (`HPOSteps`); with `mask_over_turn`, over-turn
      rollouts out of the loss (`OverTurnMask`, Mini-o3's `ignore_exceed`); advantage and gradient-variance figures;
    - `_compute_loss` (`OverTurnMask`): with `mask_over_turn` under a loss that averages over rows, the average taken
      over the generation batch's rows left in the loss, counted over every process;
    - `_tool_call_loop` (`repairs.tool_rounds.AgreedToolRounds`): with several processes, every one takes part in
      every generation round of the tool loop, so ZeRO-3/FSDP's synchronized generation and vLLM's gathers cannot
      hang or mismatch on unequal tool depth (trl#6673);
    - `_generate_single_turn` (`AgreedToolRounds`, then `repairs.vllm_images.VLLMImagePlaceholders`): the round's
      agreed prompt count; in vLLM colocate mode each image, tool crops included, reaches vLLM as one placeholder
      (trl#6294), and vLLM's expansion of the images is checked against the processor's;
    - `_load_from_checkpoint`, `_get_train_sampler` (`repairs.resume.ExactResume`): resume with the checkpoint's
      weights and the uninterrupted run's data order.
    """

    _tag_names = ["trl", "grpo", "mapo"]

    def __init__(self, *args, processing_class, tool_config: ToolConfig | None = None, **kwargs):
        if "environment_factory" in kwargs or "tools" in kwargs:
            raise ValueError("MAPOTrainer builds its zoom-in environment from `tool_config`; pass that instead.")
        tool_config = tool_config or ToolConfig()
        for name in ("train_dataset", "eval_dataset"):  # the system turn says the frame the tool reads boxes in
            kwargs[name] = prompts_in_box_convention(kwargs.get(name), tool_config.box_convention, tool_config.tools)
        budget = pixel_budget(processing_class)
        for name in ("min_pixels", "max_pixels"):
            wanted = getattr(tool_config, name)
            if wanted is not None and wanted != getattr(budget, name):
                raise ValueError(
                    f"tool_config.{name}={wanted} but the processor resizes images with {name}="
                    f"{getattr(budget, name)}: load it with utils.models.load_processor(..., {name}={wanted})."
                )
        config = kwargs.get("args")
        model = kwargs.get("model", args[0] if args else None)
        if config is not None and model is not None:  # before vLLM, CLIP or the step encoder loads
            check_token_budget(
                processing_class,
                tool_config.resolved(budget),
                max_completion_length=config.max_completion_length,
                max_tool_calling_iterations=config.max_tool_calling_iterations,
                context_length=context_length(model),
            )
        super().__init__(
            *args,
            processing_class=processing_class,
            environment_factory=make_environment_factory(tool_config, budget),
            **kwargs,
        )
        ban_placeholder_tokens(self)
        guard_response_parser(self._tokenizer)  # no completion raises out of the rollout (issue 59)
        if self.use_vllm and self.vllm_mode == "server" and self.accelerator.is_main_process:
            check_vllm_server(self.vllm_generation.vllm_client, self.model.name_or_path, processing_class)
        self.tool_config = tool_config.resolved(budget)
        self.add_callback(
            ToolConfigRecorder(
                self.tool_config.as_record(),
                max_completion_length=self.args.max_completion_length,
                max_tool_calling_iterations=self.args.max_tool_calling_iterations,
            )
        )
        self.verifier = build_verifier(
            self.args.semantic_verifier, self.tool_config, self.accelerator.device, seed=self.args.seed
        )
        self._warned_unscorable = False
        self._build_hpo()  # `HPOSteps`: nothing unless a recipe asks
        self.add_callback(
            LearningSignalCheck(
                self.args.max_completion_length,
                self.args.max_tool_calling_iterations,
                self.args.vllm_importance_sampling_mode,
                window_steps=self.args.signal_window_steps,
                mask_over_turn=self.args.mask_over_turn,
            )
        )
        self._add_gradient_probes()  # `utils.probes.GradientProbes`: nothing unless a recipe asks
        self._outcome: torch.Tensor | None = None  # the last batch's R_out, gathered: HPO's success signal
        self._over_turn: torch.Tensor | None = None  # this process's rollouts of the last batch that ended over-turn
        columns = self.reward_columns()
        self.reward_func_names = [column.name for column in columns]
        self.reward_funcs = [column.func for column in columns]
        self.reward_processing_classes = [column.processing_class for column in columns]
        self.reward_weights = torch.tensor([column.weight for column in columns], dtype=self.reward_weights.dtype)

    def reward_columns(self) -> list[RewardColumn]:
        """Eq. 3's composite reward, R_out + beta * R_sem, as TRL's weighted reward columns: the recipe's outcome
        rewards with their `reward_weights`, then R_sem (eq. 2) weighted `semantic_beta` (0 under 'grpo' and 'hpo',
        which log R_sem only). TRL sums the weighted columns and normalises the sum per group (`scale_rewards`):
        eq. 3's advantage, which `mapo.reference_advantages` states on its own.

        The one place to change eq. 3: override it to reweight, add or drop a column. R_sem stays last:
        `_calculate_rewards` reads R_out as the weighted sum of the columns before it."""
        outcome = zip(
            self.reward_func_names, self.reward_funcs, self.reward_weights.tolist(), self.reward_processing_classes
        )
        beta = self.args.semantic_beta if self.args.uses_semantic else 0.0
        return [
            *(RewardColumn(*column) for column in outcome),
            RewardColumn(SEMANTIC_REWARD_NAME, self._semantic_reward, beta),
        ]

    def _semantic_reward(
        self, completions, environments, log_metric, log_extra, target_bbox=None, target_label=None, **kwargs
    ) -> list[float]:
        """R_sem (eq. 2) for this process's rollouts, with every crop of the batch scored in one verifier call."""
        args = self.args
        calls = [executed_calls(env, completion) for env, completion in zip(environments, completions)]
        rows = range(len(calls))
        scenes = [
            Scene(env.image, target_bbox[i] if target_bbox else None, target_label[i] if target_label else None)
            for i, env in zip(rows, environments)
        ]
        scored = [(call, scenes[i]) for i in rows for call in calls[i] if call.ok]
        cosine = self._score([call for call, _ in scored], [scene for _, scene in scored])
        whole = None
        if args.semantic_score == "contrastive":  # the same labels against their whole images
            whole_calls = [s.whole_image_call(c) for c, s in scored]
            whole = self._score(whole_calls, [scene for _, scene in scored])
            cosine = torch.where(torch.isnan(whole), torch.nan, cosine)  # unscorable against either: unscorable
        unscorable = torch.isnan(cosine)
        z = scale_similarity(
            torch.nan_to_num(cosine, nan=0.0), args.semantic_score, None if whole is None else torch.nan_to_num(whole)
        ).tolist()
        z_of = {id(call): value for (call, _), value in zip(scored, z)}

        scores = [[z_of.get(id(call), 0.0) for call in rollout] for rollout in calls]
        rewards = [semantic_reward(s, args.semantic_lambda, empty=args.no_tool_semantic) for s in scores]

        for env, completion in zip(environments, completions):  # every other tool's calls: no label, no z_t
            for metric, count in calls_per_tool(completion, get_tools(env.config.tools)).items():
                log_metric(metric, count)
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

    def _score(self, calls: list[ZoomCall], scenes: list[Scene]) -> torch.Tensor:
        """One batched verifier call; if the batch fails, score call by call so one bad label costs only its own z_t
        (NaN: counted in semantic/unscorable_frac, scored 0)."""
        try:
            return self.verifier.score(calls, scenes)
        except Exception as err:  # noqa: BLE001 - a bad label must never crash a training step
            self._warn_unscorable(err)
        out = torch.full((len(calls),), float("nan"))
        for i, (call, scene) in enumerate(zip(calls, scenes)):
            try:
                out[i] = self.verifier.score([call], [scene])[0]
            except Exception:  # noqa: BLE001
                pass
        return out

    def _warn_unscorable(self, err: Exception) -> None:
        if not self._warned_unscorable:
            warnings.warn(
                f"The verifier could not score a label ({err!r}); such calls count as z_t = 0.", stacklevel=2
            )
            self._warned_unscorable = True

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's reward columns (R_sem last), with R_sem withheld where the outcome is unscorable, and the group-level
        metrics that need the rewards gathered across processes."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        # Rollouts that ended on a tool call that never ran (this process's rows; masked later if mask_over_turn).
        self._over_turn = torch.tensor([over_turn(c) for c in completions], device=self.accelerator.device)
        over = self.accelerator.gather(self._over_turn.float())
        self._metrics[mode]["tools/over_turn_frac"].append(over.mean().item())
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
        # The advantage TRL is about to compute from these columns, stated on its own for the metric below.
        advantages = reference_advantages(outcome, semantic, num_generations, weights[-1].item(), self.scale_rewards)
        all_equal = groups_outcome_all_equal(outcome, num_generations).float().mean().item()
        self._metrics[mode]["mapo/frac_groups_outcome_all_equal"].append(all_equal)
        self._metrics[mode]["mapo/frac_unscorable"].append(unscorable.float().mean().item())
        self._metrics[mode]["mapo/advantage_std"].append(advantages.std().item() if advantages.numel() > 1 else 0.0)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's rollouts and advantages (HPO's per-token ones: `hpo.trainer.HPOSteps`; over-turn rollouts out of the
        loss: `repairs.over_turn.OverTurnMask`), then the advantage, vLLM and gradient-variance figures."""
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        reduce_sum = lambda t: self.accelerator.reduce(t, reduction="sum")  # noqa: E731
        metrics = advantage_statistics(out, reduce_sum)
        if "sampling_per_token_logps" in out and "old_per_token_logps" in out:  # vLLM, with its logprobs
            metrics |= sampling_mismatch(out, reduce_sum, self.accelerator.gather)
        if mode == "train":
            metrics |= self._probe_metrics(out)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        return out
