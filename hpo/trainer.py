"""`HPOSteps`: HPO's step advantage composed into `MAPOTrainer` (`advantage_estimator: hpo | mapo+hpo`); under any
other estimator it builds nothing and leaves TRL's advantages as they are."""

from __future__ import annotations

from hpo.estimator import HPOAdvantages


class HPOSteps:
    """Mixin for a `GRPOTrainer` subclass that sets `_outcome` (each rollout's R_out, gathered) in
    `_calculate_rewards`: TRL's advantages replaced by per-token ones (HPO eq. 17), its figures logged (`hpo/*`, the
    `turn_advantages` column). It runs right after TRL's rollouts and advantages, before the trainer's own
    post-processing (the over-turn mask, the advantage statistics). Overrides `_generate_and_score_completions`."""

    hpo: HPOAdvantages | None = None

    def _build_hpo(self) -> None:
        """HPO's estimator and its step encoder, under `hpo` and `mapo+hpo` only (the trainer's `__init__` calls it)."""
        self.hpo = HPOAdvantages(self.args, device=self.accelerator.device) if self.args.uses_hpo else None

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.hpo is None:
            return out
        mode = "train" if self.model.training else "eval"
        pads = [t for t in (self._image_pad_token_id, self._video_pad_token_id) if t is not None]
        out["advantages"], metrics, turn_values = self.hpo(
            inputs,
            out,
            outcome=self._outcome,
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            tokenizer=self._tokenizer,
            drop_token_ids=pads,
            process_index=self.accelerator.process_index,
        )
        self._logs["extra"]["turn_advantages"].extend(turn_values)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        return out
