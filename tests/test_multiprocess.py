"""MAPO under `accelerate launch` with 2 CPU processes (gloo) equals a 1-process run with the same global batch.

This is where slicing and gathering bugs hide: each process generates, runs the tools and scores (CLIP, rewards) only
its own rollouts, TRL gathers the reward columns, normalises within groups, slices the advantages back per process,
and averages the logged metrics over processes. The run (tests/scripts/two_process_mapo.py): the tiny MAPO setup
with forced tool calls, 2 steps, 2 prompts x num_generations 2 per step: 2 processes x per_device 2 against
1 process x per_device 4. The two groups of a step get opposite reward patterns, so a process training on another's
slice of advantages would flip its loss gradient rather than go unnoticed.

Tolerances (`tests/tolerance.py`): float32 on CPU. Rewards that are counts (format, outcome) and the completions must
be equal exactly. R_sem comes from CLIP batches of 2 crops per process against 4 in one process, and the policy's
forward runs on batches of 2 against 4 (other padding, other matmul blocking), and DDP all-reduces two half-batch
gradients: the same sums in another order. The bound is the worst case of the longest chain, 2 steps of a CLIP forward
and the policy's forward and backward (`TOLERANCE`: 5.1e-3 relative, and absolute at the size of an advantage, 1, for
the loss, which is ~5e-8: on-policy GRPO's loss is minus the mean advantage, ~0 by construction); observed
differences are <= 1.3e-6 relative, and the bugs this module looks for (another process's slice, per-rank group
statistics, a flipped sign) move values by 0.1 to 1. The optimizer is SGD: Adam scales each gradient entry by its own
magnitude, so float noise in near-zero entries would become full steps and make step 2 differ by ~1e-3 for no bug.
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
import torch
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_multi_gpu_env

from tests.scripts.two_process_mapo import run
from tests.tolerance import TINY_CLIP_FORWARD, TINY_POLICY_FORWARD, approx, assert_norm_close, tolerance

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

TOLERANCE = tolerance(terms=2 * (2 * TINY_POLICY_FORWARD + TINY_CLIP_FORWARD), scale=1.0)
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


def fsdp_loading_env(config: str = "recipes/accelerate_configs/fsdp2.yaml") -> dict[str, str]:
    """The FSDP variables `accelerate launch --config_file <config>` hands its processes (accelerate's own launch
    code computes them; no GPU needed), fsdp_cpu_ram_efficient_loading among them."""
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", config, "rl.py"]))
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP"}


def launch_two(tmp: Path, runs: dict[str, dict], loading_env: dict[str, str] | None = None) -> dict[str, dict]:
    """`tests/scripts/two_process_mapo.py` under one `accelerate launch` with 2 gloo processes, training each of
    `runs` in turn (after loading the frozen helper models under `loading_env`, if given); what its main process
    logged, by run. A hang (the bug `AgreedToolRounds` prevents) fails at the timeout instead of blocking the suite."""
    result = tmp / "two.json"
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    cmd += ["--config_file", "recipes/accelerate_configs/multi_cpu.yaml", "--main_process_port", str(free_port())]
    cmd += ["tests/scripts/two_process_mapo.py", str(result), "2", json.dumps(runs)]
    cmd += [json.dumps(loading_env)] if loading_env is not None else []
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
# - split: groups of 4 rollouts, 2 on each process: every group is split across the ranks;
# - masked / masked_reference: 1 step of gradient_accumulation_steps 2, 3 of rank 0's 4 rollouts over-turn (one of its
#   micro-batches wholly), with mask_over_turn, and without it but with those rollouts' advantages zeroed.
# Before them, the frozen helper models are loaded under the environment an FSDP launch sets (`fsdp_loading_env`).
OVER_TURN = {"over_turn": True, "gradient_accumulation_steps": 2, "max_steps": 1, "max_grad_norm": 0.0}
TWO_PROCESS_RUNS = {
    "equal": {},
    "synced": {"unequal_depth": True, "synced_gpus": True},
    "plain": {"unequal_depth": True},
    "split": {"num_generations": 4},
    "masked": OVER_TURN | {"mask_over_turn": True, "loss_type": "grpo"},
    "masked_reference": OVER_TURN | {"zero_over_turn_advantages": True, "loss_type": "grpo"},
}


@pytest.fixture(scope="module")
def two_process(tmp_path_factory) -> dict[str, dict]:
    return launch_two(tmp_path_factory.mktemp("two_process"), TWO_PROCESS_RUNS, fsdp_loading_env())


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


def test_masked_over_turn_rollouts_weigh_as_if_absent_whatever_the_split(two_process):
    """Issue 49: `mask_over_turn` at 2 processes x gradient_accumulation_steps 2 x 2 rows. Rank 0's rollouts are 3 of
    4 over-turn, so one of its micro-batches is wholly masked and the other has a lone survivor (whatever TRL's
    shuffle), rank 1's none: 5 of 8 kept. TRL means each micro-batch over its rows, weights it 1/2 and DDP averages the
    2 processes: each row weighs 1/8, a kept one 8/5 x 1/8 = 1/5 with the generation batch's factor, as if the 3 were
    absent. The reference: the same rollouts, nothing masked, the over-turn rows' advantages zeroed (their terms 0):
    its gradient is (1/8) x the kept rows' terms, so the masked run's must be 8/5 times it. The per-micro-batch factor
    it replaces weighed the survivor 2/8 and rank 1's rows 1/8 each: 1.25 times too much in all, unevenly.

    Tolerance: both runs go through the same micro-batches (same seed, same shuffle) and differ only in the factor 1.6
    applied to the loss before the backward pass, whose every rounding it moves: normwise, the backward's reductions
    (`TINY_POLICY_FORWARD`, about the forward's) plus DDP's sum over 2 processes and the 2 micro-batches."""
    masked, reference = two_process["masked"], two_process["masked_reference"]
    for result in (masked, reference):
        assert [p["over_turn"] for p in result["processes"]] == [[[True, True, False, True]], [[False] * 4]]
    assert [p["kept_row_scale"] for p in masked["processes"]] == [[approx(8 / 5, terms=1)]] * 2
    assert [p["kept_row_scale"] for p in reference["processes"]] == [[], []]
    (logged,) = masked["log"]
    assert logged["tools/over_turn_frac"] == 3 / 8
    kept = [not o for p in masked["processes"] for o in p["over_turn"][0]]
    for a, b in zip(masked["steps"][0]["advantages"], reference["steps"][0]["advantages"]):
        assert a == b  # the same rollouts, rewards and group statistics: the mask leaves advantages alone
    assert any(abs(a) > 0.1 for a, k in zip(masked["steps"][0]["advantages"], kept) if k)
    gradient = torch.load(masked["gradient"], weights_only=True)
    unmasked = torch.load(reference["gradient"], weights_only=True)
    assert unmasked.norm() > 0
    assert_norm_close(gradient, 8 / 5 * unmasked, terms=2 * TINY_POLICY_FORWARD + 4)


def test_fsdp_ram_efficient_loading_gives_every_rank_the_helper_models_whole(two_process):
    """Issue 49: with the variables an FSDP launch sets (`fsdp_cpu_ram_efficient_loading: true`, fsdp2.yaml),
    transformers' `from_pretrained` zeroes every parameter on local ranks other than 0, leaving FSDP to broadcast rank
    0's, which it does only for the policy. The control, the text encoder loaded by plain `from_pretrained`, shows
    the environment does that here; HPO's encoder and the CLIP verifier, loaded through `utils.models`, are the same
    weights, byte for byte, on both ranks."""
    env = fsdp_loading_env()
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    loaded = two_process["helper_weights"]
    assert [(w["rank"], w["local_rank"]) for w in loaded] == [(0, "0"), (1, "1")]
    assert loaded[0]["unguarded_encoder"]["abs_sum"] > 0 and loaded[1]["unguarded_encoder"]["abs_sum"] == 0.0
    for name in ("encoder", "clip"):
        assert loaded[0][name] == loaded[1][name] and loaded[0][name]["abs_sum"] > 0, name
    assert loaded[0]["encoder"] == loaded[0]["unguarded_encoder"]  # rank 0 loads the checkpoint's weights either way
