"""Diagnostics `MAPOTrainer` logs for every estimator (docs/method.md): advantage statistics, the variance of the
policy gradient (which MAPO and HPO both claim to lower), vLLM's drift, and the warning of a run that cannot learn."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
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


def sampling_mismatch(
    out: dict,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """How far vLLM's rollouts are from the trained policy, over all processes (docs/vllm.md, "Importance
    sampling"; `out`: a generation batch with TRL's `old_per_token_logps` and vLLM's `sampling_per_token_logps`):
    `vllm/logp_offset`, the signed mean over trained tokens of the trainer's logprob minus vLLM's, and
    `vllm/sequence_ratio`, the mean over rollouts of the raw sequence importance ratio, exp(sum of those
    differences); with `gather` (a concatenation over processes), `vllm/sequence_ratio_median`, exp of the median
    over rollouts of that sum: what the drift warning judges, since one token 5 nats off in one rollout of 64 moves
    the mean ratio to ~3.3 (e^5 / 64 + 63/64) and the median not at all. Tokens vLLM did not score (NaN) count as no
    difference, as TRL counts them."""
    mask = trained_token_mask(out).bool()
    diff = torch.nan_to_num(out["old_per_token_logps"] - out["sampling_per_token_logps"], nan=0.0) * mask
    log_ratio = diff.sum(-1).double()
    sequence = log_ratio.exp()
    local = torch.stack([diff.sum().double(), mask.sum().double(), sequence.sum(), sequence.new_tensor(len(sequence))])
    total, tokens, ratios, rows = reduce_sum(local).tolist()
    metrics = {"vllm/logp_offset": total / max(tokens, 1.0), "vllm/sequence_ratio": ratios / max(rows, 1.0)}
    if gather is not None:
        every = gather(log_ratio)
        if every.numel():
            metrics["vllm/sequence_ratio_median"] = math.exp(float(every.median()))  # the lower middle when even
    return metrics


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


PROBE_BATCH_FILE = "variance_probe_rows-{rank}.pt"  # each process's share of the probe's batch, in a checkpoint


def probe_share(rows: int, processes: int, rank: int) -> int:
    """How many of the probe's `rows` rollouts process `rank` of `processes` holds: `rows` in all, spread evenly
    (the first `rows % processes` processes one more), so the batch does not grow with the world size."""
    return rows // processes + (rank < rows % processes)


def checkpoint_folder(args, state) -> str:
    """The checkpoint a resumed run started from: `resume_from_checkpoint` when it names a folder, else the one
    transformers names after the step in `output_dir` (`resume_from_checkpoint: true` resumes from the last)."""
    given = getattr(args, "resume_from_checkpoint", None)
    if isinstance(given, str) and os.path.isdir(given):
        return given
    return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def restore_state(callback: ExportableState, state) -> None:
    """Set `callback`'s attributes from what the checkpoint's trainer_state.json holds for its class (transformers
    writes `callback.state()` there at every save, `ExportableState`), in place: transformers' own restore
    (`restore_callback_states_from_checkpoint`, off by default) rebuilds the callback from its constructor's
    arguments instead. A checkpoint without the entry (an older run) leaves the callback as it is, and gets one, which
    transformers' next save expects."""
    callbacks = state.stateful_callbacks if state.stateful_callbacks is not None else {}
    saved = callbacks.get(type(callback).__name__)
    if isinstance(saved, list):
        saved = saved[0] if saved else None
    if saved is None:
        callbacks[type(callback).__name__] = callback.state()
        state.stateful_callbacks = callbacks
        return
    for name, value in saved.get("attributes", {}).items():
        setattr(callback, name, value)


