"""MAPO under `accelerate launch` with 2 CPU processes (gloo) equals a 1-process run with the same global batch.

This is where slicing and gathering bugs hide: each process generates, runs the tools and scores (CLIP, rewards) only
its own rollouts, TRL gathers the reward columns, normalises within groups, slices the advantages back per process,
and averages the logged metrics over processes. The run (tests/scripts/two_process_mapo.py): the tiny MAPO setup
with forced tool calls, 2 steps, 2 prompts x num_generations 2 per step: 2 processes x per_device 2 against
1 process x per_device 4. The two groups of a step get opposite reward patterns, so a process training on another's
slice of advantages would flip its loss gradient rather than go unnoticed.

Tolerances: float32 on CPU. Rewards that are counts (format, outcome) and the completions must be equal exactly.
R_sem comes from CLIP batches of 2 crops per process against 4 in one process, and the policy's forward runs on
batches of 2 against 4 (other padding, other matmul blocking), and DDP all-reduces two half-batch gradients: the
same sums in another order. Observed differences are <= 1.3e-6 relative; the bound is 1e-5 relative (1e-6 absolute,
for the loss, which is ~5e-8: on-policy GRPO's loss is minus the mean advantage, ~0 by construction). The optimizer
is SGD: Adam scales each gradient entry by its own magnitude, so float noise in near-zero entries would become full
steps and make step 2 differ by ~1e-3 for no bug.
"""

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts.two_process_mapo import run

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

TOLERANCE = {"rel": 1e-5, "abs": 1e-6}
LAUNCH_TIMEOUT_S = 900  # the launch of all 4 runs takes ~2 min on 2 idle cores
# Wall-clock metrics, not functions of the batch.
TIMINGS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def without_addresses(texts: list[str]) -> list[str]:
    """Completions as logged hold PIL images, printed with their memory address."""
    return [re.sub(r" at 0x[0-9a-fA-F]+", "", text) for text in texts]


def launch_two(tmp: Path, runs: dict[str, dict]) -> dict[str, dict]:
    """`tests/scripts/two_process_mapo.py` under one `accelerate launch` with 2 gloo processes, training each of
    `runs` in turn; what its main process logged, by run. A hang (the bug `AgreedToolRounds` prevents) fails at the
    timeout instead of blocking the suite."""
    result = tmp / "two.json"
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    cmd += ["--config_file", "recipes/accelerate_configs/multi_cpu.yaml", "--main_process_port", str(free_port())]
    cmd += ["tests/scripts/two_process_mapo.py", str(result), "2", json.dumps(runs)]
    # Prepend: replacing PYTHONPATH would drop packages a machine installs on it (seen on a GPU machine).
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks: a hung rank must not outlive the test
        proc.communicate()
        raise AssertionError(f"2-process runs {list(runs)} did not finish in {LAUNCH_TIMEOUT_S} s (a hang?)") from err
    assert proc.returncode == 0, f"{stdout[-2000:]}\n{stderr[-4000:]}"
    return json.loads(result.read_text())


# Every 2-process run of this module, trained in turn by ONE launch:
# - equal: the plain setup;
# - synced / plain: rank 0's rollouts zoom in twice, rank 1's once, with synchronized generation (as ZeRO-3/FSDP turn
#   it on) and without;
# - split: groups of 4 rollouts, 2 on each process: every group is split across the ranks.
TWO_PROCESS_RUNS = {
    "equal": {},
    "synced": {"unequal_depth": True, "synced_gpus": True},
    "plain": {"unequal_depth": True},
    "split": {"num_generations": 4},
}


@pytest.fixture(scope="module")
def two_process(tmp_path_factory) -> dict[str, dict]:
    return launch_two(tmp_path_factory.mktemp("two_process"), TWO_PROCESS_RUNS)


def one_process(tiny_kit, tmp_path_factory, name: str, **config) -> dict:
    """The same run in this process, with the same global batch (1 x 4)."""
    return run(tmp_path_factory.mktemp(name), per_device=4, kit_dir=tiny_kit["policy"].parent, **config)


@pytest.fixture(scope="module")
def runs(tiny_kit, tmp_path_factory, two_process):
    return one_process(tiny_kit, tmp_path_factory, "one_equal"), two_process["equal"]


@pytest.fixture(scope="module")
def unequal_depth_runs(tiny_kit, tmp_path_factory, two_process):
    one = one_process(tiny_kit, tmp_path_factory, "one_unequal", unequal_depth=True)
    return one, two_process["plain"], two_process["synced"]


@pytest.fixture(scope="module")
def split_group_runs(tiny_kit, tmp_path_factory, two_process):
    return one_process(tiny_kit, tmp_path_factory, "one_split", num_generations=4), two_process["split"]


