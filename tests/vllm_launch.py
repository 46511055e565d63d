"""What the real-vLLM test files share (tests/test_vllm.py, tests/test_vllm_server.py): the engines' environment, a
free port, and `accelerate launch` of `scripts.rl_forced` as `make rl` runs it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1500  # engine start ~5 s (eager) and 2 steps ~10 s each on 2 idle cores, plus ~25 s of imports


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
