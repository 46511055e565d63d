"""`OverTurnMask` (`mask_over_turn: true`): over-turn rollouts out of the loss, as Mini-o3's `ignore_exceed`; off by
default, when it leaves TRL's batch and loss as they are. Which rollouts are over-turn: `repairs.rollout.over_turn`
(docs/method.md, "Over-turn rollouts")."""

from __future__ import annotations

import torch

# TRL's losses that average over a micro-batch's rows (dr_grpo: rows x max_completion_length), so a row out of the loss
# still counts; `OverTurnMask._compute_loss` renormalises them over the generation batch's rows left in (the others
# count tokens).
ROW_MEAN_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")


class OverTurnMask:
    """Mixin for a `GRPOTrainer` subclass that sets `_over_turn` (this process's rollouts that ended on a tool call
    that never ran) in `_calculate_rewards`. Runs after HPO's advantages (whose clouds keep the rollout, as its group's
    statistics do) and before the trainer's advantage statistics. Overrides `_generate_and_score_completions` and
    `_compute_loss`."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.args.mask_over_turn:
            self._mask_over_turn(out)
        return out

    def _mask_over_turn(self, out: dict) -> None:
        """Take this process's over-turn rollouts (`_calculate_rewards`) out of the loss, as Mini-o3's `ignore_exceed`
        zeroes their response mask: their `tool_mask` rows (the loss mask is `completion_mask * tool_mask`; attention
        keeps `completion_mask`) and their tokens in `num_items_in_batch`, the normaliser TRL computed before. Their
        rewards stay in their groups' statistics, and their advantages are computed, unused. Also `kept_row_scale`,
        the generation batch's rows over its rows kept, both counted over every process: `_compute_loss`'s factor."""
        keep = (~self._over_turn).to(out["completion_mask"].dtype).unsqueeze(1)
        tool_mask = out.get("tool_mask")
        out["tool_mask"] = keep * (torch.ones_like(out["completion_mask"]) if tool_mask is None else tool_mask)
        loss_mask = out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        counts = torch.tensor([len(keep), int(keep.sum())], dtype=torch.float64, device=keep.device)
        rows, kept = self.accelerator.gather(counts).reshape(-1, 2).sum(0).tolist()
        # 0-dim: TRL's shuffle and split hand it whole to every micro-batch of the generation batch (and to each of
        # its num_iterations reuses), where a per-row tensor would be cut with the rows.
        out["kept_row_scale"] = torch.tensor(rows / kept if kept else 1.0, device=keep.device)

    def _compute_loss(self, model, inputs):
        """TRL's loss; with `mask_over_turn` under a loss that averages over rows (`ROW_MEAN_LOSSES`: `grpo`, eq. 3's
        1/|tau_i| then the mean over rollouts), times the generation batch's rows / rows kept (`kept_row_scale`,
        counted over every process), so each kept rollout weighs as if the masked ones had never been generated,
        whatever the split. TRL means each micro-batch over its rows (the masked ones as terms of 0), weights it
        1/gradient_accumulation_steps, and DDP/FSDP/DeepSpeed average the processes: a row of a generation batch of N
        rows weighs 1/N (one optimizer step per generation batch, the default), a kept one N/K x 1/N = 1/K with the
        factor. A factor per micro-batch (rows / kept in it) would weigh a lone survivor of its micro-batch 4 times a
        row of an unmasked one (2 processes x 4 rows x GA 2) and leave a wholly masked micro-batch's weight unspent.
        Without the mask's factor every step's gradient shrinks by the over-turn fraction. Exact while the loss is the
        policy term alone (`MAPOConfig` refuses an entropy bonus beside it; Qwen's VL models have no router loss)."""
        loss = super()._compute_loss(model, inputs)
        scale = inputs.get("kept_row_scale")
        if scale is not None and self.loss_type in ROW_MEAN_LOSSES:
            loss = loss * scale
        return loss
