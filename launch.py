"""Setup shared by the entry scripts (`sft.py`, `rl.py`, `evaluate.py`): parsing, data, policy, and the checks and
saving every run needs.

Each entry script has one skeleton: parse (`parse_args_and_record`: `--config recipe.yaml`, any field overridable on
the command line, tool settings defaulting to the starting checkpoint's record), load (these helpers), build the
trainer, check it (`check_master_weights`), train (`resume_checkpoint`), save (`save_outputs`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch
import trl
from accelerate.utils import DistributedType
from transformers import PreTrainedModel, ProcessorMixin, Trainer

from data import DATASETS, get_dataset
from data.benchmarks import load_saved_split
from models import load_model, load_processor, model_init_kwargs
from tools import ToolConfig, read_record, record_mismatches, warn_on_mismatch, write_record

logger = logging.getLogger(__name__)


@dataclass
class ScriptArguments(trl.ScriptArguments):
    """TRL's script arguments plus what this repo's recipes choose by name."""

    dataset_name: str = field(
        default="synthetic",
        metadata={"help": f"A dataset builder by name ({', '.join(sorted(DATASETS))}) or a `save_to_disk` folder."},
    )
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local file or folder a named dataset builder reads (benchmarks, DeepEyes)."}
    )
    num_samples: int = field(default=64, metadata={"help": "Rows to generate, for generated datasets (synthetic)."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of generated datasets."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["outcome", "format"],
        metadata={"help": "Outcome reward functions by name (task.REWARDS)."},
    )


# ----------------------------------------------------------------------------------------------------------- parse
def parse_args_and_record(dataclass_types: Iterable[type], argv: Sequence[str] | None = None) -> tuple:
    """`TrlParser(dataclass_types).parse_args_and_config(argv)`, with the starting checkpoint's record as defaults.

    Precedence: the command line, then the recipe (`--config`), then the record of the checkpoint named by
    `model_name_or_path` (`tool_config.json`: the tool settings it was trained with and, after RL, its rollout
    budget), then the dataclass defaults. A value that differs from the record warns with both values.
    """
    dataclass_types = tuple(dataclass_types)
    argv = list(sys.argv[1:] if argv is None else argv)
    parsed = trl.TrlParser(dataclass_types).parse_args_and_config(list(argv))
    checkpoint = next(p.model_name_or_path for p in parsed if hasattr(p, "model_name_or_path"))
    record = read_record(checkpoint)
    if record is None:
        return parsed
    parser = trl.TrlParser(dataclass_types)
    parser.set_defaults_with_config(**record["tool"], **record["rollout"])  # keys no dataclass has are ignored
    parsed = parser.parse_args_and_config(list(argv))
    values = {name: value for p in parsed for name, value in vars(p).items()}
    warn_on_mismatch(checkpoint, record_mismatches(record, values))
    return parsed


# ------------------------------------------------------------------------------------------------------------ load
def load_split(script_args: ScriptArguments, split: str) -> datasets.Dataset:
    """One split of the recipe's dataset: from a `save_to_disk` folder, or built by a registered builder."""
    name = script_args.dataset_name
    if os.path.isdir(name):
        return load_saved_split(name, split)
    if name == "synthetic":
        return get_dataset(name, n=script_args.num_samples, seed=script_args.dataset_seed, split=split)
    return get_dataset(name, path=script_args.dataset_path, split=split)


def load_policy(model_args: trl.ModelConfig, tool: ToolConfig) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The policy and its processor (with the repo's tool-calling chat template and `tool`'s pixel budget)."""
    path = model_args.model_name_or_path
    if path.startswith(("outputs/", "./outputs/")) and not os.path.isdir(path):
        raise FileNotFoundError(
            f"model_name_or_path: {path} does not exist; it is an earlier stage's output (make sft before make rl)."
        )
    processor = load_processor(path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    model = load_model(path, **model_init_kwargs(model_args))
    return model, processor


# ----------------------------------------------------------------------------------------------------------- check
HALF_DTYPES = (torch.bfloat16, torch.float16)


def check_master_weights(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], distributed_type: DistributedType
) -> None:
    """Fail at start when trainable weights are stored in half precision with no fp32 master copy.

    A plain torch optimizer updates the weights in their own dtype: in bfloat16 (8 bits of mantissa) an update below
    ~1/256 of a weight rounds away, so a full fine-tune at lr 1e-6 does not move at all, silently. DeepSpeed and
    FSDP mixed precision keep fp32 master weights, and PEFT keeps LoRA adapters in fp32; anything else must load
    fp32 weights and let `bf16: true` autocast the compute.
    """
    if distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        return
    half = [(name, p) for name, p in named_parameters if p.requires_grad and p.dtype in HALF_DTYPES]
    if half:
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for _, p in half})
        count = sum(p.numel() for _, p in half)
        raise ValueError(
            f"{count:,} trainable parameters (e.g. {half[0][0]}) are stored in {'/'.join(dtypes)} and the optimizer "
            f"keeps no fp32 master copy (accelerate distributed_type={distributed_type.value}): updates smaller than "
            "1/256 of a weight round away and training silently does not move it. Set `dtype: float32` in the recipe "
            "(keep `bf16: true`: compute is autocast), or train with DeepSpeed/FSDP (ACCELERATE=zero2, zero3 or "
            "fsdp2), or train LoRA adapters (`use_peft: true`)."
        )


# ------------------------------------------------------------------------------------------------------------ save
def save_outputs(trainer: Trainer, processor: ProcessorMixin, tool: dict[str, Any], **rollout: Any) -> None:
    """The final model, its processor and its `tool_config.json`, into `output_dir`."""
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(output_dir)
        write_record(output_dir, tool, **rollout)
