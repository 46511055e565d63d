"""SFT's recipe dataclass, `SFTConfig`, and the freeze fields SFT and RL share (`freeze_field`); importable from
`configs`, the index of every recipe dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

import trl

from repairs.resume import resolve_resume
from utils.checks import check_ranges

FROZEN_PARTS = {
    "vision_tower": "the vision tower (model.visual: patch embedding, blocks; on Qwen3-VL its deepstack mergers too)",
    "projector": "the projector into the language model (model.visual.merger)",
}
FREEZE_PEERS = {
    True: "Mini-o3's cold start (LLaMA-Factory's defaults)",
    False: "Mini-o3's and DeepEyes' RL (verl trains the whole model)",
}


def freeze_field(part: str, default: bool, stage: str):
    """A `freeze_vision_tower` / `freeze_projector` field (`utils.trainable`, applied by `utils.policy.load_policy`):
    the same help in SFT and RL, each stage with its peers' default."""
    return field(
        default=default,
        metadata={
            "help": f"Freeze {FROZEN_PARTS[part]}: its weights do not train and, under LoRA, get no adapter. "
            f"{stage} default: {str(default).lower()}, as {FREEZE_PEERS[default]}."
        },
    )


@dataclass
class SFTConfig(trl.SFTConfig):
    """TRL's `SFTConfig` (every field keeps its meaning) plus which parts of the policy stay frozen."""

    freeze_vision_tower: bool = freeze_field("vision_tower", True, "SFT")
    freeze_projector: bool = freeze_field("projector", True, "SFT")

    def __post_init__(self):
        check_ranges(self)  # utils.checks.FIELD_RANGES: a NaN or 0 batch would fail, or not, once the model loads
        super().__post_init__()
        resolve_resume(self)  # nothing intact to resume from fails here, not after the weights load
