"""GPU memory per GPU of a recipe or an architecture, from its config alone (`utils.memory`), and its LoRA check.

    python -m scripts.memory --model_config recipes/model_configs/Qwen2.5-VL-7B-Instruct
    python -m scripts.memory --model_config recipes/model_configs/Qwen2.5-VL-7B-Instruct --lora_r 64 \\
        --lora_target_modules q_proj k_proj v_proj o_proj
    python -m scripts.memory --model_config recipes/model_configs/Qwen3-VL-8B-Instruct --zero_stage 3 --num_gpus 8
    python -m scripts.memory --recipe recipes/Qwen2.5-VL-3B-Instruct/rl/config_mapo_qlora.yaml --accelerate single_gpu
    python -m scripts.memory --recipe recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_lora.yaml --accelerate single_gpu \
        --vllm_colocate 0.3 --vllm_enable_sleep_mode
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from utils.lora import check_lora_targets, normalise_target_modules
from utils.memory import (
    DEFAULT_GPU_GIB,
    DTYPE_BYTES,
    OPTIMIZER_STATES,
    estimate_memory,
    estimate_recipe,
    format_table,
    parameter_count,
    with_colocated_vllm,
)
from utils.models import build_on_meta


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """CLI: build the model on meta, check the LoRA targets, print the per-GPU memory table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe", help="estimate this recipe's worst-case step (every other flag but --accelerate is read from it)"
    )
    parser.add_argument("--accelerate", default="single_gpu", help="with --recipe: accelerate config, path or name")
    parser.add_argument("--model_config", help="config folder, or a hub name with a shipped copy")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--lora_r", type=int, default=None, help="train rank-r LoRA adapters instead of all weights")
    parser.add_argument(
        "--lora_target_modules",
        nargs="+",
        default=["q_proj", "k_proj", "v_proj", "o_proj"],
        help="peft target_modules, passed as TRL's ModelConfig does (a single value is a regex or all-linear)",
    )
    parser.add_argument("--load_in_4bit", action="store_true", help="QLoRA: 4-bit NF4 base weights")
    parser.add_argument("--use_bnb_nested_quant", action="store_true", help="nested (double) quantisation")
    parser.add_argument("--optimizer", default="adamw", choices=[*OPTIMIZER_STATES, "adamw_8bit"])
    parser.add_argument("--zero_stage", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument(
        "--num_gpus",
        type=int,
        default=None,
        help="data-parallel GPUs ZeRO shards over (default 1; --recipe: the config's)",
    )
    parser.add_argument(
        "--master_weights_fp32",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fp32 master weights and states (default: on with DeepSpeed, zero_stage > 0)",
    )
    parser.add_argument("--micro_batch", type=int, default=1, help="per_device_train_batch_size")
    parser.add_argument("--seq_len", type=int, default=2048, help="padded tokens per sample, image tokens included")
    parser.add_argument("--image_tokens", type=int, default=0, help="merged visual tokens per sample (1280 at 1M px)")
    parser.add_argument("--logit_tokens", type=int, default=None, help="tokens with logits (GRPO: completion length)")
    parser.add_argument("--no_gradient_checkpointing", action="store_true")
    parser.add_argument("--no_fused_lm_head", action="store_true", help="full logits (a loss outside TRL's trainers)")
    parser.add_argument(
        "--vllm_colocate",
        type=float,
        default=None,
        metavar="UTILIZATION",
        help="add a colocated vLLM engine taking this fraction of the GPU (vllm_gpu_memory_utilization); --recipe: "
        "a recipe in vllm_mode colocate already has one, at its own value",
    )
    parser.add_argument(
        "--vllm_enable_sleep_mode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the engine sleeps during training (its share leaves the training peak); --recipe: the recipe's value",
    )
    parser.add_argument(
        "--gpu_memory_gib", type=float, default=DEFAULT_GPU_GIB, help="memory of one GPU, which the engine shares"
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
