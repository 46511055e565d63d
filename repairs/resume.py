"""Resuming a run exactly: `--resume_from_checkpoint` continues from an intact checkpoint, with its weights and the
uninterrupted run's data order, three things transformers 5.17 / TRL 1.16 silently get wrong (docs/internals.md,
`exact-resume-*`, `complete-checkpoint`):

- Weights: checkpoints are written in the hub's key layout but read back with `strict=False` and no renames, so no
  weight loads (transformers#43701). A whole-model checkpoint is loaded here through `from_pretrained`, strictly;
  DeepSpeed, FSDP and PEFT adapters resume through their own loaders.
- Checkpoints: `get_last_checkpoint` takes the highest-numbered folder whatever it holds; `--resume_from_checkpoint
  true` here takes the last one whose weights, optimizer and state load (`checkpoint_damage`), saying which it passed
  over, and fails at parse when none does.
- Data order (`MAPOTrainer` only, whose sampler is TRL's `RepeatSampler`): each epoch's shuffle is drawn from one
  generator seeded once, so a run resumed in epoch k replays epoch 0's order. `EpochSeededRepeatSampler` gives epoch
  k the order an uninterrupted stock run gives it.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.utils import RepeatSampler

logger = logging.getLogger(__name__)

CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# Every weights layout a `Trainer` checkpoint may hold, in the order `checkpoint_damage` looks for them: whole models and
# PEFT adapters, as one file or as shards named by an index.
WEIGHT_FILES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "adapter_model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
    "adapter_model.bin",
)
# DeepSpeed and FSDP write weights and optimizer state in their own layouts, which their own loaders read on resume.
SHARDED_STATE = ("global_step*", "pytorch_model_fsdp*", "optimizer_*", "optimizer.bin")


def checkpoint_damage(folder: str | os.PathLike) -> str | None:
    """What keeps `folder` from resuming (its weights, optimizer and scheduler, or trainer state would not load), or
    None when it is intact.

    Cheap by design, for a 7B checkpoint on every process at start: safetensors headers are parsed and checked to
    cover their files exactly, and torch files are opened memory-mapped (`mmap=True`, the zip directory and pickle
    read, no tensor data), which a full fine-tune's 56 GB optimizer passes in milliseconds where a real load takes
    minutes and as much RAM. A save killed half-way (a truncated or missing file, a cut-off JSON) is caught; bytes
    flipped inside a tensor are not (neither format has checksums). DeepSpeed and FSDP folders are checked for their
    layout only."""
    folder = Path(folder)
    try:
        TrainerState.load_from_json(str(folder / TRAINER_STATE_NAME))
    except FileNotFoundError:
        return f"no {TRAINER_STATE_NAME} (the trainer writes it last: the save did not finish)"
    except (OSError, ValueError, TypeError) as err:  # JSONDecodeError is a ValueError; TypeError: unknown keys
        return f"{TRAINER_STATE_NAME} does not load ({_first_line(err)})"
    sharded = any(any(folder.glob(pattern)) for pattern in SHARDED_STATE)
    weights = next((name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if weights is None and not sharded:
        return f"no weights (none of {', '.join(WEIGHT_FILES)})"
    if weights is not None:
        problem = _weights_damage(folder, weights)
        if problem is not None:
            return problem
    if sharded:
        return None
    for name in (OPTIMIZER_NAME, SCHEDULER_NAME):  # transformers loads the optimizer only beside its scheduler
        if not (folder / name).is_file():
            return f"no {name} (a save cut short, or save_only_model: true, whose checkpoints cannot resume)"
        problem = _torch_file_damage(folder / name)
        if problem is not None:
            return problem
    return None


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


def _weights_damage(folder: Path, name: str) -> str | None:
    if name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads((folder / name).read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            return f"{name} does not load ({_first_line(err)})"
        for shard in shards:
            if not (folder / shard).is_file():
                return f"{shard}, named by {name}, is missing"
            problem = _weights_damage(folder, shard)
            if problem is not None:
                return problem
        return None
    if name.endswith(".safetensors"):
        try:
            with safe_open(folder / name, framework="pt"):  # validates the header against the file's size
                return None
        except (OSError, SafetensorError) as err:
            return f"{name} does not load ({_first_line(err)})"
    return _torch_file_damage(folder / name)


def _torch_file_damage(path: Path) -> str | None:
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # as the trainer loads it, but mapped
    except pickle.UnpicklingError as err:
        # torch's own text goes on to suggest weights_only=False, which runs whatever code the file holds: only the
        # global it refused is kept.
        refused = next((line.strip() for line in str(err).splitlines() if "Unsupported global" in line), None)
        return (
            f"{path.name} does not load as the trainer loads it, weights only ({refused or 'its pickle is corrupt'})"
        )
    except Exception as err:  # noqa: BLE001 (torch raises RuntimeError, EOFError, ValueError... for a bad file)
        return f"{path.name} does not load ({_first_line(err)})"
    return None


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of `output_dir`, highest step first."""
    if not os.path.isdir(output_dir):
        return []
    found = [p for p in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda path: int(path.name.split("-")[-1]), reverse=True)