class GradientVarianceProbe(TrainerCallback, ExportableState):
    """Every `every` steps: per-sample policy-gradient norms on a fixed batch, and their variance.

    The fixed batch holds `rows` rollouts in all, whatever the number of processes: each keeps its share
    (`probe_share`) of the first rollouts of its first generation batch (drawn before any update, so the same across
    estimators for one seed), with the advantages the run's estimator gave them. The gradients are taken with
    `torch.autograd.grad`, so the optimizer's are untouched; they need every parameter whole on each process
    (`sharded_diagnostics`). A callback for its state alone: the step it last probed goes into trainer_state.json
    (`ExportableState`) and each process's share of the batch into the checkpoint folder (`PROBE_BATCH_FILE`), so a
    resumed run probes the same rollouts on the same schedule.
    """

    def __init__(self, every: int, rows: int):
        self.every, self.rows = every, rows
        self.done_at = -1
        self._batch: list[dict] | None = None

    def __call__(self, trainer, out: dict) -> dict[str, float]:
        """`probe/grad_norm_{mean,var}` at a probed step of `trainer` (a `GRPOTrainer`), else nothing."""
        accelerator = trainer.accelerator
        if self._batch is None:
            share = probe_share(self.rows, accelerator.num_processes, accelerator.process_index)
            self._batch = rollout_rows(out, share) if share else []
        step = trainer.state.global_step
        if step % self.every or step == self.done_at:
            return {}
        self.done_at = step
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        norms = []
        for row in self._batch:
            loss = policy_gradient_loss(completion_logps(trainer, row), row["advantages"], trained_token_mask(row))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            norms.append(float(torch.sqrt(sum(g.float().square().sum() for g in grads if g is not None))))
        norms = torch.tensor(gather_object(norms), dtype=torch.float64)  # shares differ by one: objects, not tensors
        if not norms.numel():
            return {}
        return {
            "probe/grad_norm_mean": norms.mean().item(),
            "probe/grad_norm_var": norms.var().item() if norms.numel() > 1 else 0.0,
        }

    def state(self) -> dict:
        return {"args": {"every": self.every, "rows": self.rows}, "attributes": {"done_at": self.done_at}}

    def on_train_begin(self, args, state, control, **kwargs):
        restore_state(self, state)
        if state.global_step == 0 or self._batch is not None:
            return
        path = os.path.join(checkpoint_folder(args, state), PROBE_BATCH_FILE.format(rank=args.process_index))
        if os.path.isfile(path):
            self._batch = torch.load(path, weights_only=True)
        else:
            logger.warning(
                "variance probe: no fixed batch at %s; it is drawn anew from the next generation batch", path
            )

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if self._batch is not None and os.path.isdir(folder):
            torch.save(self._batch, os.path.join(folder, PROBE_BATCH_FILE.format(rank=args.process_index)))


def sharded_diagnostics(variance_probe_steps: int, gradient_variance_batches: int, sharded: str | None) -> list[str]:
    """Why each gradient-variance diagnostic a run asks for cannot run under its backend (`sharded`: "DeepSpeed",
    "FSDP" or None): both need every parameter's gradient whole on each process. The probe takes per-rollout
    gradients of the parameters, which ZeRO-3 and FSDP shard; `GradientVariance` reads `.grad` before each optimizer
    step, where ZeRO and FSDP hold shards and accelerate's DeepSpeed wrapper has already stepped and zeroed them, so
    its `gradvar/*` would silently never appear. `MAPOTrainer` warns each reason at start and leaves those off."""
    if sharded is None:
        return []
    reasons = []
    if variance_probe_steps > 0:
        reasons.append(
            f"variance_probe_steps={variance_probe_steps}: the probe needs unsharded parameters, and {sharded} shards "
            "them; it is off (run it on one process or under DDP)"
        )
    if gradient_variance_batches > 0:
        reasons.append(
            f"gradient_variance_batches={gradient_variance_batches}: gradvar/* needs each process's whole gradient "
            f"before the optimizer step, which {sharded} does not leave there; it is off (run it on one process or "
            "under DDP)"
        )
    return reasons


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
SIGNAL_WARN_EVERY = 50  # steps between two warnings of the same kind (the first window that shows one always warns)
NEARLY_ALL = 0.95  # a window's fraction at or above this counts as "every": exact equality let 0.99 clipped pass
NEARLY_NONE = 0.05  # zoom-in calls per rollout at or below this count as "none"
# The band the median sequence importance ratio (`vllm/sequence_ratio_median`) should stay in under a sequence-level
# importance_sampling_mode: outside it, a sequence-level correction halves or doubles a typical rollout's weight.
SEQUENCE_RATIO_BAND = (0.5, 2.0)
# Under token_* modes each token is weighted by its own ratio: a signed per-token offset (`vllm/logp_offset`) beyond
# this many nats (a 10% weight on every token, one way) is drift; the placeholder ban's offset is ~0.002 (docs/vllm.md).
TOKEN_OFFSET_LIMIT = 0.1
# What the check keeps of each training log; a window's statistic of each: the mean over its steps for fractions and
# rates (bounded, so one log moves it by at most its share of the window), the median over its logs for vLLM's drift.
WINDOW_MEANS = (
    "completions/clipped_ratio",
    "tools/zoom_calls_per_rollout",
    "tools/over_turn_frac",
    "adv/zero_frac",
    "mapo/frac_groups_outcome_all_equal",
)
WINDOW_MEDIANS = ("vllm/sequence_ratio_median", "vllm/logp_offset")


