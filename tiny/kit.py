"""Build the tiny offline model kit that tests, CI and the demo run on instead of the real checkpoints
(`docs/demo.md`, "The tiny kit"): the real architectures and file layouts, so the recipes' loading code
(`utils/models.py`) runs unchanged, with small sizes and seeded random weights (a rebuild is bit-identical).

    python -m scripts.build_tiny_kit --output_dir outputs/tiny [--seed 0]   (make tiny)

A rebuild writes only the models that are missing or differ from what is there (`publish`), so adding a model to the
kit leaves the built ones, which other processes may be reading, untouched.
"""

from __future__ import annotations

import copy
import filecmp
import itertools
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import open_clip
import torch
from open_clip.transform import PreprocessCfg
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import (
    AddedToken,
    GenerationConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Config,
    Qwen2Model,
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from data import task
from tools import get_tools, tool_call_text
from utils.models import CHAT_TEMPLATES, load_chat_template, save_clip

# The tools whose schemas the kit's tokenizer trains on (`Tool.kit_schema`): another tool tokenizes all the same,
# byte-level, in more tokens; adding it here retrains the tokenizer, and so every tiny model.
KIT_TOOLS = ("zoom_in",)
BPE_VOCAB_SIZE = 1024
VOCAB_SIZE = 1088  # BPE vocab + 22 added tokens, padded to a multiple of 64 as Qwen pads its embedding matrix
MAX_POSITIONS = 4096  # room for multi-turn rollouts with several images
MIN_PIXELS, MAX_PIXELS = 28 * 28 * 4, 28 * 28 * 16  # a 448x448 image becomes 112x112: an 8x8 patch grid, 16 tokens
# Qwen3-VL: 16-pixel patches merged 2 x 2, so a 448x448 image becomes 128x128, also 16 tokens.
QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS = 32 * 32 * 4, 32 * 32 * 16
# The text towers' common sizes (hidden 64, 2 layers).
TEXT_SIZES = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    max_position_embeddings=MAX_POSITIONS,
)  # fmt: skip

# Qwen2.5-VL's added tokens in its own id order. The first 14 are special; the rest are not, so `<tool_call>` survives
# `skip_special_tokens=True` decoding, which is what tool-call parsing reads.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
NON_SPECIAL_TOKENS = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
ADDED_TOKENS = SPECIAL_TOKENS + NON_SPECIAL_TOKENS

COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "black", "white", "gray", "brown", "pink", "cyan"]
SHAPES = ["circle", "square", "triangle", "star", "rectangle", "diamond", "cross", "hexagon", "arrow", "heart"]
OBJECTS = [
    "car", "bus", "person", "dog", "cat", "bird", "tree", "house", "window", "door", "clock", "bottle", "cup",
    "book", "phone", "laptop", "chair", "table", "flower", "ball", "kite", "boat", "train", "bicycle", "umbrella",
    "bag", "hat", "shirt", "shoe", "sign", "poster", "screen", "menu", "license plate", "street name", "logo",
]  # fmt: skip
PLACES = ["top left", "top right", "bottom left", "bottom right", "center", "left", "right", "top", "bottom"]


def kit_paths(output_dir: str | Path) -> dict[str, Path]:
    """Where `build_tiny_kit` puts each model, without building anything (a built kit is found by these paths)."""
    folders = {
        "policy": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen3_5": "qwen3_5", "clip": "clip", "text_encoder": "text_encoder",
    }  # fmt: skip
    return {name: Path(output_dir) / folder for name, folder in folders.items()}


def tokenizer_corpus() -> list[str]:
    """Deterministic training text: the prompts, tool schema and tool calls, answers and digits the agents see."""
    lines = [load_chat_template(), task.SYSTEM_PROMPT, task.USER_SUFFIX, " ".join(str(i) for i in range(1000))]
    lines += [
        *(tool.kit_schema for tool in get_tools(KIT_TOOLS)),
        "Options:\n" + "\n".join(f"{letter}. {colour}" for letter, colour in zip(task.OPTION_LETTERS, COLOURS)),
    ]
    for i, (colour, shape, place) in enumerate(itertools.product(COLOURS, SHAPES, PLACES)):
        x, y = (37 * i) % 400, (91 * i) % 400
        bbox = [x, y, x + 16 + i % 48, y + 24 + i % 32]
        letter = task.OPTION_LETTERS[i % len(task.OPTION_LETTERS)]
        lines += [
            f"What colour is the {shape} in the {place} of the image?",
            f"<think>The {shape} in the {place} is too small to see, so I zoom in.</think>\n"
            + tool_call_text(bbox, f"{colour} {shape}"),
            f"<tool_response>\nZoomed in on {bbox} ({colour} {shape}).\n</tool_response>",
            f"<think>The zoomed view shows a {colour} {shape}.</think> <answer>{letter}</answer>",
            f"<answer>{colour}</answer> \\boxed{{{colour}}}",
        ]
    for i, (thing, other, place) in enumerate(itertools.product(OBJECTS, OBJECTS[::-1], PLACES)):
        lines += [
            f"How many {thing}s are there near the {other}? Is the {thing} to the {place} of the {other}?",
            f"What is written on the {thing}? I cannot read it yet; the {other} in the {place} is blurry.",
            f"The {COLOURS[i % len(COLOURS)]} {thing} is next to the {other}. There are {i % 10} of them.",
        ]
    for token in ADDED_TOKENS:  # matched before BPE runs, so don't spend merges on them
        lines = [line.replace(token, " ") for line in lines]
    return lines


