"""MAPO under two processes (CPU, gloo): each process scores only its own rollouts, and rewards are gathered."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_two_processes_score_their_own_rollouts_and_gather(tiny_kit, tmp_path):
    result = tmp_path / "result.json"
    # torchrun, since `accelerate launch --cpu` runs one process; Accelerate reads torchrun's rank variables
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["tests/scripts/two_process_mapo.py", str(result)]
    # Prepend: replacing PYTHONPATH would drop packages a machine installs on it (seen on a GPU machine).
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(result.read_text())
    # 4 rollouts per process (per_device_train_batch_size=4), one forced call each: 4 crops scored on each rank
    assert sorted(p["crops_scored_here"] for p in seen["processes"]) == [4, 4]
    assert seen["semantic_rewards_logged"] == 8  # gathered from both processes
    assert seen["log"]["tools/zoom_calls_per_rollout"] == 1.0