def window_statistics(history: list, steps: int) -> dict[str, float] | None:
    """The statistics of the last `steps` optimizer steps of `history` (the check's `[step, steps it averages, {key:
    value}]` per training log, oldest first), or None while it covers fewer: the mean over steps of each of
    `WINDOW_MEANS` (weighted by the steps each log averages), the median over logs of each of `WINDOW_MEDIANS`
    (robust to one drifted log), and `first_step`/`last_step`. A key no log of the window holds is left out."""
    window, covered = [], 0
    for entry in reversed(history):
        if covered >= steps:
            break
        window.append(entry)
        covered += entry[1]
    if covered < steps:
        return None
    stats = {"first_step": window[-1][0] - window[-1][1] + 1, "last_step": window[0][0]}
    for key in WINDOW_MEANS:
        seen = [(logs[key], span) for _, span, logs in window if logs.get(key) is not None]
        if seen:
            stats[key] = sum(v * w for v, w in seen) / sum(w for _, w in seen)
    for key in WINDOW_MEDIANS:
        seen = sorted(logs[key] for _, _, logs in window if logs.get(key) is not None)
        if seen:
            middle = len(seen) // 2
            stats[key] = seen[middle] if len(seen) % 2 else (seen[middle - 1] + seen[middle]) / 2
    return stats


