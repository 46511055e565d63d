"""Setup shared by the entry scripts (`sft.py`, `rl.py`, `evaluate.py`): parsing, data, policy, and the checks and
saving every run needs.

Each entry script has one skeleton: parse (`parse_args_and_record`: `--config recipe.yaml` merged over the base
recipes it names with `base:`, any field overridable on the command line, tool settings defaulting to the starting
checkpoint's record), load (these helpers; `load_policy` checks the model fields first: `check_model`), build the
trainer, check it (`check_master_weights`), train (`resume_checkpoint`), save (`save_outputs`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch
import trl
import yaml
from accelerate import PartialState
from accelerate.utils import DistributedType
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    PretrainedConfig,
    PreTrainedModel,
    ProcessorMixin,
    Trainer,
)

from data import DATASETS, get_dataset
from data.benchmarks import load_saved_split
from data.synthetic import DEFAULT_IMAGE_SIZE, DEFAULT_OBJECT_FRACTION, QUESTION_TYPES
from memory import check_lora_targets, resolve_config_path
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
    synthetic_image_size: list[int] = field(
        default_factory=lambda: list(DEFAULT_IMAGE_SIZE),
        metadata={
            "help": "Synthetic data: the range each image side is drawn from, in pixels (low, high). Larger than the "
            "crop budget needs wastes decoding time: the tiny policy sees ~112 px crops of its zooms."
        },
    )
    synthetic_object_fraction: list[float] = field(
        default_factory=lambda: list(DEFAULT_OBJECT_FRACTION),
        metadata={
            "help": "Synthetic data: object size range as a fraction of the image's short side. With the pixel "
            "budget (max_pixels) it sets how many pixels a target covers in the image the model sees, and so "
            "whether it can be read without zooming."
        },
    )
    synthetic_question_types: list[str] = field(
        default_factory=lambda: list(QUESTION_TYPES),
        metadata={"help": f"Synthetic data: the question types to cycle through, a subset of {list(QUESTION_TYPES)}."},
    )
    synthetic_region_hint: bool = field(
        default=False,
        metadata={
            "help": "Synthetic data: each question names the cell of the image's 3x3 grid that holds its target "
            "('Look in the top left of the image.'), for a policy that cannot localize from pixels (the tiny one)."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["outcome", "format"],
        metadata={"help": "Outcome reward functions by name (task.REWARDS)."},
    )


# ----------------------------------------------------------------------------------------------------------- parse
BASE_KEY = "base"
RESOLVED_RECIPE_NAME = "recipe.yaml"


@dataclass
class Recipe:
    """A recipe with its bases merged: `values` as TrlParser reads them, and which file set each one."""

    path: Path
    values: dict[str, Any]
    origin: dict[str, Path]
    files: list[Path]  # every file read, bases first, in the order they were merged


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read a recipe YAML and the base recipes it names, merged into one flat mapping.

    A recipe may start with `base: <file>` or `base: [<file>, ...]` (paths relative to the recipe itself): the bases
    are read first (each with its own bases: chains are allowed), in order, and every key the recipe sets replaces the
    base's value whole (a list or a mapping is not merged key by key). So a value shared by several recipes (the
    paper's MAPO values, the pixel budgets SFT and RL must agree on, the LoRA block) is written once. A missing base
    file or a cycle fails with the chain that led to it.
    """
    return _load_recipe(Path(path), ())


def _load_recipe(path: Path, chain: tuple[Path, ...]) -> Recipe:
    if path.resolve() in (p.resolve() for p in chain):
        raise ValueError(f"recipe bases form a cycle: {' -> '.join(map(str, (*chain, path)))}")
    if not path.is_file():
        named_by = f" (named by `{BASE_KEY}:` in {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"recipe {path} does not exist{named_by}")
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(values, dict):
        raise ValueError(f"recipe {path} must be a YAML mapping of field: value, got {type(values).__name__}")
    bases = values.pop(BASE_KEY, None)
    bases = [bases] if isinstance(bases, str) else bases if bases is not None else []
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ValueError(f"{path}: `{BASE_KEY}:` must be a recipe file or a list of them, got {bases!r}")
    merged, origin, files = {}, {}, []
    for base in bases:
        parent = _load_recipe(Path(os.path.normpath(path.parent / base)), (*chain, path))
        merged.update(parent.values)
        origin.update(parent.origin)
        files += parent.files
    merged.update(values)
    origin.update(dict.fromkeys(values, path))
    return Recipe(path, merged, origin, list(dict.fromkeys([*files, path])))


def format_recipe(recipe: Recipe, header: Sequence[str] = ()) -> str:
    """The merged recipe as one flat YAML file, its keys grouped by the file that set them: what a run really used,
    rerunnable with `--config` on its own (it names no base)."""
    lines = [f"# {line}" for line in header]
    for source in recipe.files:
        keys = {k: v for k, v in recipe.values.items() if recipe.origin[k] == source}
        if keys:
            lines += ["", f"# from {source}"]
            for key, value in keys.items():  # one line per key; lists and mappings of scalars inline, as written
                flow = None if isinstance(value, list | dict) else False
                lines.append(yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=flow).rstrip())
    return "\n".join(lines) + "\n"


