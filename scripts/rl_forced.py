"""`rl.py` with scripted tool calls and per-step GPU measurements, for `scripts/gpu_check.sh` and the vLLM tests.

The random tiny policy almost never writes a valid tool call, so `rl.py` alone would never score a crop. This runs
`rl.main` unchanged except that its trainer is `ForcedMAPOTrainer`, whose policy's `generate` is wrapped by
`tiny.scripted.force_tool_calls` (a zoom-in call, then an answer; the real generation still runs first), and, with
colocated vLLM, whose engine's calls are wrapped by `tiny.scripted.force_vllm_tool_calls` (the call scripted and
scored by the engine, the answer after the crop sampled by it), so R_sem is really computed under any accelerate
config and either backend.
A callback records each optimizer step's wall time and its peak GPU memory (`torch.cuda.max_memory_allocated`, reset
at each step's start); the summary goes to stdout (a line starting `RL_FORCED`) and to `$GPU_CHECK_JSON` when set.

    accelerate launch --num_processes 1 --config_file recipes/accelerate_configs/zero3.yaml -m scripts.rl_forced \\
        --config recipes/tiny/rl/config_mapo.yaml --model_name_or_path outputs/tiny/qwen2_5_vl --use_cpu false ...
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import ModelConfig

import rl
from configs import ScriptArguments
from mapo_trainer import MAPOConfig, MAPOTrainer
from tiny.scripted import force_tool_calls, force_vllm_tool_calls
from tiny.vllm_server import disk_weight_transfer
from tools import ToolConfig
from utils.diagnostics import LearningSignalCheck
from utils.recipes import parse_args_and_record


class StepMeter(TrainerCallback):
    """Wall time and peak GPU memory of each optimizer step."""

    def __init__(self):
        self.steps: list[dict] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        peak = None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30
        self.steps.append({"step_s": time.perf_counter() - self._start, "peak_gib": peak})


class ForcedMAPOTrainer(MAPOTrainer):
    """`MAPOTrainer` whose policy makes scripted zoom-in calls, measured by `StepMeter`; generation's own peak memory
    is measured apart (the step's peak, then, is that of training after generation)."""

    def __init__(self, *args, model, processing_class, **kwargs):
        config = kwargs["args"]
        depth = rank_depth()
        force_tool_calls(model, processing_class.tokenizer, depth=depth)
        if config.use_vllm and config.vllm_mode == "server" and not torch.cuda.is_available():
            disk_weight_transfer(Path(config.output_dir) / "weights-for-vllm")  # no NCCL without CUDA
        super().__init__(*args, model=model, processing_class=processing_class, **kwargs)
        self.vllm_calls: list[dict] = []
        if self.use_vllm:
            self.vllm_calls = force_vllm_tool_calls(self.vllm_generation, processing_class.tokenizer, depth=depth)
        self.meter = StepMeter()
        self.add_callback(self.meter)
        self.generation_peaks: list[float] = []
        self.logp_offsets: list[dict] = []

    def _generate_and_score_completions(self, inputs):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        out = super()._generate_and_score_completions(inputs)
        if cuda:
            torch.cuda.synchronize()
            self.generation_peaks.append(torch.cuda.max_memory_allocated() / 2**30)
            torch.cuda.reset_peak_memory_stats()  # what follows in the step is training's
        if "sampling_per_token_logps" in out and "old_per_token_logps" in out:
            self.logp_offsets.append(logp_offsets(out))
        return out


def logp_offsets(out: dict) -> dict:
    """The trainer's logprob minus vLLM's, signed, over the scripted first turn's tokens and over the sampled ones.
    The scripted call is scored by the engine with `prompt_logprobs` and no ban (`force_vllm_tool_calls`); sampled
    tokens are drawn with the image placeholders banned, so vLLM reports them renormalised: the scripted tokens are
    the control that has everything (engine, dtype, context) but the ban."""
    old, sampled = out["old_per_token_logps"], out["sampling_per_token_logps"]
    mask = out["completion_mask"].bool()
    tool = out["tool_mask"].bool() if out.get("tool_mask") is not None else mask
    first_response = (~tool & mask).int().argmax(-1)  # where the first tool response starts (0: none)
    positions = torch.arange(mask.shape[1]).unsqueeze(0)
    scripted = mask & tool & (positions < first_response.unsqueeze(1)) & (first_response.unsqueeze(1) > 0)
    rest = mask & tool & ~scripted
    diff = torch.nan_to_num(old - sampled, nan=0.0)
    return {
        "scripted_mean": float(diff[scripted].mean()) if scripted.any() else None,
        "sampled_mean": float(diff[rest].mean()) if rest.any() else None,
        "scripted_tokens": int(scripted.sum()),
        "sampled_tokens": int(rest.sum()),
    }


def rank_depth():
    """`RL_FORCED_DEPTHS` ("2,1": process 0's rollouts make 2 zoom-in calls, process 1's one), for runs whose processes
    must differ in tool depth; unset: one call everywhere."""
    depths = os.environ.get("RL_FORCED_DEPTHS")
    if not depths:
        return None
    depth = int(depths.split(",")[int(os.environ.get("RANK", "0"))])
    return lambda context: depth


def summary(trainer: ForcedMAPOTrainer) -> dict:
    """What the check reports: the run's step times (first step = warm-up), peak memory, and proof R_sem ran."""
    logs = [e for e in trainer.state.log_history if "rewards/semantic/mean" in e]
    ok = bool(logs) and all(
        e.get("tools/zoom_calls_per_rollout", 0) > 0 and not math.isnan(e["rewards/semantic/mean"]) for e in logs
    )
    steps = trainer.meter.steps
    timed = [s["step_s"] for s in steps[1:]] or [s["step_s"] for s in steps]
    peaks = [s["peak_gib"] for s in steps if s["peak_gib"] is not None]
    engine = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    return {
        "ok": ok,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "steps": steps,
        "median_step_s_after_first": statistics.median(timed) if timed else None,
        "peak_memory_gib": max(peaks) if peaks else None,
        "generation_peak_memory_gib": max(trainer.generation_peaks) if trainer.generation_peaks else None,
        "semantic_mean": [e["rewards/semantic/mean"] for e in logs],
        "zoom_calls_per_rollout": [e.get("tools/zoom_calls_per_rollout") for e in logs],
        # vLLM only: its logprobs of the sampled tokens against the trainer's, per step (TRL's metric), and its calls
        "sampling_logp_difference_mean": [e.get("sampling/sampling_logp_difference/mean") for e in logs],
        "sampling_logp_difference_max": [e.get("sampling/sampling_logp_difference/max") for e in logs],
        # vLLM only: the signed offset (trainer minus vLLM), the mean sequence ratio, and the offset split by whether
        # the tokens were scored without the placeholder ban (the scripted call) or sampled with it
        "logp_offset": [e.get("vllm/logp_offset") for e in logs],
        "sequence_ratio": [e.get("vllm/sequence_ratio") for e in logs],
        "logp_offsets_by_origin": trainer.logp_offsets,
        # what the run warned of (utils.diagnostics.LearningSignalCheck)
        "signal_warnings": [
            w for c in trainer.callback_handler.callbacks if isinstance(c, LearningSignalCheck) for w in c.warnings
        ],
        "vllm_calls": trainer.vllm_calls,
        "vllm_weight_pushes": getattr(
            getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None), "_pushes", None
        ),
        # colocate only: how the engine was built (the recipe's vllm_enforce_eager must have reached it)
        "vllm_enforce_eager": engine.llm_engine.model_config.enforce_eager if engine is not None else None,
    }


def main() -> dict:
    parsed = parse_args_and_record((ScriptArguments, MAPOConfig, ModelConfig, ToolConfig))
    trainer = rl.main(*parsed, trainer_cls=ForcedMAPOTrainer)
    result = summary(trainer)
    if trainer.accelerator.is_main_process:
        print("RL_FORCED", "OK" if result["ok"] else "FAIL", json.dumps(result), flush=True)
        if os.environ.get("GPU_CHECK_JSON"):
            Path(os.environ["GPU_CHECK_JSON"]).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