def build_tokenizer() -> Qwen2Tokenizer:
    """A Qwen2-style byte-level BPE tokenizer trained offline, with Qwen2.5-VL's added tokens at ids 1024..1045."""
    bpe = Tokenizer(BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(  # Qwen2's: digits split one by one, so bbox numbers tokenize alike
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(tokenizer_corpus(), trainer)
    state = json.loads(bpe.to_str())["model"]
    vocab = state["vocab"]
    assert len(vocab) == BPE_VOCAB_SIZE, f"corpus too small: {len(vocab)} < {BPE_VOCAB_SIZE} BPE tokens"
    # Added tokens go in the vocab first: Qwen2Tokenizer registers its eos/pad itself, which would otherwise take the
    # first free ids in the wrong order.
    vocab |= {token: BPE_VOCAB_SIZE + i for i, token in enumerate(ADDED_TOKENS)}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[tuple(merge) for merge in state["merges"]],  # tokenizers 0.23 rejects "a b" strings
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.add_special_tokens({"extra_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in NON_SPECIAL_TOKENS])
    tokenizer.chat_template = load_chat_template()
    return tokenizer


def _build_vl(output_dir: Path, seed: int, model_cls, config_cls, text: dict, vision: dict, processor) -> None:
    """A tiny VL model of `model_cls` (real architecture, random weights; `TEXT_SIZES` plus `text`, and `vision`)
    saved with `processor` (and its tokenizer) as a hub checkpoint would be."""
    tokenizer = processor.tokenizer
    pad, eos, ids = tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids
    config = config_cls(
        text_config=TEXT_SIZES | text | {"bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad},
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)


def build_policy(output_dir: Path, tokenizer: Qwen2Tokenizer, seed: int) -> None:
    """A tiny Qwen2.5-VL and its processor."""
    # head_dim 32: vLLM's CPU attention rejects 16 (real vLLM runs on this kit in CI); 2 query heads per KV head,
    # grouped-query attention as in every Qwen2.5-VL. mrope_section sums to head_dim / 2.
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
    text = {"num_attention_heads": 2, "num_key_value_heads": 1, "rope_parameters": rope}
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
        "spatial_merge_size": 2, "out_hidden_size": 64, "fullatt_block_indexes": [1],
        "window_size": 56,  # 2x2 merged patches per window, so the windowed-attention path is exercised
    }  # fmt: skip
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=tokenizer.chat_template,
    )
    _build_vl(output_dir, seed, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig, text, vision, processor)


def build_qwen3_vl(output_dir: Path, tokenizer: Qwen2Tokenizer, seed: int) -> None:
    """A tiny Qwen3-VL and its own processor: sizes as the Qwen2.5-VL one's, fields those of Qwen3-VL-8B's
    `config.json` (`recipes/model_configs/Qwen3-VL-8B-Instruct`), shrunk."""
    # Qwen3 states its head size: 32 (vLLM's CPU attention rejects 16), twice hidden_size / heads, so a reader that
    # derives it from the hidden size (the memory estimator, vLLM's loader) is caught out here. Interleaved multimodal
    # rotary positions, Qwen3-VL's: the 8B's [24, 20, 20] of 64 scaled to head_dim / 2.
    rope = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5], "mrope_interleaved": True}
    text = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rope_parameters": rope}
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64,
        "num_position_embeddings": 64,  # an 8x8 learned grid, resampled to each image's patch grid
        "deepstack_visual_indexes": [0],  # the first vision layer's features join the first decoder layer
    }  # fmt: skip
    _build_vl(
        output_dir, seed, Qwen3VLForConditionalGeneration, Qwen3VLConfig, text, vision, qwen3_processor(tokenizer)
    )


def qwen3_processor(tokenizer: Qwen2Tokenizer) -> Qwen3VLProcessor:
    """Qwen3-VL's processor at the tiny budget (4 to 16 tokens an image), which Qwen3.5 shares."""
    budget = {"shortest_edge": QWEN3_MIN_PIXELS, "longest_edge": QWEN3_MAX_PIXELS}
    return Qwen3VLProcessor(
        # Qwen3-VL's image processor is Qwen2-VL's with 16-pixel patches and mean/std 0.5 (its preprocessor_config).
        image_processor=Qwen2VLImageProcessor(
            size=budget, patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ),
        tokenizer=tokenizer,
        # Never fed (the task has no video), but an engine sizes its memory for the largest video it allows: keep
        # that the image budget's, not 768 tokens a frame.
        video_processor=Qwen3VLVideoProcessor(size=budget, max_video_tokens=16),
        chat_template=tokenizer.chat_template,
    )