class RecipeParser(trl.TrlParser):
    """`TrlParser` whose `--config` recipe may name base recipes (`load_recipe`); everything else is TRL's."""

    def parse_args_and_config(self, args: Iterable[str] | None = None, **kwargs) -> tuple:
        args = list(sys.argv[1:] if args is None else args)
        if "--config" not in args:
            return super().parse_args_and_config(args, **kwargs)
        index = args.index("--config")
        recipe = load_recipe(args[index + 1])
        del args[index : index + 2]
        values = dict(recipe.values)
        env = values.pop("env", {})  # as TrlParser: the recipe's `env` mapping goes into os.environ
        if not isinstance(env, dict):
            raise ValueError(f"{recipe.path}: `env` must be a mapping of variable: value")
        os.environ.update({key: str(value) for key, value in env.items()})
        unknown = self.set_defaults_with_config(**values)[::2]  # ["--key", "value", ...]
        if unknown:
            where = ", ".join(f"{key[2:]} (set in {recipe.origin[key[2:]]})" for key in unknown)
            raise ValueError(
                f"Unknown arguments from config file {recipe.path}: {where}; no dataclass of this script has them."
            )
        return super().parse_args_and_config(args, **kwargs)


def parse_args_and_record(
    dataclass_types: Iterable[type], argv: Sequence[str] | None = None, *, save_recipe: bool = False
) -> tuple:
    """`TrlParser(dataclass_types).parse_args_and_config(argv)`, with recipe bases and the starting checkpoint's
    record as defaults.

    Precedence: the command line, then the recipe (`--config`, its `base:` files merged under it: `load_recipe`),
    then the record of the checkpoint named by `model_name_or_path` (`tool_config.json`: the tool settings it was
    trained with and, after RL, its rollout budget), then the dataclass defaults. A value that differs from the
    record warns with both values. With `save_recipe` (the entry scripts' command line) the merged recipe is written
    to `<output_dir>/recipe.yaml` by the first process, with the command line in its header.
    """
    dataclass_types = tuple(dataclass_types)
    argv = list(sys.argv[1:] if argv is None else argv)
    parsed = RecipeParser(dataclass_types).parse_args_and_config(list(argv))
    checkpoint = next(p.model_name_or_path for p in parsed if hasattr(p, "model_name_or_path"))
    record = read_record(checkpoint)
    if record is not None:
        parser = RecipeParser(dataclass_types)
        parser.set_defaults_with_config(**record["tool"], **record["rollout"])  # keys no dataclass has are ignored
        parsed = parser.parse_args_and_config(list(argv))
        values = {name: value for p in parsed for name, value in vars(p).items()}
        warn_on_mismatch(checkpoint, record_mismatches(record, values))
    if "--config" in argv:
        recipe = load_recipe(argv[argv.index("--config") + 1])
        if len(recipe.files) > 1:
            logger.info("recipe %s: merged from (last wins) %s", recipe.path, ", ".join(map(str, recipe.files)))
        output_dir = next((p.output_dir for p in parsed if hasattr(p, "output_dir")), None)
        if save_recipe and output_dir and int(os.environ.get("RANK", "0")) == 0:
            save_resolved_recipe(recipe, output_dir, argv)
    return parsed


