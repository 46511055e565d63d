"""Diagnostics `MAPOTrainer` logs for every estimator (docs/method.md): advantage statistics, the variance of the
policy gradient (which MAPO and HPO both claim to lower), vLLM's drift, and the warning of a run that cannot learn."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
from transformers import TrainerCallback
from trl.trainer.utils import split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid

logger = logging.getLogger(__name__)


def trained_token_mask(batch: dict) -> torch.Tensor:
    """The tokens the loss trains on: `completion_mask`, less tool-response tokens (`tool_mask`) when there are any."""
    return (
        batch["completion_mask"] if batch.get("tool_mask") is None else batch["completion_mask"] * batch["tool_mask"]
    )


def advantage_statistics(out: dict, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """`adv/variance` (of the advantages over trained tokens) and `adv/zero_frac` (the fraction of trained tokens whose
    advantage is 0: no learning signal), over all processes (`reduce_sum`: a sum over processes of a tensor)."""
    mask = trained_token_mask(out)
    advantages = out["advantages"]
    per_token = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
    values = per_token[mask.bool()].double()
    local = torch.stack(
        [values.sum(), values.square().sum(), values.new_tensor(values.numel()), (values.abs() < 1e-8).sum()]
    )
    total, square, count, zero = reduce_sum(local).tolist()
    count = max(count, 1.0)
    return {"adv/variance": square / count - (total / count) ** 2, "adv/zero_frac": zero / count}


def sampling_mismatch(out: dict, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """How far vLLM's rollouts are from the trained policy, over all processes (docs/vllm.md, "Importance
    sampling"; `out`: a generation batch with TRL's `old_per_token_logps` and vLLM's `sampling_per_token_logps`):
    `vllm/logp_offset`, the signed mean over trained tokens of the trainer's logprob minus vLLM's, and
    `vllm/sequence_ratio`, the mean over rollouts of the raw sequence importance ratio, exp(sum of those
    differences). Tokens vLLM did not score (NaN) count as no difference, as TRL counts them."""
    mask = trained_token_mask(out).bool()
    diff = torch.nan_to_num(out["old_per_token_logps"] - out["sampling_per_token_logps"], nan=0.0) * mask
    sequence = diff.sum(-1).double().exp()
    local = torch.stack([diff.sum().double(), mask.sum().double(), sequence.sum(), sequence.new_tensor(len(sequence))])
    total, tokens, ratios, rows = reduce_sum(local).tolist()
    return {"vllm/logp_offset": total / max(tokens, 1.0), "vllm/sequence_ratio": ratios / max(rows, 1.0)}


def rollout_rows(out: dict, rows: int | None = None) -> list[dict]:
    """The first `rows` rollouts (all by default) of a generation batch `out` (`_generate_and_score_completions`'s
    output), one batch-of-one dict each, pixel values split by image grid as TRL splits them."""
    batch = split_pixel_values_by_grid({k: v for k, v in out.items() if v is not None})
    split = split_tensor_dict(batch, len(out["prompt_ids"]))
    return [unsplit_pixel_values_by_grid(row) for row in split[:rows]]


def completion_logps(trainer, row: dict) -> torch.Tensor:
    """(1, T) log-probabilities of one rollout's completion tokens (`rollout_rows`) under `trainer.model`, through
    TRL's own forward (`_get_per_token_logps_and_entropies`), with autograd on."""
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([row["prompt_ids"], row["completion_ids"]], dim=1),
        torch.cat([row["prompt_mask"], row["completion_mask"]], dim=1),
        row["completion_ids"].size(1),
        pixel_values=row.get("pixel_values"),
        image_grid_thw=row.get("image_grid_thw"),
        num_images=row.get("num_images"),
        mm_token_type_ids=row.get("mm_token_type_ids"),
    )
    return logps


