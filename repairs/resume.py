"""Resuming a run exactly: `--resume_from_checkpoint` continues with the checkpoint's weights and the uninterrupted
run's data order, two things transformers 5.17 / TRL 1.16 silently get wrong (docs/internals.md, `exact-resume-*`):

- Weights: checkpoints are written in the hub's key layout but read back with `strict=False` and no renames, so no
  weight loads (transformers#43701). A whole-model checkpoint is loaded here through `from_pretrained`, strictly;
  DeepSpeed, FSDP and PEFT adapters resume through their own loaders.
- Data order (`MAPOTrainer` only, whose sampler is TRL's `RepeatSampler`): each epoch's shuffle is drawn from one
  generator seeded once, so a run resumed in epoch k replays epoch 0's order. `EpochSeededRepeatSampler` gives epoch
  k the order an uninterrupted stock run gives it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.utils import RepeatSampler

logger = logging.getLogger(__name__)

CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest-numbered `checkpoint-*` in `output_dir` that was written whole, or None. transformers' `Trainer`
    writes `trainer_state.json` last, after the weights, optimizer and RNG states; `get_last_checkpoint` takes the
    highest number whatever it holds, so a run killed while saving would resume from half a checkpoint."""
    if not os.path.isdir(output_dir):
        return None
    complete = [
        path
        for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if path.name.split("-")[-1].isdigit() and (path / TRAINER_STATE_NAME).is_file()
    ]
    return str(max(complete, key=lambda path: int(path.name.split("-")[-1]))) if complete else None


def resume_checkpoint(training_args: Any) -> str | None:
    """The checkpoint `training_args.resume_from_checkpoint` asks for: a folder, or `true` for the last complete
    `checkpoint-*` in `output_dir` (`last_complete_checkpoint`); None when not asked (then an existing checkpoint is
    pointed out, not used)."""
    value, output_dir = training_args.resume_from_checkpoint, training_args.output_dir
    last = last_complete_checkpoint(output_dir)
    if value is None or str(value).lower() in ("", "false"):
        if last is not None:
            logger.warning("%s holds %s; pass --resume_from_checkpoint true to continue from it", output_dir, last)
        return None
    if str(value).lower() == "true":
        if last is None:
            raise ValueError(
                f"resume_from_checkpoint: true, but {output_dir} holds no complete checkpoint-* folder (one with its "
                "trainer_state.json)"
            )
        return last
    if not os.path.isdir(value):
        raise ValueError(f"resume_from_checkpoint: {value} is not a checkpoint folder")
    return value


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` whose epoch-k shuffle is the k-th that stock TRL draws, whatever ran before in this
    process."""

    @classmethod
    def like(cls, sampler: RepeatSampler) -> EpochSeededRepeatSampler:
        return cls(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            # Stock TRL seeds once and draws one shuffle per epoch (`RepeatSampler.__iter__`): replaying the draws
            # of the epochs before keeps its order exactly, for runs that resume and runs that never do.
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)


class ExactResume:
    """Trainer mixin: resume with the checkpoint's weights and the uninterrupted run's data order (module docstring).
    Overrides `_load_from_checkpoint` and `_get_train_sampler`."""

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        model = self.model if model is None else model
        whole = any(os.path.isfile(os.path.join(resume_from_checkpoint, name)) for name in CHECKPOINT_WEIGHTS)
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or not whole or hasattr(model, "peft_config"):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        dtype = next(model.parameters()).dtype
        loaded = type(model).from_pretrained(resume_from_checkpoint, dtype=dtype)
        model.load_state_dict(loaded.state_dict(), strict=True)

    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        return EpochSeededRepeatSampler.like(sampler) if isinstance(sampler, RepeatSampler) else sampler
