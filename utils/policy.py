"""The entry scripts' load and save steps for the policy: load it after the start-up checks of its fields, and save
the final model with its processor and record."""

from __future__ import annotations

import os
from typing import Any

import trl
from accelerate import PartialState
from transformers import PreTrainedModel, ProcessorMixin, Trainer, TrainingArguments

from tools import ToolConfig, write_record
from utils.checks import check_model, check_planned_master_weights, check_report_to, planned_distributed_type
from utils.models import load_model, load_processor, model_init_kwargs


def load_policy(
    model_args: trl.ModelConfig, tool: ToolConfig, training_args: TrainingArguments
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The policy and its processor (the repo's chat template, `tool`'s pixel budget), after the start-up checks of
    its fields and of the logging backends, so a bad recipe fails before any weight is read. `load_in_4bit`/`load_in_8bit` go through TRL's
    `get_quantization_config`, as TRL's own scripts do (a GPU and `requirements-gpu.txt` needed)."""
    path = model_args.model_name_or_path
    if path.startswith(("outputs/", "./outputs/")) and not os.path.isdir(path):
        raise FileNotFoundError(
            f"model_name_or_path: {path} does not exist; it is an earlier stage's output (make sft before make rl)."
        )
    check_report_to(training_args.report_to)  # transformers would raise only once the trainer is built
    config = check_model(model_args)
    check_planned_master_weights(model_args, config, planned_distributed_type(training_args))
    processor = load_processor(path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    kwargs = model_init_kwargs(model_args)
    quantization = trl.get_quantization_config(model_args)
    if quantization is not None:  # each process's 4/8-bit weights on its own GPU (TRL < 1.x's get_kbit_device_map)
        kwargs |= {"quantization_config": quantization, "device_map": {"": PartialState().local_process_index}}
    model = load_model(path, **kwargs)
    return model, processor


def save_outputs(trainer: Trainer, processor: ProcessorMixin, tool: dict[str, Any], **rollout: Any) -> None:
    """The final model, its processor, its `tool_config.json` and the trainer's state (`trainer_state.json`, with the
    run's `log_history`), into `output_dir`."""
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    trainer.save_state()
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(output_dir)
        write_record(output_dir, tool, **rollout)
