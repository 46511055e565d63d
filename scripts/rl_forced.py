"""`rl.py` with scripted tool calls and per-step GPU measurements, for `scripts/gpu_check.sh` and the vLLM tests.

The random tiny policy almost never writes a valid tool call, so `rl.py` alone would never score a crop: this runs
`rl.main` unchanged but for its trainer, `tiny.scripted.ForcedMAPOTrainer`. The summary goes to stdout (a line
starting `RL_FORCED`) and to `$GPU_CHECK_JSON` when set.

    accelerate launch --num_processes 1 --config_file recipes/accelerate_configs/zero3.yaml -m scripts.rl_forced \\
        --config recipes/tiny/rl/config_mapo.yaml --model_name_or_path outputs/tiny/qwen2_5_vl --use_cpu false ...
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from accelerate import PartialState
from trl import ModelConfig

import rl
from configs import MAPOConfig, ScriptArguments
from tiny.scripted import ForcedMAPOTrainer
from tools import ToolConfig
from utils.diagnostics import LearningSignalCheck
from utils.recipes import parse_args_and_record


def summary(trainer: ForcedMAPOTrainer) -> dict:
    """What the check reports: the run's step times (first step = warm-up), peak memory, and proof R_sem ran."""
    logs = [e for e in trainer.state.log_history if "rewards/semantic/mean" in e]
    ok = bool(logs) and all(
        e.get("tools/zoom_calls_per_rollout", 0) > 0 and not math.isnan(e["rewards/semantic/mean"]) for e in logs
    )
    steps = trainer.meter.steps
    timed = [s["step_s"] for s in steps[1:]] or [s["step_s"] for s in steps]
    peaks = [s["peak_gib"] for s in steps if s["peak_gib"] is not None]
    vllm_generation = getattr(trainer, "vllm_generation", None)
    engine = getattr(vllm_generation, "llm", None)
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
        # vLLM only: the signed offset (trainer minus vLLM), the mean and median sequence ratio, and the offset split by
        # whether the tokens were scored without the placeholder ban (the scripted call) or sampled with it
        "logp_offset": [e.get("vllm/logp_offset") for e in logs],
        "sequence_ratio": [e.get("vllm/sequence_ratio") for e in logs],
        "sequence_ratio_median": [e.get("vllm/sequence_ratio_median") for e in logs],
        "logp_offsets_by_origin": trainer.logp_offsets,
        "signal_warnings": [
            w for c in trainer.callback_handler.callbacks if isinstance(c, LearningSignalCheck) for w in c.warnings
        ],
        "vllm_calls": trainer.vllm_calls,
        "vllm_weight_pushes": getattr(getattr(vllm_generation, "vllm_client", None), "_pushes", None),
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
    # Tear the process group down before the interpreter does: left to exit, a still-joinable c10d thread aborted a
    # rank that finished first ("terminate called without an active exception", exit -6) while rank 0 was saving.
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
