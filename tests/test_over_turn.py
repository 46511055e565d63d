"""Over-turn rollouts (`mask_over_turn`), pure: which rollouts end on a tool call that never ran, and how their rows
leave the loss beside TRL's own masks. The tiny training run is in tests/test_mapo_trainer.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from configs import MAPOConfig
from mapo_trainer import MAPOTrainer
from repairs.rollout import over_turn
from tests.tolerance import FLOAT32, approx

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
        _over_turn=torch.tensor([False, True, False]), accelerator=SimpleNamespace(gather=lambda t: t)
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
    assert out["kept_row_scale"].dim() == 0 and float(out["kept_row_scale"]) == 1.5  # 3 rows, 2 left: exact
    no_tools = {"completion_mask": torch.ones(3, 2, dtype=torch.long), "num_items_in_batch": torch.tensor(6)}
    MAPOTrainer._mask_over_turn(trainer, no_tools)
    assert no_tools["tool_mask"].tolist() == [[1, 1], [0, 0], [1, 1]] and int(no_tools["num_items_in_batch"]) == 4


def test_the_row_factor_counts_the_generation_batch_over_every_process():
    """The issue-49 case: 2 processes x gradient_accumulation_steps 2 x 4 rows, 9 of 16 kept. This process (rank 0)
    holds 8 rows, 1 kept (a lone survivor beside a wholly masked micro-batch, whatever TRL's shuffle); the other
    process's counts (8 rows, 8 kept) arrive through the gather. One factor for every micro-batch: 16 / 9, so each
    kept row weighs (1/2 processes) x (1/2 micro-batches) x (1/4 rows) x 16/9 = 1/9, as if the 7 masked rows were
    absent. The per-micro-batch factor it replaces gave the survivor 1/16 x 4 = 0.25 and the other 8 kept 1/16 each."""
    other = torch.tensor([8.0, 8.0], dtype=torch.float64)
    gather = lambda t: torch.cat([t.reshape(-1), other]) if t.dim() else t  # noqa: E731 - counts, then token sums
    trainer = SimpleNamespace(
        _over_turn=torch.tensor([True] * 7 + [False]), accelerator=SimpleNamespace(gather=gather)
    )
    out = {"completion_mask": torch.ones(8, 3, dtype=torch.long), "num_items_in_batch": torch.tensor(48)}
    MAPOTrainer._mask_over_turn(trainer, out)
    # 16 / 9 rounded to float64, then to the loss's float32: within one float32 eps; the weights' float64 products
    # add a few float64 eps, nothing at that scale.
    assert float(out["kept_row_scale"]) == approx(16 / 9, FLOAT32, terms=1)
    weight = (1 / 2) * (1 / 2) * (1 / 4) * float(out["kept_row_scale"])
    assert 9 * weight == approx(1.0, FLOAT32, terms=1)

    # Every row over-turn: nothing is trained, and the factor is 1 rather than a division by zero.
    trainer = SimpleNamespace(_over_turn=torch.tensor([True, True]), accelerator=SimpleNamespace(gather=lambda t: t))
    out = {"completion_mask": torch.ones(2, 3, dtype=torch.long), "num_items_in_batch": torch.tensor(6)}
    MAPOTrainer._mask_over_turn(trainer, out)
    assert float(out["kept_row_scale"]) == 1.0 and int(out["num_items_in_batch"]) == 0


def test_over_turn_masking_is_off_by_default():
    assert MAPOConfig(output_dir="unused", use_cpu=True, bf16=False).mask_over_turn is False


def test_the_row_renormalisation_is_refused_beside_an_entropy_bonus():
    """Under a loss that averages over rollouts, `mask_over_turn` rescales the loss to the generation batch's rollouts
    left in it (`MAPOTrainer._compute_loss`): TRL's entropy bonus, added to that loss, would be rescaled with it."""
    base = {"output_dir": "unused", "use_cpu": True, "bf16": False, "mask_over_turn": True}
    with pytest.raises(ValueError, match="entropy bonus too: set entropy_coef: 0"):
        MAPOConfig(**base, loss_type="grpo", entropy_coef=0.01)
    assert MAPOConfig(**base, loss_type="dapo", entropy_coef=0.01).entropy_coef == 0.01  # token-normalised: no rescale
    assert MAPOConfig(**base, loss_type="grpo").mask_over_turn
