"""The warning of a run that cannot learn, pure, on hand-made training logs: which windows show one
(`window_statistics`, `missing_signal`, `sampling_drift`), how often the callback says so (`LearningSignalCheck`), the
misses and false alarms of its single-window, exact-equality predecessor (issue 49), and the callbacks' state across
a resume. The runs that produce each case: tests/test_mapo_trainer.py (RL) and tests/test_evaluate.py (evaluation)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerState

from evaluation.metrics import no_valid_call
from tests.tolerance import FLOAT64, approx
from utils.diagnostics import (
    PROBE_BATCH_FILE,
    GradientVarianceProbe,
    LearningSignalCheck,
    missing_signal,
    probe_share,
    sampling_drift,
    sampling_mismatch,
    sharded_diagnostics,
    window_statistics,
)

LEARNING = {
    "completions/clipped_ratio": 0.25,
    "tools/zoom_calls_per_rollout": 0.75,
    "tools/over_turn_frac": 0.1,
    "adv/zero_frac": 0.4,
    "mapo/frac_groups_outcome_all_equal": 0.25,
}


def state(step: int, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(is_world_process_zero=main, global_step=step, logging_steps=1, stateful_callbacks={})


def feed(check: LearningSignalCheck, logs: list[dict], first: int = 1) -> list[str]:
    """Hand `check` one training log per step from `first` on; the warnings it gave, by their first line."""
    before = len(check.warnings)
    for step, log in enumerate(logs, start=first):
        check.on_log(None, state(step), None, logs=log)
    return [w.split("\n")[0] for w in check.warnings[before:]]


@pytest.mark.parametrize(
    ("window", "says"),
    [
        ({"completions/clipped_ratio": 0.99}, "99% of completions ran into max_completion_length=320"),
        ({"tools/zoom_calls_per_rollout": 0.02}, "0.02 zoom-in calls per rollout"),
        ({"adv/zero_frac": 0.97}, "97% of advantages are 0"),
        ({"mapo/frac_groups_outcome_all_equal": 1.0}, "the outcome reward is equal within 100% of groups"),
    ],
)
def test_each_case_is_named_with_the_fields_to_change(window, says):
    """The thresholds, not exact equality: 0.99 clipped (which `== 1` let pass) is a run that cannot learn."""
    (reason,) = missing_signal(LEARNING | window, 320, 2)
    assert reason.startswith(says)
    assert missing_signal(LEARNING, 320, 2) == []
    assert missing_signal(LEARNING | {"completions/clipped_ratio": 0.9}, 320, 2) == []  # under the 0.95 threshold
    no_calls = missing_signal({"tools/zoom_calls_per_rollout": 0}, 320, 0)[0]
    assert "max_tool_calling_iterations=0 allows none" in no_calls


def test_every_rollout_over_turn_under_the_mask_is_named_though_no_advantage_reads_0():
    """A miss of the old check: with every rollout over-turn and `mask_over_turn`, no token is trained, so
    `adv/zero_frac` (a fraction of trained tokens, its count clamped to 1) reads 0, and nothing said so."""
    dead = LEARNING | {"tools/over_turn_frac": 1.0, "adv/zero_frac": 0.0}
    (reason,) = missing_signal(dead, 320, 2, mask_over_turn=True)
    assert reason.startswith("100% of rollouts ended over-turn") and "max_tool_calling_iterations" in reason
    assert missing_signal(dead, 320, 2, mask_over_turn=False) == []  # unmasked, they train (on a low reward)


def test_all_zero_advantages_are_named_once_not_again_as_a_uniform_outcome():
    both = LEARNING | {"adv/zero_frac": 1.0, "mapo/frac_groups_outcome_all_equal": 1.0}
    (reason,) = missing_signal(both, 320, 2)
    assert reason.startswith("100% of advantages are 0") and "The outcome reward never separates them" in reason


def test_a_window_is_the_last_steps_mean_for_rates_and_median_for_drift():
    """Hand-worked: logs at steps 2, 4, 5 (spans 2, 2, 1), a window of 3 steps is the last two logs."""
    history = [
        [2, 2, {"adv/zero_frac": 0.0, "vllm/logp_offset": 9.0}],
        [4, 2, {"adv/zero_frac": 1.0, "vllm/logp_offset": -0.5}],
        [5, 1, {"adv/zero_frac": 0.4, "vllm/logp_offset": 0.1}],
    ]
    stats = window_statistics(history, 3)
    assert (stats["first_step"], stats["last_step"]) == (3, 5)
    assert stats["adv/zero_frac"] == approx((2 * 1.0 + 1 * 0.4) / 3, FLOAT64, terms=4)  # two products, sum, divide
    assert stats["vllm/logp_offset"] == approx((-0.5 + 0.1) / 2, FLOAT64, terms=2)  # median of 2: their mean
    assert window_statistics(history, 5)["vllm/logp_offset"] == 0.1  # median of 3: robust to the 9.0
    assert "completions/clipped_ratio" not in stats
    assert window_statistics(history, 6) is None  # the history covers 5 steps: no verdict yet


def test_the_callback_warns_at_the_first_window_then_at_most_every_n_steps(caplog):
    check = LearningSignalCheck(320, 2, every=3, window_steps=2)
    silent = LEARNING | {"adv/zero_frac": 1.0}
    # steps 1-2 learn; 2-3 is half silent (mean 0.7); 3-4 silent: warn; 5 silent (within 3 steps); 7-8 silent: warn
    logs = [LEARNING, LEARNING, silent, silent, silent, LEARNING, silent, silent]
    assert feed(check, logs) == [
        "step 4: this run is not learning as it should over steps 3-4 (next such warning in 3 steps at the earliest):",
        "step 8: this run is not learning as it should over steps 7-8 (next such warning in 3 steps at the earliest):",
    ]
    check.on_log(None, state(9), None, logs={"eval_loss": 0.0})  # not a training log
    check.on_log(None, state(11, main=False), None, logs=silent)  # the window is judged on the main process only
    assert len(check.warnings) == 2 and [r.getMessage() for r in caplog.records] == check.warnings


def test_one_window_of_uniform_groups_under_grpo_on_one_gpu_does_not_warn():
    """A false alarm of the old check: one GPU, grpo, a group or two per step, so a step whose groups all happen to
    be uniform (every advantage 0) is common in a healthy run; it warned at once. Over a window of 10 steps, one
    such step moves the mean zero fraction to 0.46."""
    uniform = LEARNING | {"adv/zero_frac": 1.0, "mapo/frac_groups_outcome_all_equal": 1.0}
    check = LearningSignalCheck(320, 2, window_steps=10)
    assert feed(check, [uniform] + [LEARNING] * 12) == []
    assert feed(check, [uniform] * 10, first=14)[0].startswith("step 23: this run is not learning as it should")


@pytest.mark.parametrize(
    ("dead", "mask", "says"),
    [
        ({"completions/clipped_ratio": 0.99}, False, "99% of completions ran into max_completion_length"),
        ({"tools/over_turn_frac": 1.0, "adv/zero_frac": 0.0}, True, "100% of rollouts ended over-turn"),
        ({"mapo/frac_groups_outcome_all_equal": 1.0, "adv/zero_frac": 0.1}, False, "the outcome reward is equal"),
    ],
    ids=["clipped-0.99", "over-turn", "outcome-never-fires"],
)
def test_the_callback_catches_the_old_checks_misses(dead, mask, says):
    check = LearningSignalCheck(320, 2, window_steps=5, mask_over_turn=mask)
    assert feed(check, [LEARNING | dead] * 5) == [
        "step 5: this run is not learning as it should over steps 1-5 (next such warning in 50 steps at the earliest):"
    ]
    assert check.warnings[0].split("\n- ")[1].startswith(says)


def test_evaluation_says_when_no_call_was_valid():
    call = {"box": None, "error": "label is too long"}
    assert "no sample called image_zoom_in_tool in 2" in no_valid_call([{"calls": []}] * 2, 320, 2)
    rejected = no_valid_call([{"calls": [call, call]}, {"calls": []}], 320, 2)
    assert "all 2 zoom-in calls of 2 samples were rejected, most often (2x) with 'label is too long'" in rejected
    assert no_valid_call([{"calls": [call, {"box": [0, 0, 9, 9], "error": None}]}], 320, 2) is None
    assert no_valid_call([], 320, 2) is None


def test_the_sampling_mismatch_is_signed_and_compounds_over_each_rollout():
    """Hand-worked: row 0 has 3 trained tokens, each 0.1 lower under the trainer than under vLLM (a ban's offset), a
    tool-response token (-1.0, out of the loss) and a pad; row 1 has 2 tokens at +0.05 and one vLLM did not score."""
    old = torch.tensor([[-1.1, -2.1, -3.1, -9.0, 0.0], [-1.0, -2.0, -4.0, 0.0, 0.0]])
    vllm = torch.tensor([[-1.0, -2.0, -3.0, -8.0, 0.0], [-1.05, -2.05, float("nan"), 0.0, 0.0]])
    out = {
        "old_per_token_logps": old,
        "sampling_per_token_logps": vllm,
        "completion_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
        "tool_mask": torch.tensor([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]]),
    }
    got = sampling_mismatch(out, lambda t: t, lambda t: t)
    # float32 differences of logprobs of size <= 4 (each off by 4 eps x 4 at most), summed over <= 3 tokens: the
    # offsets' absolute error is <= ~3 x 16 eps; the exp and the float64 means add nothing at that scale.
    assert got["vllm/logp_offset"] == approx((3 * -0.1 + 2 * 0.05) / 6, terms=48, scale=1.0)
    assert got["vllm/sequence_ratio"] == approx((math.exp(-0.3) + math.exp(0.1)) / 2, terms=48, scale=1.0)
    assert got["vllm/sequence_ratio_median"] == approx(math.exp(-0.3), terms=48, scale=1.0)  # lower middle of 2
    assert "vllm/sequence_ratio_median" not in sampling_mismatch(out, lambda t: t)  # without a gather


def test_one_token_far_off_moves_the_mean_sequence_ratio_but_not_the_median():
    """A false alarm of the old check: one token 5 nats off among 6,400 (64 rollouts of 100 trained tokens) moves
    the mean sequence ratio to (e^5 + 63) / 64 = 3.30, outside [0.5, 2]; the median stays 1 and nothing warns."""
    old = torch.zeros(64, 100)
    old[0, 0] = 5.0
    out = {"old_per_token_logps": old, "sampling_per_token_logps": torch.zeros(64, 100)}
    out["completion_mask"] = torch.ones(64, 100, dtype=torch.long)
    got = sampling_mismatch(out, lambda t: t, lambda t: t)
    assert got["vllm/sequence_ratio"] == approx((math.exp(5) + 63) / 64, terms=4) and got["vllm/sequence_ratio"] > 3.29
    assert got["vllm/sequence_ratio_median"] == 1.0
    check = LearningSignalCheck(320, 2, "sequence_mask", window_steps=1)
    assert feed(check, [LEARNING | got]) == []


def test_a_sequence_ratio_out_of_its_band_is_drift_under_sequence_modes_only():
    assert sampling_drift({"vllm/sequence_ratio_median": 0.75, "vllm/logp_offset": -0.0018}, "sequence_mask") is None
    assert sampling_drift({}, "sequence_mask") is None and sampling_drift({}, "token_truncate") is None  # no vLLM
    low = sampling_drift({"vllm/sequence_ratio_median": 0.3, "vllm/logp_offset": -0.05}, "sequence_truncate")
    assert low.startswith("median sequence importance ratio 0.3, outside [0.5, 2.0]")
    assert "weights each whole rollout's loss by that ratio" in low and "vllm_dtype" in low
    # token_* modes (the recipes'): the same compounded ratio is not drift, a large per-token offset is
    drifted = {"vllm/sequence_ratio_median": 0.3, "vllm/logp_offset": -0.002}
    assert sampling_drift(drifted, "token_truncate") is None
    far = sampling_drift({"vllm/sequence_ratio_median": 1e-9, "vllm/logp_offset": -0.2}, "token_truncate")
    assert far.startswith("per-token offset -0.2 nats") and "weights each token by its own ratio" in far


def test_drift_under_the_recipes_token_mode_never_says_the_run_is_not_learning():
    """A false alarm of the old check: under token_truncate a long rollout's compounded ratio said 'this run is not
    learning as it should'. Now a drift warning is its own, and under token modes only a large per-token offset is
    one."""
    compounded = LEARNING | {"vllm/sequence_ratio_median": 0.3, "vllm/logp_offset": -0.0019}
    assert feed(LearningSignalCheck(320, 2, "token_truncate", window_steps=2), [compounded] * 4) == []
    far = LEARNING | {"vllm/sequence_ratio_median": 1e-9, "vllm/logp_offset": -0.3}
    (warning,) = feed(LearningSignalCheck(320, 2, "token_truncate", window_steps=2), [far] * 2)
    assert warning.startswith("step 2: vLLM's rollouts drift from the trained policy over steps 1-2")
    (warning,) = feed(LearningSignalCheck(320, 2, "sequence_truncate", window_steps=2), [compounded] * 2)
    assert warning.startswith("step 2: vLLM's rollouts drift") and "not learning" not in warning


def test_the_window_and_the_warned_steps_survive_a_resume(tmp_path):
    """The callback's state goes into trainer_state.json (transformers' `ExportableState`) and comes back at
    `on_train_begin`: a run resumed at step 3 warns at the same step, once, as the uninterrupted run."""
    silent = LEARNING | {"adv/zero_frac": 1.0}
    logs = [silent] * 9

    whole = LearningSignalCheck(320, 2, every=5, window_steps=4)
    assert [w.split(" ")[1] for w in feed(whole, logs)] == ["4:", "9:"]

    before = LearningSignalCheck(320, 2, every=5, window_steps=4)
    feed(before, logs[:3])
    saved = TrainerState(global_step=3, stateful_callbacks=[before])
    saved.save_to_json(tmp_path / "trainer_state.json")
    loaded = TrainerState.load_from_json(tmp_path / "trainer_state.json")
    after = LearningSignalCheck(320, 2, every=5, window_steps=4)
    after.on_train_begin(None, loaded, None)
    assert after.history == json.loads(json.dumps(before.history))
    assert [w.split(" ")[1] for w in feed(after, logs[3:], first=4)] == ["4:", "9:"]
    # A checkpoint written before the callback had a state (an older run): nothing to restore, an entry to save into.
    older = TrainerState(global_step=3)
    fresh = LearningSignalCheck(320, 2)
    fresh.on_train_begin(None, older, None)
    assert fresh.history == [] and older.stateful_callbacks["LearningSignalCheck"] == fresh.state()


def test_the_probe_batch_is_global_and_survives_a_resume(tmp_path):
    """`variance_probe_rows` rollouts in all, whatever the world size; each process's share is saved in the
    checkpoint folder beside the step it last probed, and read back on resume."""
    assert [probe_share(8, 3, rank) for rank in range(3)] == [3, 3, 2]
    assert [probe_share(8, 1, 0), sum(probe_share(5, 4, r) for r in range(4)), probe_share(2, 4, 3)] == [8, 5, 0]

    probe = GradientVarianceProbe(every=2, rows=4)
    probe._batch = [{"advantages": torch.tensor([0.5]), "completion_ids": torch.tensor([[3, 4]])}]
    probe.done_at = 2
    args = SimpleNamespace(output_dir=str(tmp_path), process_index=1, resume_from_checkpoint="true")
    (tmp_path / "checkpoint-2").mkdir()
    probe.on_save(args, SimpleNamespace(global_step=2), None)
    assert (tmp_path / "checkpoint-2" / PROBE_BATCH_FILE.format(rank=1)).is_file()

    resumed = GradientVarianceProbe(every=2, rows=4)
    resumed.on_train_begin(args, TrainerState(global_step=2, stateful_callbacks=[probe]), None)
    assert resumed.done_at == 2 and len(resumed._batch) == 1
    assert torch.equal(resumed._batch[0]["completion_ids"], probe._batch[0]["completion_ids"])


def test_gradient_variance_diagnostics_are_refused_under_sharded_backends():
    assert sharded_diagnostics(5, 4, None) == []
    probe, gradvar = sharded_diagnostics(5, 4, "DeepSpeed")
    assert probe.startswith("variance_probe_steps=5: the probe needs unsharded parameters, and DeepSpeed shards them")
    assert gradvar.startswith("gradient_variance_batches=4: gradvar/* needs each process's whole gradient")
    assert sharded_diagnostics(0, 3, "FSDP") == [gradvar.replace("=4", "=3").replace("DeepSpeed", "FSDP")]