def assert_sliced_like_one_process(one: dict, two: dict) -> None:
    """Each process trained on its own rows' advantages: rank r's, after TRL's slicing, equal the single process's
    rows [2r, 2r + 2) of the same step."""
    (single,) = one["processes"]
    for rank, process in enumerate(two["processes"]):
        assert process["rank"] == rank and len(process["sliced_advantages"]) == len(single["sliced_advantages"])
        for step, (mine, whole) in enumerate(zip(process["sliced_advantages"], single["sliced_advantages"])):
            assert mine == pytest.approx(whole[2 * rank : 2 * rank + 2], **TOLERANCE), (rank, step)


def test_two_processes_each_score_their_own_rollouts(runs):
    one, two = runs
    assert (one["num_processes"], two["num_processes"]) == (1, 2)
    # 2 steps x 2 rollouts per process, one forced call each: every crop scored once, by the process that made it
    assert [p["crops_scored_here"] for p in two["processes"]] == [4, 4]
    assert [p["crops_scored_here"] for p in one["processes"]] == [8]


def test_rewards_r_sem_and_advantages_equal_one_process(runs):
    one, two = runs
    assert len(one["steps"]) == len(two["steps"]) == 2
    for step, (a, b) in enumerate(zip(one["steps"], two["steps"])):
        assert without_addresses(a["completions"]) == without_addresses(b["completions"]), step
        assert a["zoom_labels"] == b["zoom_labels"] and a["z_t"] == b["z_t"], step
        assert set(a["rewards"]) == set(b["rewards"]) == {"outcome_reward", "flipped_format", "semantic"}
        for name in ("outcome_reward", "flipped_format"):
            assert a["rewards"][name] == b["rewards"][name], (step, name)
        assert b["rewards"]["semantic"] == pytest.approx(a["rewards"]["semantic"], **TOLERANCE), step
        assert b["advantages"] == pytest.approx(a["advantages"], **TOLERANCE), step
        # The precondition of the slicing check: the step's two groups (one per process) have opposite advantages.
        assert a["advantages"][0] == pytest.approx(-a["advantages"][2], abs=1e-3) and abs(a["advantages"][0]) > 0.5


def test_each_process_trains_on_its_own_slice_of_advantages(runs, unequal_depth_runs, split_group_runs):
    assert_sliced_like_one_process(*runs)
    one, plain, synced = unequal_depth_runs
    assert_sliced_like_one_process(one, plain)
    assert_sliced_like_one_process(one, synced)
    one, two = split_group_runs
    assert_sliced_like_one_process(one, two)
    # A group split across ranks is normalised whole: per-rank statistics would give other values.
    assert two["steps"][0]["advantages"] == pytest.approx(one["steps"][0]["advantages"], **TOLERANCE)
    assert max(abs(a) for a in one["steps"][0]["advantages"]) > 0.5


def test_logged_metrics_equal_one_process(runs):
    one, two = runs
    assert [e["step"] for e in one["log"]] == [e["step"] for e in two["log"]] == [1, 2]
    for a, b in zip(one["log"], two["log"]):
        assert set(a) == set(b)
        for key in sorted(set(a) - TIMINGS):
            if isinstance(a[key], float) and math.isnan(a[key]):
                assert math.isnan(b[key]), key
            else:
                assert b[key] == pytest.approx(a[key], **TOLERANCE), (a["step"], key)
    assert one["log"][0]["tools/zoom_calls_per_rollout"] == 1.0 and one["log"][0]["grad_norm"] > 0


def test_unequal_tool_depth_under_synchronized_generation_finishes_and_changes_nothing(unequal_depth_runs):
    one, plain, synced = unequal_depth_runs
    calls = [[e["tools/zoom_calls_per_rollout"] for e in run["log"]] for run in (one, plain, synced)]
    assert calls == [[1.5, 1.5]] * 3  # two rollouts of 2 calls and two of 1 per step: the depths really differ
    for step, (a, b, c) in enumerate(zip(one["steps"], plain["steps"], synced["steps"])):
        assert without_addresses(b["completions"]) == without_addresses(c["completions"]), step
        assert b["advantages"] == c["advantages"] and b["rewards"] == c["rewards"], step
        assert without_addresses(a["completions"]) == without_addresses(b["completions"]), step
        assert b["advantages"] == pytest.approx(a["advantages"], **TOLERANCE), step
    for a, b, c in zip(one["log"], plain["log"], synced["log"]):
        assert set(a) == set(b) == set(c)
        for key in sorted(set(a) - TIMINGS):
            if isinstance(a[key], float) and math.isnan(a[key]):
                assert math.isnan(b[key]) and math.isnan(c[key]), key
            else:
                assert c[key] == b[key] and b[key] == pytest.approx(a[key], **TOLERANCE), (a["step"], key)
