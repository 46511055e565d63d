"""Setup shared by the entry scripts (`sft.py`, `rl.py`): script arguments, data, policy, environment.

Each entry script has one skeleton: parse (`TrlParser`, `--config recipe.yaml`, any field overridable on the command
line), load (these helpers), build the trainer, train, save.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import datasets
import trl
from transformers import PreTrainedModel, ProcessorMixin

from data import DATASETS, get_dataset
from data.benchmarks import load_saved_split
from models import load_model, load_processor, model_init_kwargs, pixel_budget
from tools import make_environment_factory


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
    environment: str = field(default="zoom_in", metadata={"help": "Tool environment by name (tools.ENVIRONMENTS)."})
    min_pixels: int | None = field(
        default=None, metadata={"help": "Override the image processor's min pixels (None: the model's own)."}
    )
    max_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Override the image processor's max pixels; the model's zoom coordinates live in this frame."
        },
    )


def load_split(script_args: ScriptArguments, split: str) -> datasets.Dataset:
    """One split of the recipe's dataset: from a `save_to_disk` folder, or built by a registered builder."""
    name = script_args.dataset_name
    if os.path.isdir(name):
        return load_saved_split(name, split)
    if name == "synthetic":
        return get_dataset(name, n=script_args.num_samples, seed=script_args.dataset_seed, split=split)
    return get_dataset(name, path=script_args.dataset_path, split=split)


def load_policy(model_args: trl.ModelConfig, script_args: ScriptArguments) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The policy and its processor (with the repo's tool-calling chat template), by name or local path."""
    processor = load_processor(
        model_args.model_name_or_path, min_pixels=script_args.min_pixels, max_pixels=script_args.max_pixels
    )
    model = load_model(model_args.model_name_or_path, **model_init_kwargs(model_args))
    return model, processor


def environment_factory(script_args: ScriptArguments, processor: ProcessorMixin, **limits):
    """The zero-argument environment factory TRL expects, in the processor's coordinate frame."""
    min_pixels, max_pixels, factor = pixel_budget(processor)
    return make_environment_factory(
        script_args.environment, min_pixels=min_pixels, max_pixels=max_pixels, factor=factor, **limits
    )
