"""The byte models behind `python -m scripts.memory`: the sizes of dtypes, optimizer states and 4-bit weights, the
activations of one training step (`activation_bytes`), what one generation call adds (`generation_bytes`), and what
a colocated vLLM engine adds to what training keeps resident (`with_colocated_vllm`); all from a model's config, no
weights read."""

from __future__ import annotations

from torch import nn

from utils.hybrid import FULL, LINEAR, layer_counts, linear_saved_elements, recurrent_state_bytes
from utils.lora import is_vision_module

GIB = 2**30

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
# Optimizer states per trainable parameter, each 4 bytes beside an fp32 master copy, otherwise the weights' own size
# (torch creates them with `zeros_like(param)`: a bf16 model gets bf16 AdamW states).
OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}  # AdamW: exp_avg and exp_avg_sq; plain SGD: none
ADAMW_8BIT_BYTES = 2.0  # bitsandbytes 8-bit AdamW: two 1-byte states (plus a negligible fp32 scale per 2048 values)

# bitsandbytes NF4/FP4: 4 bits per weight plus one absmax per block of 64 weights, an fp32 or, with nested ("double")
# quantisation, one byte plus an fp32 second-level constant per 256 blocks.
QUANT_4BIT_BLOCK = 64
QUANT_4BIT_BYTES = 0.5 + 4 / QUANT_4BIT_BLOCK
QUANT_4BIT_NESTED_BYTES = 0.5 + 1 / QUANT_4BIT_BLOCK + 4 / (QUANT_4BIT_BLOCK * 256)

# Saved-for-backward elements per token of a Llama/Qwen decoder layer (SDPA or flash attention: no seq^2 scores): the
# normed input, q, rotated q, attention output, post-attention norm input and output (6 x hidden); k, rotated k and v
# (3 x kv_dim); a gated MLP's gate, up, act(gate) and their product (4 x intermediate; an ungated MLP: 2).
HIDDEN_TENSORS_PER_LAYER = 6
KV_TENSORS_PER_LAYER = 3
# TRL 1.16's trainers patch the model with a fused LM head (`trl.trainer.utils.add_fused_lm_head`): log-probs come from
# [4096 tokens x 32768 vocab] logit tiles, and its backward accumulates the head's weight gradient in fp32. Without it
# the scored tokens' logits are materialised: bf16 logits, an fp32 upcast and a bf16 gradient, 2 + 4 + 2 bytes each.
FUSED_TOKEN_CHUNK, FUSED_VOCAB_CHUNK = 4096, 32768  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE, TRL's chunk_size
LOGIT_BYTES = 8

# Generation (no gradients, one layer at a time): per prefill token, the residual stream, the normed input and a
# layer's output (3 x hidden) and the gated MLP's gate, up and act(gate) * up (3 x intermediate) live at once.
GEN_HIDDEN_TENSORS = 3
GEN_MLP_TENSORS = 3
GEN_LOGIT_BYTES = 4  # generate keeps the last position's logits only, upcast to fp32 for sampling
DEFAULT_GPU_GIB = 80.0  # the recipes' GPU class (A100/H100 80 GB), which a colocated engine takes its share of


