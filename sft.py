"""SFT cold start on gold zoom-in trajectories: `accelerate launch sft.py --config recipes/<model>/sft/<recipe>.yaml`.

Teaches the policy the format MAPO then optimises (think, call `image_zoom_in_tool` with a box in the frame it sees
and a label, read the crop, answer) on trajectories from `data.trajectories`, rendered exactly as RL renders them:
same prompt, same tool schema (`data.collator`), same crops and label limits (the RL environment, built from the same
`ToolConfig`, which the checkpoint records for RL and evaluation). The loss covers the assistant turns only; the vision
tower and its projector stay frozen unless the recipe sets `freeze_vision_tower` / `freeze_projector` false (Mini-o3's
cold start freezes both). LoRA is `use_peft: true` with TRL's `ModelConfig` fields. Any recipe field can be overridden on the command line; a key no
dataclass knows fails at start with its name.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import trl
from transformers import set_seed
from trl import ModelConfig

from configs import ScriptArguments, SFTConfig, ToolConfig, TrajectoryArguments
from data import load_split
from data.collator import DataCollatorForVisionToolCalling, fit_to_max_length
from data.trajectories import SynthesisStats, build_gold_trajectories
from repairs.resume import ExactResume, resume_checkpoint
from tools import ToolConfigRecorder, environment_tools, make_environment_factory
from utils.checks import check_master_weights, keep_adapters_in_fp32
from utils.models import pixel_budget
from utils.policy import load_policy, policy_peft_config, save_outputs
from utils.progress import StepTimes
from utils.recipes import parse_args_and_record


class SFTTrainer(ExactResume, trl.SFTTrainer):
    """TRL's `SFTTrainer`, resuming from a checkpoint's weights (`repairs.resume.ExactResume`; its data-order mend does not
    apply: TRL's SFT does not use the `RepeatSampler` it replaces).

    Overrides `__init__` only to keep TRL's start-up check from refusing `assistant_only_loss` on vision data below
    transformers 5.18: that check guards TRL's own collator's mask, which 5.17 misplaces after each image; this
    trainer is given `data.collator.DataCollatorForVisionToolCalling`, which computes the mask itself.
    """

    def __init__(self, *positional, args: SFTConfig, data_collator: DataCollatorForVisionToolCalling, **kwargs):
        if not isinstance(data_collator, DataCollatorForVisionToolCalling):
            raise TypeError("SFTTrainer needs data.collator.DataCollatorForVisionToolCalling (its loss mask)")
        masked, args.assistant_only_loss = args.assistant_only_loss, False
        try:
            super().__init__(*positional, args=args, data_collator=data_collator, **kwargs)
        finally:
            args.assistant_only_loss = masked  # read by nothing after __init__ but the collator, which has its own


DATA_STATS_NAME = "data_stats.json"


def write_data_stats(output_dir: str, synthesis: SynthesisStats, lengths: dict) -> Path | None:
    """`<output_dir>/data_stats.json` (first process): the rows SFT trains on, by number of calls and, rendered, by
    length (`data.collator.fit_to_max_length`: the rows over max_length it left out), and the rows the gold
    trajectories could not be built for, by column. `scripts.memory --sft_lengths` reads its lengths."""
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    path = Path(output_dir) / DATA_STATS_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    stats = {
        "calls_per_row": {str(n): synthesis.calls[n] for n in sorted(synthesis.calls)},
        "rows_skipped": dict(synthesis.skipped),
        **lengths,
    }
    path.write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return path


def check_dataset_exists(script_args: ScriptArguments) -> None:
    """Fail, naming the converter, when `dataset_name` is a path (a converted set's `save_to_disk` folder) that does
    not exist: before any weight is read, not after minutes of loading a 7B policy."""
    name = script_args.dataset_name
    if ("/" in name or os.sep in name) and not os.path.isdir(name):
        raise FileNotFoundError(
            f"dataset_name: {name} does not exist. SFT reads a converted set: build it once with `python -m "
            f'data.convert --format <format> --input <the download> --output {name}` (recipes/README.md, "Real SFT '
            'data"; docs/data.md lists the formats)'
        )


def main(
    script_args: ScriptArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
    trajectory_args: TrajectoryArguments,
    tool_config: ToolConfig,
) -> SFTTrainer:
    if training_args.remove_unused_columns:
        raise ValueError(
            "remove_unused_columns must be false: gold trajectories are rendered on the fly from the dataset's columns"
        )
    set_seed(training_args.seed)
    check_dataset_exists(script_args)  # the data first: a missing set fails before the weights load
    rows = load_split(script_args, script_args.dataset_train_split)
    model, processor = load_policy(model_args, tool_config, training_args)
    budget = pixel_budget(processor)
    make_environment = make_environment_factory(tool_config, budget)
    train_dataset, synthesis = build_gold_trajectories(rows, make_environment, trajectory_args)
    collator = DataCollatorForVisionToolCalling(
        processor=processor,
        tools=environment_tools(make_environment()),
        max_length=training_args.max_length,
        pad_to_multiple_of=training_args.pad_to_multiple_of,
        assistant_only_loss=training_args.assistant_only_loss,
    )
    train_dataset, lengths = fit_to_max_length(train_dataset, collator, training_args.max_length)
    write_data_stats(training_args.output_dir, synthesis, lengths)
    record = tool_config.resolved(budget).as_record(verifier=False)  # SFT scores nothing with CLIP
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        data_collator=collator,
        train_dataset=train_dataset,
        processing_class=processor,
        peft_config=policy_peft_config(model_args, model, training_args),
        callbacks=[ToolConfigRecorder(record), StepTimes()],  # StepTimes: progress.json, for make reproduce
    )
    keep_adapters_in_fp32(trainer.model)  # QLoRA: TRL casts the adapters to bf16
    check_master_weights(trainer.model.named_parameters(), trainer.accelerator.distributed_type)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    save_outputs(trainer, processor, record)
    return trainer


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    main(
        *parse_args_and_record(
            (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig), save_recipe=True
        )
    )
