"""`GradientProbeArguments`: the recipe fields of the gradient-variance measurements (`utils.diagnostics`:
`GradientVarianceProbe`, `GradientVariance`), composed into `configs.MAPOConfig` (flat recipe keys, as before)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
