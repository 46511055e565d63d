"""The warning of a run that cannot learn, pure: which training logs show one (`missing_signal`), and how often the
callback says so (`LearningSignalCheck`). The runs that produce each case: tests/test_mapo_trainer.py (RL) and
tests/test_evaluate.py (evaluation)."""

import math
from types import SimpleNamespace

import pytest
import torch

from evaluation.metrics import no_valid_call
from utils.diagnostics import LearningSignalCheck, missing_signal, sampling_drift, sampling_mismatch

LEARNING = {"completions/clipped_ratio": 0.25, "tools/zoom_calls_per_rollout": 0.75, "adv/zero_frac": 0.4}


@pytest.mark.parametrize(
    ("window", "says"),
    [
        ({"completions/clipped_ratio": 1.0}, "every completion ran into max_completion_length=320"),
        ({"tools/zoom_calls_per_rollout": 0.0}, "no rollout called image_zoom_in_tool"),
        ({"adv/zero_frac": 1.0}, "every advantage is 0"),
    ],
)
def test_each_case_is_named_with_the_fields_to_change(window, says):
    (reason,) = missing_signal(LEARNING | window, 320, 2)
    assert reason.startswith(says)
    assert missing_signal(LEARNING, 320, 2) == []
    # a window averages its steps: one step with a call, one without, is a window with calls
    assert missing_signal(LEARNING | {"tools/zoom_calls_per_rollout": 0.5}, 320, 2) == []
    assert (
        "max_tool_calling_iterations=0 allows none" in missing_signal({"tools/zoom_calls_per_rollout": 0}, 320, 0)[0]
    )


def test_the_callback_warns_at_the_first_window_then_at_most_every_n_steps(caplog):
    check = LearningSignalCheck(320, 2, every=3)
    silent = LEARNING | {"adv/zero_frac": 1.0}
    for step, logs in enumerate([LEARNING, silent, silent, silent, LEARNING, silent, silent], start=1):
        check.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=step), None, logs=logs)
    check.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=9), None, logs={"eval_loss": 0.0})
    check.on_log(None, SimpleNamespace(is_world_process_zero=False, global_step=10), None, logs=silent)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["step 2", "step 6"]


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
    got = sampling_mismatch(out, lambda t: t)
    assert got["vllm/logp_offset"] == pytest.approx((3 * -0.1 + 2 * 0.05) / 6, abs=1e-6)
    assert got["vllm/sequence_ratio"] == pytest.approx((math.exp(-0.3) + math.exp(0.1)) / 2, abs=1e-6)


def test_a_sequence_ratio_out_of_its_band_is_named_with_its_causes():
    assert sampling_drift({"vllm/sequence_ratio": 0.75, "vllm/logp_offset": -0.0018}, "sequence_mask") is None
    assert sampling_drift({}, "sequence_mask") is None  # no vLLM
    low = sampling_drift({"vllm/sequence_ratio": 0.3, "vllm/logp_offset": -0.05}, "sequence_truncate")
    assert low.startswith("vLLM's rollouts drift from the trained policy: mean sequence importance ratio 0.3, outside")
    assert "it weights each whole rollout's loss by that ratio" in low and "vllm_dtype" in low
    high = sampling_drift({"vllm/sequence_ratio": 2.5, "vllm/logp_offset": 0.01}, "token_truncate")
    assert "token_* modes weight each token by its own ratio, which does not compound" in high
    check = LearningSignalCheck(320, 2, "token_truncate")
    logs = LEARNING | {"vllm/sequence_ratio": 0.3, "vllm/logp_offset": -0.05}
    assert missing_signal(logs, 320, 2) == []  # a run that learns, from drifted rollouts: the callback still warns
    check.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=1), None, logs=logs)
    assert check.warned_at == 1