def kv_width(model: nn.Module) -> int:
    """Width of one token's keys (or values) in a decoder layer: KV heads x head dim."""
    text = model.config.get_text_config()
    return text.num_key_value_heads * (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def parameter_count(model: nn.Module) -> int:
    """Parameters of `model`, each tied weight once."""
    return sum(p.numel() for p in model.parameters())


def activation_bytes(
    model: nn.Module,
    *,
    micro_batch: int,
    seq_len: int,
    image_tokens: int = 0,
    logit_tokens: int | None = None,
    gradient_checkpointing: bool = True,
    vision_trainable: bool = True,
    head_trainable: bool = True,
    fused_lm_head: bool = True,
    dtype: str = "bfloat16",
) -> dict[str, float]:
    """Rough activation bytes of one forward+backward per GPU, by part: `text`, `vision`, `logits`.

    Ignored: RMSNorm's fp32 copies, attention's logsumexp, LoRA's own activations, the transient gradients of the
    layer being recomputed, masks, allocator rounding; eager attention's `heads * seq_len**2` (SDPA is assumed).
    - Decoder, `T = micro_batch * seq_len` tokens in `dtype`: with gradient checkpointing every layer keeps its input
      (`T * hidden`) plus one recomputed layer's saved tensors, `T * (6 * hidden + 3 * kv_dim + 4 * intermediate)`;
      without, every layer keeps the latter. A hybrid's linear layers save `2 * hidden` and their own
      (`utils.hybrid.linear_saved_elements`) in place of attention's, and the larger kind is the one recomputed.
    - Vision tower, only when some vision parameter trains: the same over `micro_batch * image_tokens *
      spatial_merge_size**2` patches (`image_tokens`: merged visual tokens per sample; 1280*28*28 pixels give 1280).
    - Logits of `N = micro_batch * logit_tokens` scored tokens (default `seq_len`; GRPO scores the completion only).
      Fused head: one [4096 x 32768] tile, the scored hidden states (`dtype`) and their fp32 gradient, and when the
      head trains its fp32 weight-gradient accumulator, `vocab * hidden * 4`. Unfused: `N * vocab * LOGIT_BYTES`.
    Adding this to all gradients is conservative: backward frees checkpoints as gradients build up.
    """
    act = DTYPE_BYTES[dtype]
    config = model.config
    text, kv_dim = config.get_text_config(), kv_width(model)

    def stack(n_tokens: int, hidden: int, kv: int, inter: int, layers: int, gated: bool) -> float:
        full_layer = n_tokens * (
            HIDDEN_TENSORS_PER_LAYER * hidden + KV_TENSORS_PER_LAYER * kv + (4 if gated else 2) * inter
        )
        if gradient_checkpointing:
            return act * (layers * n_tokens * hidden + full_layer)
        return act * layers * full_layer

    tokens = micro_batch * seq_len
    parts = {"text": stack(tokens, text.hidden_size, kv_dim, text.intermediate_size, text.num_hidden_layers, True)}
    counts = layer_counts(text)
    if counts[LINEAR]:  # a hybrid (Qwen3.5): its linear layers save their own tensors instead of attention's
        linear = tokens * (2 * text.hidden_size + linear_saved_elements(text) + 4 * text.intermediate_size)
        full = tokens * (HIDDEN_TENSORS_PER_LAYER * text.hidden_size + KV_TENSORS_PER_LAYER * kv_dim)
        full += tokens * 4 * text.intermediate_size
        kept = text.num_hidden_layers * tokens * text.hidden_size
        parts["text"] = act * (
            kept + max(linear, full) if gradient_checkpointing else counts[LINEAR] * linear + counts[FULL] * full
        )
    vision = getattr(config, "vision_config", None)
    parts["vision"] = 0.0
    if vision is not None and image_tokens and vision_trainable:
        patches = micro_batch * image_tokens * vision.spatial_merge_size**2
        gated = any(is_vision_module(n) and n.endswith("gate_proj") for n, _ in model.named_modules())
        parts["vision"] = stack(
            patches, vision.hidden_size, vision.hidden_size, vision.intermediate_size, vision.depth, gated
        )
    scored = micro_batch * (seq_len if logit_tokens is None else logit_tokens)
    if fused_lm_head:
        tile = min(scored, FUSED_TOKEN_CHUNK) * min(text.vocab_size, FUSED_VOCAB_CHUNK) * act
        head_grad = text.vocab_size * text.hidden_size * 4 if head_trainable else 0
        parts["logits"] = float(tile + scored * text.hidden_size * (act + 4) + head_grad)
    else:
        parts["logits"] = float(scored * text.vocab_size * LOGIT_BYTES)
    return parts


def generation_bytes(
    model: nn.Module,
    *,
    rollouts: int,
    context_len: int,
    image_tokens: int = 0,
    dtype: str = "bfloat16",
    gather_full_weights: bool = False,
) -> dict[str, float]:
    """Bytes per GPU one transformers generation call adds to what training keeps resident, by part
    (`gathered_weights`, `kv_cache`, `prefill`, `logits`, and a hybrid's `linear_state`; recipes/README.md, "Recipes,
    hardware and memory"). A hybrid (Qwen3.5) keeps a KV cache in its full-attention layers only, and in each linear
    layer a recurrent state whose size does not grow with the context (`utils.hybrid.recurrent_state_bytes`).

    TRL generates a process's generation batch (`rollouts`) in one `generate` call per tool round, each prefilling the
    whole context again: the worst case is every rollout at `context_len` with every image (`image_tokens` merged
    tokens per rollout). `gather_full_weights`: ZeRO-3 gathers the policy for the call (`ds3_gather_for_generation`).
    """
    w = DTYPE_BYTES[dtype]
    config = model.config
    text, kv_dim = config.get_text_config(), kv_width(model)
    tokens = rollouts * context_len
    prefill = tokens * (GEN_HIDDEN_TENSORS * text.hidden_size + GEN_MLP_TENSORS * text.intermediate_size) * w
    vision = getattr(config, "vision_config", None)
    if vision is not None and image_tokens:
        patches = rollouts * image_tokens * vision.spatial_merge_size**2
        per_patch = GEN_HIDDEN_TENSORS * vision.hidden_size + GEN_MLP_TENSORS * vision.intermediate_size
        prefill = max(prefill, patches * per_patch * w)
    parts = {
        "gathered_weights": float(parameter_count(model) * w) if gather_full_weights else 0.0,
        "kv_cache": float(tokens * layer_counts(text)[FULL] * 2 * kv_dim * w),  # full-attention layers only
        "prefill": float(prefill),
        "logits": float(rollouts * text.vocab_size * GEN_LOGIT_BYTES),
    }
    if layer_counts(text)[LINEAR]:  # a hybrid's linear layers: a fixed-size state per rollout, not a KV cache
        parts["linear_state"] = float(rollouts * recurrent_state_bytes(text, w))
    return parts


def _resident(training: dict[str, float]) -> float:
    """What training keeps between steps (activations are freed): weights, gradient buffers, optimizer states."""
    return training["parameters"] + training["gradients"] + training["optimizer_states"]


def with_generation(training: dict[str, float], generation: dict[str, float]) -> dict[str, float]:
    """`training` (GiB, `scripts.memory.estimate_memory`) plus `generation_<part>` GiB and `generation_total`, the
    peak while generating: what training keeps resident plus `generation_bytes`. `total` stays training's peak."""
    parts = {f"generation_{name}": value / GIB for name, value in generation.items()}
    return training | parts | {"generation_total": _resident(training) + sum(parts.values())}


def with_colocated_vllm(
    training: dict[str, float], *, gpu_memory_utilization: float, gpu_gib: float, sleep_mode: bool
) -> dict[str, float]:
    """`training` (GiB, `scripts.memory.estimate_memory`) with a colocated vLLM engine on each GPU, which takes
    `gpu_memory_utilization` of it at start whatever the rollouts (`vllm_engine`): `generation_total` is what training
    keeps resident plus that share, and `total` training's peak plus it unless the engine sleeps during training
    (`sleep_mode`; what a sleeping engine keeps is not counted). recipes/README.md has the worked rows."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    engine = gpu_memory_utilization * gpu_gib
    total = training["total"] if sleep_mode else training["total"] + engine
    return training | {"vllm_engine": engine, "generation_total": _resident(training) + engine, "total": total}