def missing_signal(
    stats: dict[str, float], max_completion_length: int, max_tool_calling_iterations: int, mask_over_turn: bool = False
) -> list[str]:
    """What a window's statistics (`window_statistics`) say stops the run from learning, each with its likely causes
    and the fields to change; empty when the window has a learning signal. "Every" means at least `NEARLY_ALL` of the
    window, "no" at most `NEARLY_NONE`. Five cases: completions clipped; no zoom-in call; every rollout over-turn under
    `mask_over_turn` (nothing left in the loss, though `adv/zero_frac`, which counts trained tokens only, reads 0);
    every advantage 0 (loss and grad_norm 0: the policy does not move); and, where advantages are not all 0, an
    outcome reward that never separates a group's rollouts (under `mapo` R_sem keeps advantages non-zero, so the
    policy learns to zoom but never to answer)."""
    reasons = []
    clipped, calls = stats.get("completions/clipped_ratio"), stats.get("tools/zoom_calls_per_rollout")
    over, zero = stats.get("tools/over_turn_frac"), stats.get("adv/zero_frac")
    uniform = stats.get("mapo/frac_groups_outcome_all_equal")
    if clipped is not None and clipped >= NEARLY_ALL:
        reasons.append(
            f"{clipped:.0%} of completions ran into max_completion_length={max_completion_length} without ending "
            "their turn: a policy that never learned the format does not stop (no SFT cold start, or too short a one: "
            "start from `make sft`'s output, or give SFT more max_steps), or the budget holds no call, crop and answer "
            "(raise max_completion_length; lower crop_max_pixels or max_tool_calling_iterations)"
        )
    if calls is not None and calls <= NEARLY_NONE:
        reasons.append(
            f"{calls:.2g} zoom-in calls per rollout: the policy has not learned the tool's format (no SFT cold start, "
            "or too short a one: model_name_or_path should be an SFT checkpoint that writes <tool_call>s)"
            + (", and max_tool_calling_iterations=0 allows none" if max_tool_calling_iterations == 0 else "")
        )
    if mask_over_turn and over is not None and over >= NEARLY_ALL:
        reasons.append(
            f"{over:.0%} of rollouts ended over-turn (their last turn a tool call that never ran), and mask_over_turn "
            "takes them out of the loss: nothing is left to train on. Raise max_tool_calling_iterations or "
            "max_completion_length, or turn mask_over_turn off"
        )
    if zero is not None and zero >= NEARLY_ALL:
        reasons.append(
            f"{zero:.0%} of advantages are 0 (adv/zero_frac), so loss and grad_norm are 0 and the policy does not "
            "move: each group's rewards were equal. The outcome reward never separates them (check that reward_funcs "
            "score your data's answers: rewards/<name>/mean), and R_sem cannot either without zoom-in calls, or with "
            "semantic_beta 0 or advantage_estimator grpo"
        )
    elif uniform is not None and uniform >= NEARLY_ALL:
        reasons.append(
            f"the outcome reward is equal within {uniform:.0%} of groups (mapo/frac_groups_outcome_all_equal): the "
            "advantages come from R_sem alone, so the policy learns to zoom but not to answer. Check that "
            "reward_funcs score your data's answers (rewards/<name>/mean: always 0 or always 1?), and whether the "
            "task is too hard or too easy for the checkpoint"
        )
    return reasons


def sampling_drift(stats: dict[str, float], importance_sampling_mode: str) -> str | None:
    """Why vLLM's rollouts drift from the trained policy in a window (`window_statistics`), with the likely causes and
    the fields to change; None when they do not, or without vLLM. Under a sequence-level
    `importance_sampling_mode`, the median sequence ratio outside `SEQUENCE_RATIO_BAND` (a per-token offset of one
    sign compounds over a rollout); under a token-level one, whose weights do not compound, a per-token offset beyond
    `TOKEN_OFFSET_LIMIT`."""
    ratio, offset = stats.get("vllm/sequence_ratio_median"), stats.get("vllm/logp_offset")
    causes = (
        "Likely causes: an engine in another dtype than the trained weights (vllm_dtype), weights not synced to the "
        "engine, or a policy that puts mass on the banned image placeholders (an untrained one; docs/vllm.md)"
    )
    if importance_sampling_mode.startswith("sequence"):
        low, high = SEQUENCE_RATIO_BAND
        if ratio is None or low <= ratio <= high:
            return None
        return (
            f"median sequence importance ratio {ratio:.3g}, outside [{low}, {high}] (per-token offset "
            f"{offset if offset is not None else float('nan'):+.2g}, trainer minus vLLM; it compounds over a "
            f"rollout's tokens). vllm_importance_sampling_mode={importance_sampling_mode} weights each whole rollout's "
            "loss by that ratio (truncate: clipped to vllm_importance_sampling_clip_min and _max; mask: zeroed outside "
            f"them), so long rollouts count for little; a token_* mode weights each token by its own ratio. {causes}"
        )
    if offset is None or abs(offset) <= TOKEN_OFFSET_LIMIT:
        return None
    return (
        f"per-token offset {offset:+.3g} nats (trainer minus vLLM), beyond {TOKEN_OFFSET_LIMIT}: "
        f"vllm_importance_sampling_mode={importance_sampling_mode} weights each token by its own ratio, which "
        f"corrects it, but the rollouts are not the policy's. {causes}"
    )


