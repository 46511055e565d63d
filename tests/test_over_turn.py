"""Over-turn rollouts (`mask_over_turn`), pure: which rollouts end on a tool call that never ran, and how their rows
leave the loss beside TRL's own masks. The tiny training run is in tests/test_mapo_trainer.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from configs import MAPOConfig
from mapo_trainer import MAPOTrainer
from repairs.rollout import over_turn

CALL = {"type": "function", "function": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 9, 9]}}}
TOOL = {"role": "tool", "name": "image_zoom_in_tool", "content": [{"type": "image", "image": None}]}


def test_a_rollout_is_over_turn_when_its_last_turn_calls_a_tool_that_never_ran():
    answered = [
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        TOOL,
        {"role": "assistant", "content": "A"},
    ]
    limit = [
        *answered[:2],
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ]  # the call after the last round
    dropped = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]  # its response rolled back for length
    cut = [*answered[:2]]  # the post-tool turn truncated to nothing: no EOS, TRL's mask_truncated_completions' case
    assert [over_turn(c) for c in (answered, limit, dropped, cut)] == [False, True, True, False]
    assert not over_turn("<answer>A</answer>") and not over_turn([])  # plain-text completions: never
    assert not over_turn([{"role": "assistant", "content": "A", "tool_calls": []}])


def test_masking_keeps_attention_and_trls_own_masks_and_recounts_the_normaliser():
    """Row 1 is over-turn; row 2 was already masked by TRL (`mask_truncated_completions`); row 0 trains, less its
    tool-response token. The loss mask is the product of both masks, and `num_items_in_batch` counts what is left."""
    trainer = SimpleNamespace(
        _over_turn=torch.tensor([False, True, False]), accelerator=SimpleNamespace(gather=lambda t: t.reshape(1))
    )
    out = {
        "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0]]),
        "num_items_in_batch": torch.tensor(5),
    }
    MAPOTrainer._mask_over_turn(trainer, out)
    assert out["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]  # attention unchanged
    assert out["tool_mask"].tolist() == [[1, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert int(out["num_items_in_batch"]) == 2
    no_tools = {"completion_mask": torch.ones(3, 2, dtype=torch.long), "num_items_in_batch": torch.tensor(6)}
    MAPOTrainer._mask_over_turn(trainer, no_tools)
    assert no_tools["tool_mask"].tolist() == [[1, 1], [0, 0], [1, 1]] and int(no_tools["num_items_in_batch"]) == 4


def test_over_turn_masking_is_off_by_default():
    assert MAPOConfig(output_dir="unused", use_cpu=True, bf16=False).mask_over_turn is False


def test_the_row_renormalisation_is_refused_beside_an_entropy_bonus():
    """Under a loss that averages over rollouts, `mask_over_turn` rescales each micro-batch's loss to the rollouts left
    in it (`MAPOTrainer._compute_loss`): TRL's entropy bonus, added to that loss, would be rescaled with it."""
    base = {"output_dir": "unused", "use_cpu": True, "bf16": False, "mask_over_turn": True}
    with pytest.raises(ValueError, match="entropy bonus too: set entropy_coef: 0"):
        MAPOConfig(**base, loss_type="grpo", entropy_coef=0.01)
    assert MAPOConfig(**base, loss_type="dapo", entropy_coef=0.01).entropy_coef == 0.01  # token-normalised: no rescale
    assert MAPOConfig(**base, loss_type="grpo").mask_over_turn
