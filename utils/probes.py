"""The gradient-variance measurements composed into `MAPOTrainer`: their recipe fields (`GradientProbeArguments`, in
`configs.MAPOConfig` with flat keys) and their wiring (`GradientProbes`); the measurements: `utils.diagnostics`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from utils.diagnostics import GradientVariance, GradientVarianceProbe, sharded_diagnostics


@dataclass
class GradientProbeArguments:
    """The gradient-variance probes' fields (docs/method.md); both off (0) by default."""

    variance_probe_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many steps (0: never), log probe/grad_norm_var on the first batch (docs/method.md)."
        },
    )
    variance_probe_rows: int = field(default=8, metadata={"help": "Rollouts of the probe's fixed batch."})
    gradient_variance_batches: int = field(
        default=0,
        metadata={"help": "Log gradvar/* across the first this many steps' batches (0: off; docs/method.md)."},
    )


class GradientProbes:
    """Mixin for a `GRPOTrainer` subclass: the gradient-variance callback (`gradient_variance_batches`:
    `GradientVariance`) and probe (`variance_probe_steps`: `GradientVarianceProbe`), both off with a warning under
    DeepSpeed or FSDP (`sharded_diagnostics`). Off by default: no callback, no figure. Overrides nothing of TRL's."""

    def _add_gradient_probes(self) -> None:
        sharded = "DeepSpeed" if self.is_deepspeed_enabled else "FSDP" if self.is_fsdp_enabled else None
        for reason in sharded_diagnostics(
            self.args.variance_probe_steps, self.args.gradient_variance_batches, sharded
        ):
            warnings.warn(reason, stacklevel=3)
        if self.args.variance_probe_steps > 0 and sharded is None:
            self.add_callback(GradientVarianceProbe(self.args.variance_probe_steps, self.args.variance_probe_rows))
        if self.args.gradient_variance_batches > 0 and sharded is None:
            self.add_callback(GradientVariance(self.args.gradient_variance_batches, self._record_train_metrics))

    @property
    def probe(self) -> GradientVarianceProbe | None:
        """The gradient-variance probe (`variance_probe_steps`), looked up among the callbacks: transformers'
        `restore_callback_states_from_checkpoint` replaces a callback with a rebuilt one on resume."""
        return next((c for c in self.callback_handler.callbacks if isinstance(c, GradientVarianceProbe)), None)

    def _probe_metrics(self, out: dict) -> dict[str, float]:
        """The probe's figures on a training batch (`probe/*`), when it is on and due; else none."""
        probe = self.probe
        return {} if probe is None else probe(self, out)

    def _record_train_metrics(self, metrics: dict[str, float]) -> None:
        """Figures for the next training log (TRL averages `_metrics` into each `log`)."""
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