def save_resolved_recipe(recipe: Recipe, output_dir: str | os.PathLike, argv: Sequence[str]) -> Path:
    """`<output_dir>/recipe.yaml`: the merged recipe, and the command line that ran it, for reproducing the run."""
    path = Path(output_dir) / RESOLVED_RECIPE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    script = os.path.basename(sys.argv[0]) or "python"
    header = [
        f"The recipe {script} ran: {recipe.path}, merged from (last wins) {', '.join(map(str, recipe.files))}.",
        f"Command line: {script} {' '.join(argv)}",
        f"Rerun: {script} --config {path} <the command line's flags but --config>",
    ]
    path.write_text(format_recipe(recipe, header), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------------------ load
def synthetic_world(script_args: ScriptArguments) -> dict[str, Any]:
    """`data.synthetic.build_synthetic`'s world keywords from a recipe's `synthetic_*` fields."""
    return {
        "min_size": script_args.synthetic_image_size[0],
        "max_size": script_args.synthetic_image_size[1],
        "object_fraction": tuple(script_args.synthetic_object_fraction),
        "question_types": tuple(script_args.synthetic_question_types),
        "region_hint": script_args.synthetic_region_hint,
    }


def load_split(script_args: ScriptArguments, split: str) -> datasets.Dataset:
    """One split of the recipe's dataset: from a `save_to_disk` folder, or built by a registered builder."""
    name = script_args.dataset_name
    if os.path.isdir(name):
        return load_saved_split(name, split)
    if name == "synthetic":
        return get_dataset(
            name, n=script_args.num_samples, seed=script_args.dataset_seed, split=split, **synthetic_world(script_args)
        )
    return get_dataset(name, path=script_args.dataset_path, split=split)


def load_policy(model_args: trl.ModelConfig, tool: ToolConfig) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The policy and its processor (with the repo's tool-calling chat template and `tool`'s pixel budget), after
    `check_model`. `load_in_4bit`/`load_in_8bit` load the base through bitsandbytes with TRL's
    `get_quantization_config`, as TRL's own scripts do (a GPU and `requirements-gpu.txt` needed)."""
    path = model_args.model_name_or_path
    if path.startswith(("outputs/", "./outputs/")) and not os.path.isdir(path):
        raise FileNotFoundError(
            f"model_name_or_path: {path} does not exist; it is an earlier stage's output (make sft before make rl)."
        )
    check_model(model_args)
    processor = load_processor(path, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    kwargs = model_init_kwargs(model_args)
    quantization = trl.get_quantization_config(model_args)
    if quantization is not None:  # each process's 4/8-bit weights on its own GPU (TRL < 1.x's get_kbit_device_map)
        kwargs |= {"quantization_config": quantization, "device_map": {"": PartialState().local_process_index}}
    model = load_model(path, **kwargs)
    return model, processor


SUPPORTED_FAMILIES = {"qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL"}  # config.json model_type -> family


def model_config(model_args: trl.ModelConfig) -> PretrainedConfig | None:
    """The architecture of `model_name_or_path`, read without its weights, or None (logged) when it cannot be read.

    A local folder's `config.json`; for a hub name, the copy shipped in `recipes/model_configs/` when its last name
    matches (offline), else the hub's (network). Fails when the model is of a family the repo does not support: its
    processor, chat template and zoom-tool frame are Qwen2.5-VL's and Qwen3-VL's.
    """
    name = model_args.model_name_or_path
    source = resolve_config_path(name)
    revision = model_args.model_revision if source == name else None  # shipped copies are of the main revision
    try:
        raw, _ = PretrainedConfig.get_config_dict(source, revision=revision)
    except OSError as err:  # offline (HF_HUB_OFFLINE) or unreachable, and no shipped copy
        logger.warning(
            "model_name_or_path: cannot read the config of %s (%s); its model family and lora_target_modules are "
            "not checked before loading",
            name,
            str(err).splitlines()[0],
        )
        return None
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_FAMILIES:
        supported = ", ".join(f"{family} (model_type {key})" for key, family in SUPPORTED_FAMILIES.items())
        raise ValueError(
            f"model_name_or_path: {name} is a {model_type!r} model ({', '.join(raw.get('architectures') or [])}); "
            f"supported model families: {supported}"
        )
    return AutoConfig.from_pretrained(source, revision=revision)


def check_model(model_args: trl.ModelConfig) -> PretrainedConfig | None:
    """Start-up checks of the model fields, before any weight is read; each error names the field and what it
    accepts. The family (`model_config`); quantisation only with LoRA; every `lora_target_modules` entry selecting
    some module of the real module tree (built on the meta device from the config: no weights, about a second for
    8B; `memory.check_lora_targets`, stricter than peft, which only fails when no entry matches)."""
    if (model_args.load_in_4bit or model_args.load_in_8bit) and not model_args.use_peft:
        raise ValueError(
            "load_in_4bit/load_in_8bit: quantized weights cannot be fully fine-tuned; set use_peft: true (QLoRA) "
            "or load_in_4bit: false"
        )
    config = model_config(model_args)
    if config is not None and model_args.use_peft and model_args.lora_target_modules is not None:
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        try:
            check_lora_targets(model, model_args.lora_target_modules)
        except ValueError as err:
            raise ValueError(f"lora_target_modules: {err}") from None
    return config


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


def keep_adapters_in_fp32(model: torch.nn.Module) -> int:
    """QLoRA: put the trainable adapters of a 4/8-bit model back in float32; returns how many tensors it cast.

    TRL 1.16's GRPO and SFT trainers cast them to bfloat16 (the QLoRA paper's choice, made at lr 2e-4); at this
    repo's learning rates (1e-5 for RL) a bfloat16 adapter's updates round away, which `check_master_weights` then
    refuses. float32 adapters are PEFT's own default; the frozen 4-bit base still computes in `dtype`.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not (getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)):
        return 0
    cast = [p for p in model.parameters() if p.requires_grad and p.dtype in HALF_DTYPES]
    for param in cast:
        param.data = param.data.float()
    return len(cast)


# ------------------------------------------------------------------------------------------------------------ save
def save_outputs(trainer: Trainer, processor: ProcessorMixin, tool: dict[str, Any], **rollout: Any) -> None:
    """The final model, its processor and its `tool_config.json`, into `output_dir`."""
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(output_dir)
        write_record(output_dir, tool, **rollout)
