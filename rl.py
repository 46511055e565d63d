"""MAPO reinforcement learning: `accelerate launch rl.py --config recipes/<model>/rl/config_<variant>.yaml`.

Any recipe field can be overridden on the command line (`--semantic_beta 0.2`); a key no dataclass knows fails at
start with its name. Tool settings not given default to those the starting checkpoint was trained with (its
`tool_config.json`, written by `sft.py`); `--resume_from_checkpoint true` continues from the last checkpoint.
"""

from __future__ import annotations

import os

from transformers import set_seed
from trl import ModelConfig

from configs import MAPOConfig, ScriptArguments, ToolConfig
from data import load_split
from mapo_trainer import MAPOTrainer
from repairs.resume import resume_checkpoint
from rewards import check_columns, check_judge, check_rule_rewards, get_reward_funcs
from utils.checks import check_clip_model, check_master_weights, keep_adapters_in_fp32
from utils.policy import load_policy, policy_peft_config, save_outputs
from utils.progress import StepTimes
from utils.recipes import parse_args_and_record


def build_trainer(
    script_args: ScriptArguments,
    training_args: MAPOConfig,
    model_args: ModelConfig,
    tool_config: ToolConfig,
    trainer_cls: type[MAPOTrainer] = MAPOTrainer,
) -> MAPOTrainer:
    """The trainer `main` trains: the CLIP verifier's name checked (`utils.checks.check_clip_model`), the recipe's
    train split checked against the columns its rewards and verifier read, the policy and its processor, and
    `trainer_cls` (`MAPOTrainer`, or a subclass) built on them."""
    if training_args.semantic_verifier == "clip":  # the one verifier that reads clip_model, built after the policy
        check_clip_model(tool_config.clip_model, tool_config.clip_pretrained)
    set_seed(training_args.seed)
    # The recipe's judge, for the rewards that ask it: they read the JUDGE_* variables at each call.
    os.environ.update(script_args.judge_environ())
    check_judge(script_args.reward_funcs)
    dataset = load_split(script_args, script_args.dataset_train_split)
    reward_funcs = get_reward_funcs(script_args.reward_funcs)
    where = f"dataset_name {script_args.dataset_name} split {script_args.dataset_train_split}"
    check_columns(dataset.column_names, script_args.reward_funcs, training_args.semantic_verifier, where=where)
    if "source" in dataset.column_names:
        check_rule_rewards(dataset["source"], script_args.reward_funcs, where=where)
    model, processor = load_policy(model_args, tool_config, training_args)
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=processor,
        tool_config=tool_config,
        peft_config=policy_peft_config(model_args, model, training_args),
    )
    keep_adapters_in_fp32(trainer.model)  # QLoRA: TRL casts the adapters to bf16
    check_master_weights(trainer.model.named_parameters(), trainer.accelerator.distributed_type)
    return trainer


def main(
    script_args: ScriptArguments,
    training_args: MAPOConfig,
    model_args: ModelConfig,
    tool_config: ToolConfig,
    trainer_cls: type[MAPOTrainer] = MAPOTrainer,
) -> MAPOTrainer:
    trainer = build_trainer(script_args, training_args, model_args, tool_config, trainer_cls)
    trainer.add_callback(StepTimes())  # progress.json: the measured step time make reproduce plans with
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    save_outputs(
        trainer,
        trainer.processing_class,
        trainer.tool_config.as_record(),
        max_completion_length=training_args.max_completion_length,
        max_tool_calling_iterations=training_args.max_tool_calling_iterations,
    )
    return trainer


if __name__ == "__main__":
    main(*parse_args_and_record((ScriptArguments, MAPOConfig, ModelConfig, ToolConfig), save_recipe=True))