def last_complete_checkpoint(output_dir: str | os.PathLike, *, warn: bool = False) -> str | None:
    """The highest-numbered `checkpoint-*` in `output_dir` that resumes (`checkpoint_damage`), or None.
    transformers' `get_last_checkpoint` takes the highest number whatever it holds, so a run killed while saving, or a
    damaged file, would stop the resumed run (or, without its optimizer, silently restart Adam). With `warn`, each
    damaged checkpoint passed over is logged with what is wrong, and the one taken instead."""
    skipped = False
    for path in checkpoints(output_dir):
        problem = checkpoint_damage(path)
        if problem is None:
            if warn and skipped:
                logger.warning("resume_from_checkpoint: resuming from %s instead", path)
            return str(path)
        skipped = True
        if warn:
            logger.warning("resume_from_checkpoint: %s is damaged, %s: skipped", path, problem)
    return None


def resume_checkpoint(training_args: Any) -> str | None:
    """The checkpoint `training_args.resume_from_checkpoint` asks for: a folder, refused when it does not resume
    (`checkpoint_damage`), or `true` for the last intact `checkpoint-*` in `output_dir` (`last_complete_checkpoint`:
    damaged later ones are passed over, said so); None when not asked (then an existing checkpoint is pointed out, not
    used). The configs resolve it at parse already (`resolve_resume`)."""
    value, output_dir = training_args.resume_from_checkpoint, training_args.output_dir
    if not _asked(value):
        last = last_complete_checkpoint(output_dir)
        if last is not None:
            logger.warning("%s holds %s; pass --resume_from_checkpoint true to continue from it", output_dir, last)
        return None
    if value is True or str(value).lower() == "true":
        last = last_complete_checkpoint(output_dir, warn=True)
        if last is None:
            damaged = [f"{path.name} ({checkpoint_damage(path)})" for path in checkpoints(output_dir)]
            raise ValueError(
                f"resume_from_checkpoint: true needs an intact checkpoint-* folder in output_dir {output_dir} (its "
                f"weights, {OPTIMIZER_NAME}, {SCHEDULER_NAME} and {TRAINER_STATE_NAME} loading), but "
                + (f"every one is damaged: {'; '.join(damaged)}" if damaged else "it holds none")
                + ". Set output_dir to the run's, resume_from_checkpoint to a checkpoint folder, or false to start over."
            )
        return last
    if not os.path.isdir(value):
        raise ValueError(f"resume_from_checkpoint: {value} is not a checkpoint folder")
    problem = checkpoint_damage(value)
    if problem is not None:
        raise ValueError(f"resume_from_checkpoint: {value} is damaged, {problem}; name an intact checkpoint folder")
    return value


def _asked(value: Any) -> bool:
    return not (value is None or value is False or str(value).lower() in ("", "false"))


def resolve_resume(training_args: Any) -> None:
    """At parse: `resume_from_checkpoint: true` becomes the checkpoint `resume_checkpoint` resolves it to (damaged
    later ones passed over, said so) and a named folder is checked, so a run with nothing intact to resume from fails
    before any weight loads. Unset, it is left alone: the entry script points out an existing checkpoint later."""
    if _asked(training_args.resume_from_checkpoint):
        training_args.resume_from_checkpoint = resume_checkpoint(training_args)


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