def policy_gradient_loss(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """-sum_t A_t log pi(a_t) / |tau| over the trained tokens (`mask`) of one rollout: the trainer's loss term for
    `loss_type: grpo` (a sequence mean), whose gradient at the sampling policy is the clipped surrogate's. `advantages`
    is (1,) for an episode advantage or (1, T) per token (HPO)."""
    advantages = advantages if advantages.dim() == 2 else advantages[:, None]
    return -(advantages * logps * mask).sum() / mask.sum().clamp(min=1)


class GradientVarianceProbe:
    """Every `every` steps: per-sample policy-gradient norms on a fixed batch, and their variance.

    The fixed batch is the first `rows` rollouts of the first generation batch (drawn before any update, so the same
    across estimators for one seed) with the advantages the run's estimator gave them. The gradients are taken with
    `torch.autograd.grad`, so the optimizer's are untouched.
    """

    def __init__(self, every: int, rows: int):
        self.every, self.rows = every, rows
        self._batch: list[dict] | None = None
        self._done_at, self._off = -1, False

    def __call__(self, trainer, out: dict) -> dict[str, float]:
        """`probe/grad_norm_{mean,var}` at a probed step of `trainer` (a `GRPOTrainer`), else nothing."""
        if self._off:
            return {}
        if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
            warnings.warn("variance_probe_steps: the probe needs unsharded parameters; it is off.", stacklevel=2)
            self._off = True
            return {}
        if self._batch is None:
            self._batch = rollout_rows(out, self.rows)
        step = trainer.state.global_step
        if step % self.every or step == self._done_at:
            return {}
        self._done_at = step
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        norms = []
        for row in self._batch:
            loss = policy_gradient_loss(completion_logps(trainer, row), row["advantages"], trained_token_mask(row))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            norms.append(torch.sqrt(sum(g.float().square().sum() for g in grads if g is not None)))
        norms = trainer.accelerator.gather(torch.stack(norms)).double()
        return {
            "probe/grad_norm_mean": norms.mean().item(),
            "probe/grad_norm_var": norms.var().item() if norms.numel() > 1 else 0.0,
        }


class GradientVariance(TrainerCallback):
    """The variance of the policy-gradient estimate across batches, which MAPO (section 4) and HPO (section 3) argue
    an estimator lowers: the trace of the gradients' covariance.

    Before each of the first `batches` optimizer steps it folds the step's flattened, clipped gradient into a running
    mean and sum of squared deviations (Welford: two gradient-sized host buffers), and at the last hands `record`
    `gradvar/trace` (the sum over parameters of the unbiased variance across batches) and `gradvar/relative` (the
    trace over the squared norm of the mean gradient: above 1, the noise exceeds the signal the batches agree on).
    The gradients must be whole on each process: single process or DDP, not ZeRO-3 or FSDP.
    """

    def __init__(self, batches: int, record: Callable[[dict[str, float]], None]):
        if batches < 2:
            raise ValueError(f"gradient_variance_batches needs at least 2 batches; got {batches}")
        self.batches, self.record = batches, record
        self.seen = 0
        self.mean: torch.Tensor | None = None
        self.squares: torch.Tensor | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.seen >= self.batches or model is None:
            return
        grads = [p.grad.detach().flatten() for p in model.parameters() if p.requires_grad and p.grad is not None]
        if not grads:
            return
        gradient = torch.cat(grads).to("cpu", torch.float64)
        self.seen += 1
        if self.mean is None:
            self.mean, self.squares = gradient.clone(), torch.zeros_like(gradient)
        else:
            delta = gradient - self.mean
            self.mean += delta / self.seen
            self.squares += delta * (gradient - self.mean)
        if self.seen == self.batches:
            self.record(gradient_variance(self.mean, self.squares, self.seen))


def gradient_variance(mean: torch.Tensor, squares: torch.Tensor, n: int) -> dict[str, float]:
    """`gradvar/trace` and `gradvar/relative` from Welford's running mean and sum of squared deviations over `n`
    gradients (see `GradientVariance`)."""
    trace = float(squares.sum() / (n - 1))
    norm = float(mean.square().sum())
    return {"gradvar/trace": trace, "gradvar/relative": trace / norm if norm > 0 else float("inf")}


# ------------------------------------------------------------------------------------------- a run that cannot learn
SIGNAL_WARN_EVERY = 50  # steps between two warnings of the same run (the first window that shows it always warns)


def missing_signal(logs: dict[str, float], max_completion_length: int, max_tool_calling_iterations: int) -> list[str]:
    """What a training log (TRL's metrics averaged over one logging window) says stops the run from learning, each
    with its likely causes and the fields to change; empty when the window has a learning signal. Three cases: every
    completion clipped, no zoom-in call, every advantage 0 (then loss and grad_norm are 0: the policy does not
    move)."""
    reasons = []
    if logs.get("completions/clipped_ratio") == 1:
        reasons.append(
            f"every completion ran into max_completion_length={max_completion_length} without ending its turn: a "
            "policy that never learned the format does not stop (no SFT cold start, or too short a one: start from "
            "`make sft`'s output, or give SFT more max_steps), or the budget holds no call, crop and answer (raise "
            "max_completion_length; lower crop_max_pixels or max_tool_calling_iterations)"
        )
    if logs.get("tools/zoom_calls_per_rollout") == 0:
        reasons.append(
            "no rollout called image_zoom_in_tool: the policy has not learned the tool's format (no SFT cold start, "
            "or too short a one: model_name_or_path should be an SFT checkpoint that writes <tool_call>s)"
            + (", and max_tool_calling_iterations=0 allows none" if max_tool_calling_iterations == 0 else "")
        )
    if logs.get("adv/zero_frac") == 1:
        reasons.append(
            "every advantage is 0 (adv/zero_frac 1), so loss and grad_norm are 0 and the policy does not move: each "
            "group's rewards were equal. The outcome reward never separates them (check that reward_funcs score your "
            "data's answers: rewards/<name>/mean), and R_sem cannot either without zoom-in calls, or with "
            "semantic_beta 0 or advantage_estimator grpo"
        )
    return reasons


# The band the mean sequence importance ratio (`vllm/sequence_ratio`) should stay in: outside it, vLLM's rollouts are
# far enough from the trained policy that a sequence-level correction halves or doubles whole rollouts' weight.
SEQUENCE_RATIO_BAND = (0.5, 2.0)


def sampling_drift(logs: dict[str, float], importance_sampling_mode: str) -> str | None:
    """Why a training log's mean sequence importance ratio (`sampling_mismatch`) left `SEQUENCE_RATIO_BAND`, with the
    likely causes and the fields to change; None inside it, or without vLLM."""
    ratio, offset = logs.get("vllm/sequence_ratio"), logs.get("vllm/logp_offset")
    low, high = SEQUENCE_RATIO_BAND
    if ratio is None or low <= ratio <= high:
        return None
    effect = (
        "it weights each whole rollout's loss by that ratio (truncate: clipped to vllm_importance_sampling_clip_min "
        "and _max; mask: zeroed outside them)"
        if importance_sampling_mode.startswith("sequence")
        else "token_* modes weight each token by its own ratio, which does not compound"
    )
    return (
        f"vLLM's rollouts drift from the trained policy: mean sequence importance ratio {ratio:.3g}, outside "
        f"[{low}, {high}] (per-token offset {offset:+.2g}, trainer minus vLLM; it compounds over a rollout's tokens). "
        f"vllm_importance_sampling_mode={importance_sampling_mode}: {effect}. Likely causes: an engine in another "
        "dtype than the trained weights (vllm_dtype), weights not synced to the engine, or a policy that puts mass on "
        "the banned image placeholders (an untrained one; docs/vllm.md)"
    )


class LearningSignalCheck(TrainerCallback):
    """Warns when a training log shows a run that cannot learn (`missing_signal`) or whose vLLM rollouts drift from
    the policy (`sampling_drift`): at the first such window, then at most once every `every` steps, naming what is
    wrong and the fields to change. Without it, such a run logs zeros in silence (a 7B run from an SFT checkpoint that
    never learned the tool format looks like a slow start)."""

    def __init__(
        self,
        max_completion_length: int,
        max_tool_calling_iterations: int,
        importance_sampling_mode: str = "sequence_mask",
        every: int = SIGNAL_WARN_EVERY,
    ):
        self.budget = (max_completion_length, max_tool_calling_iterations)
        self.mode, self.every, self.warned_at = importance_sampling_mode, every, None
        self.warnings: list[str] = []  # what it warned, for a run's summary

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "adv/zero_frac" not in logs:  # a training step's log
            return
        drift = sampling_drift(logs, self.mode)
        reasons = missing_signal(logs, *self.budget) + ([drift] if drift else [])
        if reasons and (self.warned_at is None or state.global_step - self.warned_at >= self.every):
            self.warned_at = state.global_step
            self.warnings.append(
                f"step {state.global_step}: this run is not learning as it should (next warning in {self.every} "
                "steps at the earliest):\n- " + "\n- ".join(reasons)
            )
            logger.warning(self.warnings[-1])
