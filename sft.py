"""SFT cold start on gold zoom-in trajectories: `accelerate launch sft.py --config recipes/<model>/sft/<recipe>.yaml`.

Teaches the policy the format MAPO then optimises (think, call `image_zoom_in_tool` with a box in the frame it sees
and a label, read the crop, answer) on trajectories from `data.trajectories`, rendered exactly as RL renders them:
same prompt, same tool schema (`data.collator`), same crops (the RL environment). The loss covers the assistant
turns only. LoRA is `use_peft: true` with TRL's `ModelConfig` fields. Any recipe field can be overridden on the
command line; a key no dataclass knows fails at start with its name.
"""

from __future__ import annotations

import logging

from transformers import set_seed
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from data.collator import DataCollatorForVisionToolCalling
from data.trajectories import TrajectoryArguments, build_gold_trajectories
from launch import ScriptArguments, environment_factory, load_policy, load_split
from tools import environment_tools


def main(
    script_args: ScriptArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
    trajectory_args: TrajectoryArguments,
) -> SFTTrainer:
    if training_args.remove_unused_columns:
        raise ValueError(
            "remove_unused_columns must be false: gold trajectories are rendered on the fly from the dataset's columns"
        )
    set_seed(training_args.seed)
    model, processor = load_policy(model_args, script_args)
    make_environment = environment_factory(script_args, processor)
    train_dataset, _ = build_gold_trajectories(
        load_split(script_args, script_args.dataset_train_split),
        make_environment,
        trajectory_args,
    )
    collator = DataCollatorForVisionToolCalling(
        processor=processor,
        tools=environment_tools(make_environment()),
        max_length=training_args.max_length,
        pad_to_multiple_of=training_args.pad_to_multiple_of,
        assistant_only_loss=training_args.assistant_only_loss,
    )
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        data_collator=collator,
        train_dataset=train_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    processor.save_pretrained(training_args.output_dir)
    return trainer


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments))
    main(*parser.parse_args_and_config())
