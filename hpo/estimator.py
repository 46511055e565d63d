"""HPO's wiring into `MAPOTrainer` (`advantage_estimator: hpo | mapo+hpo`): one generation batch's steps embedded,
gathered across processes, transported group by group against their hindsight sets, and mixed with the episode
advantage per token (eq. 17).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from accelerate.utils import gather_object

from hpo.advantages import (
    FALLBACK_REASONS,
    broadcast_to_tokens,
    combine_advantages,
    normalize_step_advantages,
    offline_group_step_advantages,
    online_group_step_advantages,
    unscorable_group,
)
from hpo.steps import StepEncoder, step_segments, turn_index

OFFLINE_CACHE_PROMPTS = 1024  # offline hindsight clouds kept embedded (least recently used dropped): ~0.2 GB at 1024-D


class HPOAdvantages:
    """HPO for `MAPOTrainer`: the text encoder of the intent space, the offline hindsight cache, and eq. 17 over one
    generation batch (`__call__`); `config` is the run's `configs.MAPOConfig` (its `hpo_*` fields)."""

    def __init__(self, config, device: torch.device | str = "cpu"):
        self.config = config
        self.encoder = StepEncoder(config.hpo_text_encoder, device=device, max_length=config.hpo_encoder_max_length)
        self._offline_embeddings: OrderedDict[str, tuple[torch.Tensor, int]] = OrderedDict()  # LRU

    def __call__(
        self,
        inputs: list[dict],
        out: dict,
        *,
        outcome: torch.Tensor,
        num_generations: int,
        tokenizer,
        drop_token_ids: Sequence[int],
        process_index: int,
    ) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """Per-token advantages (B, T) of this process's rollouts (eq. 17, A_E being `out["advantages"]`), the step's
        `hpo/*` metrics, and each gathered rollout's per-turn advantages as text. `out` is TRL's
        `_generate_and_score_completions` output, `outcome` R_out of the whole gathered batch. Embeddings are gathered
        so each group, possibly split across processes, is transported whole, with the same eq. 16 std everywhere.
        """
        args = self.config
        segments = step_segments(
            tokenizer,
            out["prompt_ids"],
            out["prompt_mask"],
            out["completion_ids"],
            out["completion_mask"],
            out.get("tool_mask"),
            drop_token_ids=drop_token_ids,
        )
        steps = gather_object(self.encoder.embed(segments))
        scorable = ~torch.isnan(outcome.cpu())  # unscorable rows (outcome NaN) take no part in HPO: advantage 0
        success = outcome.cpu() >= args.hpo_success_threshold
        if args.hpo_hindsight == "offline":
            offline = gather_object([row.get(args.hpo_hindsight_column) for row in inputs])
            prompts = gather_object([rollout[0] for rollout in segments])
        groups, members = [], []
        for first in range(0, len(steps), num_generations):
            rows = [r for r in range(first, first + num_generations) if scorable[r]]
            members.append(rows)
            if not rows:
                groups.append(unscorable_group(args.hpo_hindsight))
                continue
            emb = torch.cat([steps[r] for r in rows])
            rollout = torch.cat([torch.full((len(steps[r]),), k) for k, r in enumerate(rows)])
            step = torch.cat([torch.arange(len(steps[r])) for r in rows])
            if args.hpo_hindsight == "online":
                group = online_group_step_advantages(
                    emb,
                    rollout,
                    step,
                    success[rows],
                    min_positive=args.hpo_min_positive_steps,
                    min_negative=args.hpo_min_negative_steps,
                    solver=args.hpo_solver,
                )
            else:
                hindsight, n_off = self._offline_hindsight(offline[first], prompts[first], row=first)
                group = offline_group_step_advantages(
                    emb, step, hindsight, n_off, max_off_trajectories=args.hpo_max_offline_trajectories,
                    solver=args.hpo_solver,
                )  # fmt: skip
            groups.append(group)
        batch = normalize_step_advantages(groups)
        per_row = [torch.zeros(len(s), dtype=torch.float64) for s in steps]  # A_S; 0 for unscorable rows
        fallback = [False] * len(steps)
        for rows, values, fell_back in zip(members, batch.values, batch.fallback):
            for r, v in zip(rows, values.split([len(steps[r]) for r in rows])):
                per_row[r], fallback[r] = v, fell_back
        local = slice(process_index * len(inputs), (process_index + 1) * len(inputs))
        turns = turn_index(out["completion_mask"], out.get("tool_mask"))
        step_adv = broadcast_to_tokens(per_row[local], turns)
        # [code] a fallback group has A_S = 0, so it gets A_E / (1 + omega); 'unscaled' gives it A_E itself.
        episode_only = fallback[local] if args.hpo_fallback == "unscaled" else None
        advantages = combine_advantages(out["advantages"], step_adv, args.hpo_omega, episode_only=episode_only)
        advantages[~scorable[local].to(advantages.device)] = 0.0  # as stock GRPO: no signal from a row not scored

        used = [g.w1 for g in groups if not g.fallback]
        metrics = {
            "hpo/fallback_frac": batch.n_fallback / len(groups),
            "hpo/step_adv_sigma": batch.sigma,
            "hpo/w1": sum(used) / len(used) if used else 0.0,
        }
        for reason in FALLBACK_REASONS:
            metrics[f"hpo/fallback/{reason}"] = sum(reason in g.reasons for g in groups) / len(groups)
        a_e = gather_object(out["advantages"].tolist())
        turn_values = []
        for a, values, fell_back, ok in zip(a_e, per_row, fallback, scorable.tolist()):
            if not ok:
                shown = [0.0] * (len(values) - 1)
            elif fell_back and args.hpo_fallback == "unscaled":
                shown = [a] * (len(values) - 1)
            else:
                shown = [(a + args.hpo_omega * v) / (1 + args.hpo_omega) for v in values[1:].tolist()]
            turn_values.append(" | ".join(f"{x:.3f}" for x in shown))
        return advantages.to(out["advantages"].dtype), metrics, turn_values

    def _offline_hindsight(self, trajectories, prompt_segment: str, row: int) -> tuple[torch.Tensor, int]:
        """One prompt's offline hindsight cloud (every step of its stored successful trajectories, the prompt included;
        texts embedded once, cached LRU) and how many trajectories it holds."""
        column = self.config.hpo_hindsight_column
        trajectories = [t for t in trajectories or [] if t]
        if not trajectories:
            return torch.zeros(0, self.encoder.width), 0
        if all(isinstance(step, str) for trajectory in trajectories for step in trajectory):
            key = prompt_segment + "\x00" + "\x00".join("\x01".join(t) for t in trajectories)
            cache = self._offline_embeddings
            if key in cache:
                cache.move_to_end(key)
            else:
                embedded = self.encoder.embed([[prompt_segment, *t] for t in trajectories])
                cache[key] = (torch.cat(embedded), len(trajectories))
                if len(cache) > OFFLINE_CACHE_PROMPTS:
                    cache.popitem(last=False)
            return cache[key]
        steps = torch.tensor([step for trajectory in trajectories for step in trajectory], dtype=torch.float32)
        if steps.dim() != 2 or steps.shape[1] != self.encoder.width:
            raise ValueError(
                f"column {column!r}, row {row}: stored step embeddings have width "
                f"{steps.shape[-1] if steps.dim() else 0}, the text encoder {self.config.hpo_text_encoder!r} "
                f"{self.encoder.width}: embed the offline set with the same encoder, or store step texts"
            )
        return steps, len(trajectories)
