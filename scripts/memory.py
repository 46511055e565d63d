"""GPU memory per GPU of a recipe or an architecture, from its config alone (built on the meta device), and its LoRA
check.

    python -m scripts.memory --model_config recipes/model_configs/Qwen3-VL-8B-Instruct --zero_stage 3 --num_gpus 8
    python -m scripts.memory --recipe recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_lora.yaml --accelerate single_gpu \
        --vllm_colocate 0.3 --vllm_enable_sleep_mode   (more: recipes/README.md, recipes/model_configs/README.md)

GiB (2**30 bytes) per GPU, no weights read. Parameters, gradients and optimizer states are exact under the storage
rules of `estimate_memory`; activations are a rough model (`utils.gpu_memory.activation_bytes`). Not counted: the CUDA
context, fragmentation, DDP's and DeepSpeed's buckets, models beside the policy (the CLIP verifier, a reference model).
`recipes/model_configs/README.md` compares an estimate with a measured peak.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from torch import nn
from transformers import AutoConfig

from configs import MAPOConfig, SFTConfig
from utils.gpu_memory import (
    ADAMW_8BIT_BYTES,
    DEFAULT_GPU_GIB,
    DTYPE_BYTES,
    GIB,
    OPTIMIZER_STATES,
    QUANT_4BIT_BYTES,
    QUANT_4BIT_NESTED_BYTES,
    activation_bytes,
    generation_bytes,
    kv_width,  # noqa: F401 (importable here as before the byte models moved)
    parameter_count,
    with_colocated_vllm,
    with_generation,
)
from utils.lora import (
    check_lora_targets,
    is_vision_module,
    lora_matches,
    normalise_target_modules,
    output_module_names,
)
from utils.models import RECIPES_DIR, build_on_meta, resolve_config_path
from utils.recipes import REAL_RECIPE_BASE, flag_values, load_recipe
from utils.trainable import PROJECTOR, frozen_prefixes, is_under, quantized_linear_modules

# Text tokens around the images in a recipe's worst case (the tiny kit's byte-level tokenizer measures more; Qwen's,
# about these):
PROMPT_TEXT_TOKENS = 450  # system prompt with the tool schema, question, options, format instruction
SFT_TEXT_TOKENS = 1024  # SFT's gold conversation, a recipe with neither max_length nor measured lengths: <= 2 calls
ACCELERATE_CONFIGS_DIR = RECIPES_DIR / "accelerate_configs"


def _lora_params(module: nn.Module, r: int) -> int:
    """Parameters of one LoRA adapter (A and B, no bias) of rank `r` on `module`."""
    if isinstance(module, nn.Linear):
        return r * (module.in_features + module.out_features)
    if isinstance(module, nn.Embedding):
        return r * (module.num_embeddings + module.embedding_dim)
    if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        return r * (module.in_channels * math.prod(module.kernel_size) + module.out_channels)
    raise TypeError(f"no LoRA for {type(module).__name__}")


def _backpropagates_through_the_tower(trained: set[str] | list[str]) -> bool:
    """Whether a step's backward pass runs through the vision tower: some trained name lies in it before the
    projector (its inputs then require grad, `utils.trainable.enable_input_require_grads`); a trained projector alone
    gets its gradient without one."""
    return any(is_vision_module(name) and not is_under(name, [PROJECTOR]) for name in trained)


def estimate_memory(
    model: nn.Module,
    *,
    dtype: str = "bfloat16",
    trainable: str = "full",
    lora_r: int = 16,
    lora_targets: str | Sequence[str] | None = None,
    optimizer: str = "adamw",
    zero_stage: int = 0,
    num_gpus: int = 1,
    master_weights_fp32: bool | None = None,
    micro_batch: int = 1,
    seq_len: int = 2048,
    gradient_checkpointing: bool = True,
    image_tokens: int = 0,
    logit_tokens: int | None = None,
    load_in_4bit: bool = False,
    nested_quant: bool = False,
    adapter_dtype: str | None = None,
    fused_lm_head: bool = True,
    freeze_vision_tower: bool = False,
    freeze_projector: bool = False,
) -> dict[str, float]:
    """GiB per GPU: `parameters`, `gradients`, `optimizer_states`, `activations` and their `total`.

    Storage rules (bytes per parameter; `w` is the byte size of `dtype`):
    - Weights in `dtype`; with `load_in_4bit` (QLoRA) every Linear weight but the output head's and the vision
      tower's (`utils.trainable.QUANTIZATION_SKIP_MODULES`) takes `QUANT_4BIT_BYTES` (`nested_quant`:
      `QUANT_4BIT_NESTED_BYTES`).
    - `trainable="full"` trains every parameter outside the parts `freeze_vision_tower` / `freeze_projector` freeze;
      `"lora"` trains rank-`lora_r` adapters on the modules `lora_targets` selects (peft's rules,
      `check_lora_targets`) outside them. Adapters are fp32 unless `adapter_dtype` says otherwise (peft upcasts them;
      TRL keeps them in `dtype` under ZeRO-3 without quantisation).
    - Gradients: one per trainable parameter, in the trainable weights' dtype.
    - Optimizer: `adamw` 2 states, `adamw_8bit` 2 one-byte states, `sgd` none, like the weights (`zeros_like`) unless
      `master_weights_fp32` (the default when `zero_stage > 0`): an fp32 copy and fp32 states, 4 + 8 = 12 bytes.
    - ZeRO: stage 1 divides optimizer states by `num_gpus`, stage 2 also gradients, stage 3 also parameters, plus the
      largest single module gathered in full while it computes. Stage 0 with several GPUs: a full replica per GPU.
    - Activations: `activation_bytes` (rough); the vision tower's only when something in it before the projector
      trains (`utils.trainable.enable_input_require_grads` sends no backward pass into a tower that has nothing to
      train).
    """
    if trainable not in ("full", "lora"):
        raise ValueError(f"trainable must be 'full' or 'lora', got {trainable!r}")
    if optimizer not in (*OPTIMIZER_STATES, "adamw_8bit"):
        raise ValueError(f"optimizer must be one of {[*OPTIMIZER_STATES, 'adamw_8bit']}, got {optimizer!r}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if master_weights_fp32 is None:
        master_weights_fp32 = zero_stage > 0
    w = DTYPE_BYTES[dtype]
    params = list(model.named_parameters())  # each tied weight once: the 3B's lm_head is its embedding
    frozen = frozen_prefixes(model, vision_tower=freeze_vision_tower, projector=freeze_projector)
    quantised = set()
    if load_in_4bit:  # every Linear weight but the skipped modules' (output head, vision tower) and tied ones
        excluded = output_module_names(model)
        quantised = {f"{n}.weight" for n in quantized_linear_modules(model) if n not in excluded}
    quant_bytes = QUANT_4BIT_NESTED_BYTES if nested_quant else QUANT_4BIT_BYTES

    # The model's own weights are stored alike whether they train (full) or not (LoRA, whose adapters come on top).
    base_bytes = sum(p.numel() * (quant_bytes if name in quantised else w) for name, p in params)
    head_trainable = trainable == "full"
    if trainable == "full":
        if load_in_4bit:
            raise ValueError("4-bit weights cannot be fully fine-tuned: use trainable='lora'")
        trained = [name for name, _ in params if not is_under(name, frozen)]
        n_trainable = sum(p.numel() for name, p in params if not is_under(name, frozen))
        vision_trainable = _backpropagates_through_the_tower(trained)
        trainable_w = w
        weight_bytes = base_bytes
    else:
        if lora_targets is None:
            raise ValueError("trainable='lora' needs lora_targets")
        check_lora_targets(model, lora_targets, frozen)
        modules = dict(model.named_modules())
        selected = {name for found in lora_matches(model, lora_targets).values() for name in found}
        selected = {name for name in selected if not is_under(name, frozen)}  # `utils.trainable.lora_exclusions`
        n_trainable = sum(_lora_params(modules[name], lora_r) for name in selected)
        vision_trainable = _backpropagates_through_the_tower(selected)
        head_trainable = bool(selected & output_module_names(model))
        if adapter_dtype is None:
            adapter_dtype = dtype if (zero_stage == 3 and not load_in_4bit) else "float32"
        trainable_w = w if master_weights_fp32 else DTYPE_BYTES[adapter_dtype]
        weight_bytes = base_bytes + n_trainable * trainable_w

    grad_bytes = n_trainable * trainable_w
    state_bytes = 4 if master_weights_fp32 else trainable_w
    per_param = ADAMW_8BIT_BYTES if optimizer == "adamw_8bit" else OPTIMIZER_STATES[optimizer] * state_bytes
    optim_bytes = n_trainable * (per_param + (4 if master_weights_fp32 else 0))

    n = max(num_gpus, 1)
    if zero_stage >= 1:
        optim_bytes /= n
    if zero_stage >= 2:
        grad_bytes /= n
    if zero_stage == 3:
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
        weight_bytes = weight_bytes / n + largest * w

    acts = activation_bytes(
        model,
        micro_batch=micro_batch,
        seq_len=seq_len,
        image_tokens=image_tokens,
        logit_tokens=logit_tokens,
        gradient_checkpointing=gradient_checkpointing,
        vision_trainable=vision_trainable,
        head_trainable=head_trainable,
        fused_lm_head=fused_lm_head,
        dtype=dtype,
    )
    result = {
        "parameters": weight_bytes / GIB,
        "gradients": grad_bytes / GIB,
        "optimizer_states": optim_bytes / GIB,
        "activations": sum(acts.values()) / GIB,
    }
    result["total"] = sum(result.values())
    return result


# ------------------------------------------------------------------------------------------------ from a recipe
@dataclass
class RecipeWorkload:
    """What `estimate_memory` needs, read from a recipe and an accelerate config (`recipe_workload`)."""

    model_config: str
    stage: str  # "rl" or "sft"
    kwargs: dict
    generation: dict | None = None  # `generation_bytes`' arguments; None: no transformers generation
    engine: dict | None = None  # a colocated vLLM engine: `gpu_memory_utilization`, `sleep_mode`; None: none
    lengths: str = ""  # SFT: where its row length comes from

    def describe(self) -> str:
        k = self.kwargs
        shard = f"ZeRO-{k['zero_stage']} x {k['num_gpus']}" if k["zero_stage"] else f"{k['num_gpus']} GPU, no sharding"
        mode = f"LoRA r{k['lora_r']}" if k["trainable"] == "lora" else "full"
        frozen = [part for part in ("vision_tower", "projector") if k.get(f"freeze_{part}")]
        mode += f" ({' and '.join(frozen).replace('_', ' ')} frozen)" if frozen else ""
        return (
            f"{Path(self.model_config).name} {self.stage.upper()}, {mode}{', 4-bit base' if k['load_in_4bit'] else ''}, "
            f"{shard}; per GPU {k['micro_batch']} x {k['seq_len']} tokens ({k['image_tokens']} image, "
            f"{k['logit_tokens']} scored){f'; {self.lengths}' if self.lengths else ''}"
        )


def accelerate_sharding(accelerate: str | os.PathLike) -> tuple[int, int, bool, bool]:
    """`(zero_stage, num_gpus, fp32 master weights, DeepSpeed)` of an accelerate config, by path or by name in
    `recipes/accelerate_configs/`. FSDP (full shard) counts as ZeRO-3 with fp32 master weights; plain data
    parallelism and one process shard nothing."""
    path = Path(accelerate)
    if not path.is_file():
        path = ACCELERATE_CONFIGS_DIR / f"{accelerate}.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    gpus = int(config.get("num_processes", 1))
    kind = config.get("distributed_type")
    if kind == "DEEPSPEED":
        return int(config["deepspeed_config"]["zero_stage"]), gpus, True, True
    if kind == "FSDP":
        return 3, gpus, True, False
    return 0, gpus, False, False


def recipe_workload(
    recipe: str | os.PathLike,
    accelerate: str | os.PathLike,
    num_gpus: int | None = None,
    *,
    vllm_colocate: float | None = None,
    vllm_sleep_mode: bool | None = None,
    recipe_args: Sequence[str] = (),
    sft_lengths: str | os.PathLike | None = None,
) -> RecipeWorkload:
    """The worst-case step of `recipe` (its bases merged) on the hardware of `accelerate`, per GPU.

    Architecture: the shipped config of `model_name_or_path`, else of the recipe's folder (`recipes/<Model>/...`).
    RL: every rollout at `max_completion_length` (all scored) after the prompt image and `PROMPT_TEXT_TOKENS`, the
    prompt image and `max_tool_calling_iterations` full-size crops through the vision tower. SFT, all scored: the
    longest row an SFT run measured (`sft_lengths`: its `data_stats.json`, `data.collator.fit_to_max_length`), at
    most `max_length`; else `max_length` itself (longer rows are left out), its images the prompt image and as many
    full-size crops as the real RL recipes' `max_tool_calling_iterations` (`data.convert` drops rows with more);
    else the image, the crops `call_mix` allows and `SFT_TEXT_TOKENS`. Generation: transformers'
    (`generation_bytes`), a colocated engine's (also with `vllm_colocate`; `vllm_sleep_mode` overrides the recipe's),
    or none (vLLM server).
    """
    values = load_recipe(recipe).values | flag_values(recipe_args)  # the command line's flags over the recipe
    source = resolve_config_path(values["model_name_or_path"])
    if not (Path(source) / "config.json").is_file():
        source = resolve_config_path(Path(recipe).resolve().parents[1].name)
    config = AutoConfig.from_pretrained(source)
    vision = config.vision_config
    factor = vision.patch_size * vision.spatial_merge_size
    image = values["max_pixels"] // factor**2
    crop = values.get("crop_max_pixels", values["max_pixels"]) // factor**2
    generation = None
    if "max_completion_length" in values:
        stage = "rl"
        completion = values["max_completion_length"]
        image_tokens = image + values["max_tool_calling_iterations"] * crop
        seq_len, logit_tokens = image + PROMPT_TEXT_TOKENS + completion, completion
    else:
        stage = "sft"
        max_length = values.get("max_length")
        if sft_lengths is not None:
            measured = json.loads(Path(sft_lengths).read_text(encoding="utf-8"))
            tokens = measured["tokens"]
            seq_len = int(min(tokens["max"], max_length or tokens["max"]))
            image_tokens = min(int(measured["image_tokens"]["max"]), seq_len)
            lengths = (
                f"rows measured in {sft_lengths}: p50 {tokens['p50']:g}, p90 {tokens['p90']:g}, max {tokens['max']:g}"
            )
        elif max_length is not None:
            calls = load_recipe(REAL_RECIPE_BASE).values["max_tool_calling_iterations"]
            seq_len, image_tokens = max_length, min(image + calls * crop, max_length)
            lengths = f"max_length {max_length}: no measured lengths (--sft_lengths)"
        else:
            image_tokens = image + (len(values.get("call_mix", [0, 0, 0])) - 1) * crop
            seq_len = image_tokens + SFT_TEXT_TOKENS
            lengths = "a guessed row: neither max_length nor measured lengths (--sft_lengths)"
        logit_tokens = seq_len
    # The freeze flags the recipe leaves unset take its stage's dataclass default (SFT: frozen; RL: trained).
    defaults = (SFTConfig if stage == "sft" else MAPOConfig).__dataclass_fields__
    freeze = {k: bool(values.get(k, defaults[k].default)) for k in ("freeze_vision_tower", "freeze_projector")}
    zero_stage, config_gpus, master, deepspeed = accelerate_sharding(accelerate)
    num_gpus = num_gpus or config_gpus  # `--num_processes` given to accelerate launch (several nodes, a vLLM GPU)
    lora = bool(values.get("use_peft"))
    kwargs = {
        "dtype": values.get("dtype", "bfloat16"),
        "trainable": "lora" if lora else "full",
        "lora_r": values.get("lora_r", 16),
        "lora_targets": normalise_target_modules(values.get("lora_target_modules")) if lora else None,
        "zero_stage": zero_stage,
        "num_gpus": num_gpus,
        "master_weights_fp32": master,
        "micro_batch": values["per_device_train_batch_size"],
        "seq_len": seq_len,
        "gradient_checkpointing": values.get("gradient_checkpointing", True),
        "image_tokens": image_tokens,
        "logit_tokens": logit_tokens,
        "load_in_4bit": bool(values.get("load_in_4bit")),
        "nested_quant": bool(values.get("use_bnb_nested_quant")),
        **freeze,
    }
    engine = None
    colocated = values.get("use_vllm") and values.get("vllm_mode", "colocate") == "colocate"
    if stage == "rl" and (colocated or vllm_colocate is not None):
        engine = {
            "gpu_memory_utilization": vllm_colocate or values.get("vllm_gpu_memory_utilization", 0.3),
            "sleep_mode": bool(values.get("vllm_enable_sleep_mode") if vllm_sleep_mode is None else vllm_sleep_mode),
        }
    elif stage == "rl" and not values.get("use_vllm"):  # the server generates on GPUs of its own
        steps_per_generation = values.get("steps_per_generation") or values.get("gradient_accumulation_steps", 1)
        rollouts = values["per_device_train_batch_size"] * steps_per_generation  # TRL's default generation batch
        if values.get("generation_batch_size"):
            rollouts = values["generation_batch_size"] // num_gpus
        generation = {
            "rollouts": rollouts,
            "context_len": seq_len,
            "image_tokens": image_tokens,
            "dtype": kwargs["dtype"],
            # DeepSpeed ZeRO-3 gathers the full weights for generation; FSDP one wrapped block at a time.
            "gather_full_weights": deepspeed and zero_stage == 3 and values.get("ds3_gather_for_generation", True),
        }
    return RecipeWorkload(source, stage, kwargs, generation, engine, lengths if stage == "sft" else "")


def estimate_recipe(
    recipe: str | os.PathLike,
    accelerate: str | os.PathLike,
    num_gpus: int | None = None,
    *,
    gpu_gib: float = DEFAULT_GPU_GIB,
    vllm_colocate: float | None = None,
    vllm_sleep_mode: bool | None = None,
    recipe_args: Sequence[str] = (),
    sft_lengths: str | os.PathLike | None = None,
) -> tuple[dict[str, float], str]:
    """`estimate_memory` of a recipe on an accelerate config (`recipe_workload`; `num_gpus` overrides the config's
    `num_processes`) with its generation phase or colocated engine, and the setup in words. The model is built on
    the meta device: its LoRA targets are checked."""
    workload = recipe_workload(
        recipe, accelerate, num_gpus, vllm_colocate=vllm_colocate, vllm_sleep_mode=vllm_sleep_mode,
        recipe_args=recipe_args, sft_lengths=sft_lengths,
    )  # fmt: skip
    model = build_on_meta(workload.model_config)
    estimate = estimate_memory(model, **workload.kwargs)
    if workload.generation is not None:
        estimate = with_generation(estimate, generation_bytes(model, **workload.generation))
    setup = workload.describe()
    if workload.engine is not None:
        estimate = with_colocated_vllm(estimate, gpu_gib=gpu_gib, **workload.engine)
        sleeping = ", sleep mode" if workload.engine["sleep_mode"] else ""
        setup += f"; colocated vLLM at {workload.engine['gpu_memory_utilization']:g} of {gpu_gib:g} GiB{sleeping}"
    return estimate, setup


def format_table(rows: dict[str, float], title: str) -> str:
    """A two-column text table of GiB values."""
    width = max(len(key) for key in rows)
    lines = [title, "-" * (width + 14)]
    lines += [f"{key:<{width}}  {value:8.2f} GiB" for key, value in rows.items()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """CLI: build the model on meta, check the LoRA targets, print the per-GPU memory table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe", help="estimate this recipe's worst-case step (every other flag but --accelerate is read from it)"
    )
    parser.add_argument("--accelerate", default="single_gpu", help="with --recipe: accelerate config, path or name")
    parser.add_argument(
        "--recipe_args",
        default="",
        help="with --recipe: the run's command-line flags over the recipe, quoted ('--per_device_train_batch_size 4')",
    )
    parser.add_argument("--model_config", help="config folder, or a hub name with a shipped copy")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--lora_r", type=int, help="train rank-r LoRA adapters instead of all weights")
    parser.add_argument(
        "--lora_target_modules",
        nargs="+",
        default=["q_proj", "k_proj", "v_proj", "o_proj"],
        help="peft target_modules, passed as TRL's ModelConfig does (a single value is a regex or all-linear)",
    )
    parser.add_argument(
        "--load_in_4bit", action="store_true", help="QLoRA: 4-bit NF4 base weights (vision tower kept)"
    )
    parser.add_argument("--freeze_vision_tower", action="store_true", help="the vision tower does not train")
    parser.add_argument("--freeze_projector", action="store_true", help="the vision projector does not train")
    parser.add_argument("--use_bnb_nested_quant", action="store_true", help="nested (double) quantisation")
    parser.add_argument("--optimizer", default="adamw", choices=[*OPTIMIZER_STATES, "adamw_8bit"])
    parser.add_argument("--zero_stage", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument(
        "--num_gpus", type=int, help="data-parallel GPUs ZeRO shards over (default 1; --recipe: the config's)"
    )
    parser.add_argument(
        "--master_weights_fp32",
        action=argparse.BooleanOptionalAction,
        help="fp32 master weights and states (default: on with DeepSpeed, zero_stage > 0)",
    )
    parser.add_argument("--micro_batch", type=int, default=1, help="per_device_train_batch_size")
    parser.add_argument("--seq_len", type=int, default=2048, help="padded tokens per sample, image tokens included")
    parser.add_argument("--image_tokens", type=int, default=0, help="merged visual tokens per sample (1280 at 1M px)")
    parser.add_argument("--logit_tokens", type=int, help="tokens with logits (GRPO: completion length)")
    parser.add_argument("--no_gradient_checkpointing", action="store_true")
    parser.add_argument("--no_fused_lm_head", action="store_true", help="full logits (a loss outside TRL's trainers)")
    parser.add_argument(
        "--vllm_colocate",
        type=float,
        metavar="UTILIZATION",
        help="add a colocated vLLM engine taking this fraction of the GPU (vllm_gpu_memory_utilization); --recipe: "
        "a recipe in vllm_mode colocate already has one, at its own value",
    )
    parser.add_argument(
        "--vllm_enable_sleep_mode",
        action=argparse.BooleanOptionalAction,
        help="the engine sleeps during training (its share leaves the training peak); --recipe: the recipe's value",
    )
    parser.add_argument(
        "--gpu_memory_gib", type=float, default=DEFAULT_GPU_GIB, help="memory of one GPU, which the engine shares"
    )
    parser.add_argument(
        "--sft_lengths",
        help="with an SFT --recipe: an SFT run's data_stats.json (its rows' measured lengths; default: max_length)",
    )
    args = parser.parse_args(argv)
    if args.recipe:
        estimate, setup = estimate_recipe(
            args.recipe,
            args.accelerate,
            args.num_gpus,
            gpu_gib=args.gpu_memory_gib,
            vllm_colocate=args.vllm_colocate,
            vllm_sleep_mode=args.vllm_enable_sleep_mode,
            recipe_args=shlex.split(args.recipe_args),
            sft_lengths=args.sft_lengths,
        )
        print(format_table(estimate, f"{args.recipe} on {args.accelerate}: {setup}"))
        return estimate
    if not args.model_config:
        parser.error("give --model_config (or --recipe)")

    model = build_on_meta(args.model_config)
    targets = normalise_target_modules(args.lora_target_modules) if args.lora_r else None
    n_modules = check_lora_targets(model, targets) if targets is not None else 0
    estimate = estimate_memory(
        model,
        dtype=args.dtype,
        trainable="lora" if args.lora_r else "full",
        lora_r=args.lora_r or 0,
        lora_targets=targets,
        optimizer=args.optimizer,
        zero_stage=args.zero_stage,
        num_gpus=args.num_gpus or 1,
        master_weights_fp32=args.master_weights_fp32,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        gradient_checkpointing=not args.no_gradient_checkpointing,
        image_tokens=args.image_tokens,
        logit_tokens=args.logit_tokens,
        load_in_4bit=args.load_in_4bit,
        nested_quant=args.use_bnb_nested_quant,
        fused_lm_head=not args.no_fused_lm_head,
        freeze_vision_tower=args.freeze_vision_tower,
        freeze_projector=args.freeze_projector,
    )
    mode = f"LoRA r={args.lora_r} on {n_modules} modules" if args.lora_r else "full fine-tuning"
    title = (
        f"{type(model).__name__}, {parameter_count(model) / 1e9:.3f} B parameters: {mode}, {args.dtype}"
        f"{', 4-bit base' if args.load_in_4bit else ''}, {args.optimizer}, ZeRO-{args.zero_stage} x {args.num_gpus} GPU, "
        f"batch {args.micro_batch} x {args.seq_len} tokens (per GPU)"
    )
    if args.vllm_colocate is not None:
        sleep = bool(args.vllm_enable_sleep_mode)
        estimate = with_colocated_vllm(
            estimate, gpu_memory_utilization=args.vllm_colocate, gpu_gib=args.gpu_memory_gib, sleep_mode=sleep
        )
        title += f", colocated vLLM at {args.vllm_colocate:g} of {args.gpu_memory_gib:g} GiB{', sleep mode' * sleep}"
    print(format_table(estimate, title))
    return estimate


if __name__ == "__main__":
    main()
