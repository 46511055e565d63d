"""A hybrid decoder's layer kinds as the memory estimate reads them from a text config (`scripts.memory`): Qwen3.5
alternates three Gated DeltaNet (linear attention) layers with one gated full-attention layer. Only the full-attention
layers keep a KV cache; each linear layer keeps, per sequence, a recurrent state of fixed size (a key x value matrix
per head) and the last `linear_conv_kernel_dim - 1` inputs of its causal conv."""

from __future__ import annotations

from transformers import PretrainedConfig

LINEAR = "linear_attention"
FULL = "full_attention"
CHUNK = 64  # the chunked gated delta rule's block (transformers' torch path and FLA's kernels)
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def layer_counts(text: PretrainedConfig) -> dict[str, int]:
    """Decoder layers by kind (`layer_types`); a config without them has only full-attention layers."""
    kinds = getattr(text, "layer_types", None) or [FULL] * text.num_hidden_layers
    return {FULL: sum(k != LINEAR for k in kinds), LINEAR: sum(k == LINEAR for k in kinds)}


def linear_widths(text: PretrainedConfig) -> tuple[int, int, int]:
    """A Gated DeltaNet layer's (key, value, conv) widths: all key heads' dims, all value heads', and the conv's
    channels (queries, keys and values: 2 x key + value)."""
    key = text.linear_num_key_heads * text.linear_key_head_dim
    value = text.linear_num_value_heads * text.linear_value_head_dim
    return key, value, 2 * key + value


def recurrent_state_bytes(text: PretrainedConfig, dtype_bytes: int) -> int:
    """Bytes one sequence's linear layers keep between decoding steps, whatever its length: per layer a key x value
    state per value head, in the config's `mamba_ssm_dtype` (Qwen3.5's: float32; vLLM keeps it so too), and the conv's
    last kernel - 1 inputs in the model's dtype. 0 without linear layers."""
    layers = layer_counts(text)[LINEAR]
    if not layers:
        return 0
    state = STATE_DTYPE_BYTES.get(str(getattr(text, "mamba_ssm_dtype", None)), dtype_bytes)
    _, _, conv = linear_widths(text)
    heads = text.linear_num_value_heads * text.linear_key_head_dim * text.linear_value_head_dim
    return layers * (heads * state + conv * (text.linear_conv_kernel_dim - 1) * dtype_bytes)


def linear_saved_elements(text: PretrainedConfig) -> float:
    """Elements per token one Gated DeltaNet layer saves for backward, its MLP and norms aside (rough, high): the
    conv's input and output (2 x conv), the output gate z, the core output and its gated norm (3 x value), the decay
    and write strength per head (a, b, g, beta: 4 x value heads), and the state at each chunk boundary, which the
    chunked rule keeps for its backward (value heads x key x value dims per `CHUNK` tokens), counted in float32 as two
    elements of a 2-byte activation."""
    _, value, conv = linear_widths(text)
    heads = text.linear_num_value_heads
    boundary = heads * text.linear_key_head_dim * text.linear_value_head_dim / CHUNK
    return 2 * conv + 3 * value + 4 * heads + 2 * boundary