class LearningSignalCheck(TrainerCallback, ExportableState):
    """Warns when the last `window_steps` optimizer steps show a run that cannot learn (`missing_signal`) or whose
    vLLM rollouts drift from the policy (`sampling_drift`): at the first such window, then at most once every `every`
    steps for each of the two, naming what is wrong and the fields to change. Without it, such a run logs zeros in
    silence (a 7B run from an SFT checkpoint that never learned the tool format looks like a slow start). Judged on a
    window of several steps (`window_statistics`), never on one logging window: a step whose few groups all happen
    to be uniform is common in a healthy run on one GPU. Its window and the steps it warned at survive a resume
    (`ExportableState`; `restore_state`)."""

    def __init__(
        self,
        max_completion_length: int,
        max_tool_calling_iterations: int,
        importance_sampling_mode: str = "sequence_mask",
        every: int = SIGNAL_WARN_EVERY,
        window_steps: int = 10,
        mask_over_turn: bool = False,
    ):
        self.max_completion_length, self.max_tool_calling_iterations = (
            max_completion_length,
            max_tool_calling_iterations,
        )
        self.importance_sampling_mode, self.every = importance_sampling_mode, every
        self.window_steps, self.mask_over_turn = window_steps, mask_over_turn
        self.history: list = []  # [step, steps it averages, {key: value}] per training log, the window's worth
        self.warned_at: dict[str, int] = {}  # the step each kind of warning ("signal", "drift") was last given
        self.warnings: list[str] = []  # what it warned, for a run's summary

    def state(self) -> dict:
        return {
            "args": {
                "max_completion_length": self.max_completion_length,
                "max_tool_calling_iterations": self.max_tool_calling_iterations,
                "importance_sampling_mode": self.importance_sampling_mode,
                "every": self.every,
                "window_steps": self.window_steps,
                "mask_over_turn": self.mask_over_turn,
            },
            "attributes": {"history": self.history, "warned_at": self.warned_at, "warnings": self.warnings},
        }

    def on_train_begin(self, args, state, control, **kwargs):
        restore_state(self, state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "adv/zero_frac" not in logs:  # a training step's log
            return
        step = state.global_step
        span = step - self.history[-1][0] if self.history else min(step, getattr(state, "logging_steps", 1) or 1)
        if span <= 0:
            return
        kept = {key: float(logs[key]) for key in (*WINDOW_MEANS, *WINDOW_MEDIANS) if logs.get(key) is not None}
        self.history.append([step, span, kept])
        while len(self.history) > 1 and sum(entry[1] for entry in self.history[1:]) >= self.window_steps:
            self.history.pop(0)
        stats = window_statistics(self.history, self.window_steps)
        if stats is None or not state.is_world_process_zero:
            return
        first, last = stats["first_step"], stats["last_step"]
        steps = f"step {last}" if first == last else f"steps {first}-{last}"
        reasons = missing_signal(
            stats, self.max_completion_length, self.max_tool_calling_iterations, self.mask_over_turn
        )
        if reasons:
            self._warn(
                "signal", step, f"this run is not learning as it should over {steps}", "\n- " + "\n- ".join(reasons)
            )
        drift = sampling_drift(stats, self.importance_sampling_mode)
        if drift:
            self._warn("drift", step, f"vLLM's rollouts drift from the trained policy over {steps}", " " + drift)

    def _warn(self, kind: str, step: int, headline: str, details: str) -> None:
        last = self.warned_at.get(kind)
        if last is not None and step - last < self.every:
            return
        self.warned_at[kind] = step
        self.warnings.append(
            f"step {step}: {headline} (next such warning in {self.every} steps at the earliest):{details}"
        )
        logger.warning(self.warnings[-1])
