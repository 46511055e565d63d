"""MAPO reinforcement learning: `accelerate launch rl.py --config recipes/<model>/rl/config_<variant>.yaml`.

Any recipe field can be overridden on the command line (`--semantic_beta 0.2`); a key no dataclass knows fails at
start with its name.
"""

from __future__ import annotations

from transformers import set_seed
from trl import ModelConfig, TrlParser, get_peft_config

from launch import ScriptArguments, environment_factory, load_policy, load_split
from mapo_trainer import MAPOConfig, MAPOTrainer
from task import get_reward_funcs


def main(script_args: ScriptArguments, training_args: MAPOConfig, model_args: ModelConfig) -> MAPOTrainer:
    set_seed(training_args.seed)
    model, processor = load_policy(model_args, script_args)
    train_dataset = load_split(script_args, script_args.dataset_train_split)
    trainer = MAPOTrainer(
        model=model,
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=train_dataset,
        processing_class=processor,
        environment_factory=environment_factory(
            script_args,
            processor,
            max_label_words=training_args.max_label_words,
            max_label_chars=training_args.max_label_chars,
        ),
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    processor.save_pretrained(training_args.output_dir)
    return trainer


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, MAPOConfig, ModelConfig))
    main(*parser.parse_args_and_config())