def build_qwen3_5(output_dir: Path, tokenizer: Qwen2Tokenizer, seed: int) -> None:
    """A tiny Qwen3.5 (`Qwen3_5ForConditionalGeneration`, random weights): one Gated DeltaNet (linear attention)
    layer and one gated full-attention layer, as Qwen3.5's 3:1 stack alternates them, and its vision tower, with
    Qwen3-VL's processor (transformers 5.17 gives Qwen3.5 that one) and Qwen3.5's own thinking chat template. Fields
    those of Qwen3.5-9B's `config.json` (`recipes/model_configs/Qwen3.5-9B`), shrunk."""
    # Full attention: head 32 as the tiny Qwen3-VL's (vLLM's CPU attention rejects 16), its query doubled by the
    # output gate (q_proj 2 x 4 x 32). Rotary positions on a quarter of each head, interleaved over 3 sections, as
    # Qwen3.5's (partial_rotary_factor 0.25, [11, 11, 10] of 32 scaled to 4). Linear attention: 1 key and 2 value heads
    # of 128, Qwen3.5's own head size: vLLM 0.31's CPU gated-delta-rule kernel rejects 32 ("Unexpected head dim size").
    rope = {
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }  # fmt: skip
    text = {
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rope_parameters": rope,
        "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 1, "linear_num_value_heads": 2,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    }  # fmt: skip
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64,
        "num_position_embeddings": 64,  # an 8x8 learned grid, resampled to each image's patch grid
    }  # fmt: skip
    tokenizer = copy.deepcopy(tokenizer)  # its own chat template; the kit's other models keep theirs
    tokenizer.chat_template = CHAT_TEMPLATES["qwen3_5_think"]
    _build_vl(
        output_dir, seed, Qwen3_5ForConditionalGeneration, Qwen3_5Config, text, vision, qwen3_processor(tokenizer)
    )


def build_clip(output_dir: Path, seed: int, image_size: int = 64, width: int = 8) -> None:
    """A small open_clip CLIP (modified-ResNet image tower, 2-layer text tower) that trains in minutes on a CPU."""
    model_cfg = {
        "embed_dim": 64,
        "vision_cfg": {"image_size": image_size, "layers": [1, 1, 1, 1], "width": width},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2},
    }
    torch.manual_seed(seed)
    model = open_clip.CLIP(**model_cfg)
    save_clip(model, output_dir, model_cfg, asdict(PreprocessCfg(size=model_cfg["vision_cfg"]["image_size"])))


def build_text_encoder(output_dir: Path, tokenizer: Qwen2Tokenizer, seed: int) -> None:
    """A tiny `Qwen2Model` sharing the policy's tokenizer, standing in for a real text-embedding model."""
    pad = tokenizer.pad_token_id
    config = Qwen2Config(
        **TEXT_SIZES, num_attention_heads=4, num_key_value_heads=2, bos_token_id=pad,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
    )  # fmt: skip
    torch.manual_seed(seed)
    Qwen2Model(config).save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


def same_files(a: Path, b: Path) -> bool:
    """Whether folders `a` and `b` hold the same files, byte for byte."""
    files = [sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) for root in (a, b)]
    return files[0] == files[1] and all(filecmp.cmp(a / name, b / name, shallow=False) for name in files[0])


def publish(build: Callable[[Path], None], dest: Path) -> bool:
    """Build a model into a fresh folder beside `dest` and put it in place only if `dest` is missing or holds other
    files: a rebuild is bit-identical, so a kit already built is not rewritten under the processes reading it. Returns
    whether `dest` was (re)written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{dest.name}-new-", dir=dest.parent))
    fresh.chmod(0o755)  # mkdtemp's 0o700 would hide the model from other users of the kit
    try:
        build(fresh)
        if dest.is_dir() and same_files(fresh, dest):
            return False
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}-old-", dir=dest.parent))
        if dest.exists():
            dest.replace(old / dest.name)
        fresh.replace(dest)
        shutil.rmtree(old, ignore_errors=True)
        return True
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def build_tiny_kit(output_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Build the whole kit into `output_dir` and return `kit_paths(output_dir)`; same seed, same weights. Models
    already there and unchanged are left as they are (`publish`)."""
    paths = kit_paths(output_dir)
    tokenizer = build_tokenizer()
    builders = {
        "policy": lambda out: build_policy(out, tokenizer, seed),
        "qwen3_vl": lambda out: build_qwen3_vl(out, tokenizer, seed),
        "qwen3_5": lambda out: build_qwen3_5(out, tokenizer, seed),
        "clip": lambda out: build_clip(out, seed),
        "text_encoder": lambda out: build_text_encoder(out, tokenizer, seed),
    }
    for name, build in builders.items():
        publish(build, paths[name])
    return paths
