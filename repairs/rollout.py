"""TRL 1.16's multi-turn rollout, piece by piece, outside a trainer (the token budget of its worst case:
`repairs.token_budget`).

`GRPOTrainer` builds a rollout with `environment_factory` from methods bound to the trainer (`_tokenize_prompts`,
`_get_tool_suffix_ids`, `_tool_call_loop`); the same steps are restated here as functions, so evaluation
(`evaluation.agent`) replays training's rollout token for token and `repairs.token_budget` measures it with the real
chat template before training starts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase, ProcessorMixin
from trl.data_utils import prepare_multimodal_messages

from tools import ZoomInEnv, environment_tools

logger = logging.getLogger(__name__)

IMAGE_PAD = "<|image_pad|>"


# ------------------------------------------------------------------------------------------------ the rollout
def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model_eos: int | list[int] | None = None) -> list[int]:
    """The tokens that end a turn, as `GRPOTrainer` collects them: the model's EOS ids, with the tokenizer's EOS
    (`<|im_end|>`) put first when missing."""
    ids = [model_eos] if isinstance(model_eos, int) else list(model_eos or [])
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]


def until_eos(ids: Sequence[int], eos_ids: Sequence[int], budget: int) -> list[int]:
    """`ids` cut after the first EOS (what follows is padding of a batch that kept generating) and to `budget`."""
    for i, token in enumerate(ids[:budget]):
        if token in eos_ids:
            return list(ids[: i + 1])
    return list(ids[:budget])


def placeholder_tokens(processor: ProcessorMixin) -> list[str]:
    """The image and video placeholder tokens, which generation must never sample: one with no image behind it
    breaks the next forward pass (the rope index) or misplaces the features. TRL 1.16 suppresses only the image
    token, and only in transformers generation."""
    return [t for t in (getattr(processor, "image_token", None), getattr(processor, "video_token", None)) if t]


def ban_placeholder_tokens(trainer) -> None:
    """Keep a `GRPOTrainer`'s generation, either backend, from sampling `placeholder_tokens`: transformers'
    `suppress_tokens`, vLLM's `bad_words` (engine and server). vLLM's logprobs are then those of the renormalised
    distribution, -log(1 - p_banned) above the policy's (docs/vllm.md, "Importance sampling")."""
    tokens = placeholder_tokens(trainer.processing_class)
    if trainer.use_vllm:
        kwargs = trainer.vllm_generation.generation_kwargs
        banned = list(dict.fromkeys([*(kwargs.get("bad_words") or []), *tokens]))
        trainer.vllm_generation.generation_kwargs = {**kwargs, "bad_words": banned}
        return
    ids = trainer.processing_class.tokenizer.convert_tokens_to_ids(tokens)
    suppress = list(dict.fromkeys([*(trainer.generation_config.suppress_tokens or []), *ids]))
    trainer.generation_config.suppress_tokens = suppress
    trainer.generation_kwargs["suppress_tokens"] = suppress


def over_turn(completion) -> bool:
    """Whether a rollout ended on a tool call that never ran (its last parsed turn is an assistant turn calling a
    tool): it reached `max_tool_calling_iterations`, or TRL rolled back a response that overflowed the budget. Such a
    rollout has no answer (docs/method.md, "Over-turn rollouts"); one cut mid-turn is `mask_truncated_completions`'."""
    if not isinstance(completion, list) or not completion:  # plain-text completions carry no parsed turns
        return False
    last = completion[-1]
    return isinstance(last, dict) and last.get("role") == "assistant" and bool(last.get("tool_calls"))


def tool_suffix_ids(processor: ProcessorMixin, tool_messages: list[dict]) -> list[int]:
    """Token ids appended after a tool-calling turn, the tool responses and the next assistant header, as TRL 1.16's
    `GRPOTrainer._get_tool_suffix_ids` makes them: a dummy exchange rendered with and without the tool messages, the
    difference kept from the EOS that closes the assistant turn on."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = prepare_multimodal_messages(
        [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    )
    tool_messages = prepare_multimodal_messages(tool_messages)
    prefix = processor.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True, return_dict=False)[0]
    full = processor.apply_chat_template(
        dummy + tool_messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )[0]
    eos = processor.tokenizer.eos_token_id
    prefix = prefix[: len(prefix) - prefix[::-1].index(eos)] if eos in prefix else prefix
    if full[: len(prefix)] != prefix:
        raise ValueError("chat template is not prefix-preserving around tool messages")
    return full[len(prefix) :]


def prompt_ids(
    processor: ProcessorMixin, prompt: list[dict], env: ZoomInEnv, *, withhold_tools: bool = False
) -> list[int]:
    """Token ids of a row's prompt (image already inserted), rendered with the tools schema as
    `GRPOTrainer._tokenize_prompts` renders it; `withhold_tools`: with no schema (`evaluate.py --no_tools`)."""
    return list(
        processor.apply_chat_template(
            conversation=[prompt],
            tools=None if withhold_tools else environment_tools(env),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"][0]
    )


def run_tool_calls(env: ZoomInEnv, tool_calls: list[dict]) -> list[dict]:
    """The tool messages for one turn's calls, as `GRPOTrainer._tool_call_loop` makes them: every call runs, in
    order; an unknown tool, bad arguments or an exception become `{"error": ...}` text, a list result stays a list."""
    tools = {tool.__name__: tool for tool in environment_tools(env)}
    messages = []
    for call in tool_calls:
        if call.get("type") == "function":
            name = call["function"]["name"]
            try:
                if name not in tools:
                    raise ValueError(f"Tool {name} not found.")
                result = tools[name](**call["function"]["arguments"])
            except Exception as err:  # noqa: BLE001 - as TRL: the error is an observation, the rollout goes on
                result = {"error": str(err)}
        else:
            name = call.get("name", "unknown")
            result = {"error": f"Unsupported tool call type: {call.get('type')}"}
        messages.append({"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)})
    return messages
