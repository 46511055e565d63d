"""The entry scripts' load and save steps for the policy: load it after the start-up checks of its fields, and save
the final model with its processor and record."""

from __future__ import annotations

import os
from typing import Any

import trl
from accelerate import PartialState
from peft import PeftConfig
from transformers import PreTrainedModel, ProcessorMixin, Trainer, TrainingArguments

from tools import ToolConfig, write_record
from utils.checks import (
    check_model,
    check_planned_master_weights,
    check_report_to,
    check_vllm_model,
    planned_distributed_type,
)
from utils.models import load_model, load_processor, model_init_kwargs
from utils.trainable import (
    QUANTIZATION_SKIP_MODULES,
    freeze,
    frozen_prefixes,
    lora_exclusions,
    only_trained_inputs_require_grads,
)


def freeze_flags(training_args: TrainingArguments) -> dict[str, bool]:
    """The recipe's `freeze_vision_tower` and `freeze_projector` (`configs.SFTConfig`, `configs.MAPOConfig`); false
    for training arguments without them."""
    return {
        "vision_tower": bool(getattr(training_args, "freeze_vision_tower", False)),
        "projector": bool(getattr(training_args, "freeze_projector", False)),
    }


def quantization_config(model_args: trl.ModelConfig):
    """TRL's `get_quantization_config` (None without `load_in_4bit`/`load_in_8bit`), whose bitsandbytes config has no
    skip list, with `QUANTIZATION_SKIP_MODULES` left unquantised: the vision tower and its projector, and the output
    head that transformers skips by default only when no list is given."""
    quantization = trl.get_quantization_config(model_args)
    if quantization is not None:
        quantization.llm_int8_skip_modules = list(QUANTIZATION_SKIP_MODULES)
    return quantization


def load_policy(
    model_args: trl.ModelConfig, tool: ToolConfig, training_args: TrainingArguments
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The policy and its processor (the repo's chat template, `tool`'s pixel budget), after the start-up checks of
    its fields and of the logging backends, so a bad recipe fails before any weight is read. `load_in_4bit`/
    `load_in_8bit` go through TRL's `get_quantization_config`, as TRL's own scripts do (a GPU and
    `requirements-gpu.txt` needed), the vision tower left out (`quantization_config`). The parts the recipe freezes
    (`freeze_flags`) leave the trainable parameters, and the model's input embeddings require grad only where a
    checkpointed layer after them trains (`utils.trainable.enable_input_require_grads`)."""
    path = model_args.model_name_or_path
    if path.startswith(("outputs/", "./outputs/")) and not os.path.isdir(path):
        raise FileNotFoundError(
            f"model_name_or_path: {path} does not exist; it is an earlier stage's output (make sft before make rl)."
        )
    check_report_to(training_args.report_to)  # transformers would raise only once the trainer is built
    flags = freeze_flags(training_args)
    config = check_model(model_args, freeze_vision_tower=flags["vision_tower"], freeze_projector=flags["projector"])
    check_planned_master_weights(model_args, config, planned_distributed_type(training_args))
    if getattr(training_args, "use_vllm", False):  # a colocated engine loads at the dtype the recipe names
        colocated = training_args.vllm_mode == "colocate"
        dtype = getattr(training_args, "vllm_dtype", None) if colocated else None
        check_vllm_model(path, config, dtype, colocated=colocated)
    processor = load_processor(path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    kwargs = model_init_kwargs(model_args)
    quantization = quantization_config(model_args)
    if quantization is not None:  # each process's 4/8-bit weights on its own GPU (TRL < 1.x's get_kbit_device_map)
        kwargs |= {"quantization_config": quantization, "device_map": {"": PartialState().local_process_index}}
    model = load_model(path, **kwargs)
    freeze(model, frozen_prefixes(model, **flags))
    return only_trained_inputs_require_grads(model), processor


def policy_peft_config(
    model_args: trl.ModelConfig, model: PreTrainedModel, training_args: TrainingArguments
) -> PeftConfig | None:
    """TRL's `get_peft_config` (None without `use_peft`), with no adapter in a part the recipe freezes (peft's
    `exclude_modules`; `utils.trainable.lora_exclusions`)."""
    peft_config = trl.get_peft_config(model_args)
    if peft_config is not None:
        excluded = lora_exclusions(
            model, peft_config.target_modules, frozen_prefixes(model, **freeze_flags(training_args))
        )
        peft_config.exclude_modules = excluded or None
    return peft_config


def save_outputs(trainer: Trainer, processor: ProcessorMixin, tool: dict[str, Any], **rollout: Any) -> None:
    """The final model, its processor, its `tool_config.json` and the trainer's state (`trainer_state.json`, with the
    run's `log_history`), into `output_dir`."""
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    trainer.save_state()
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(output_dir)
        write_record(output_dir, tool, **rollout)
