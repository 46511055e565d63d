"""The inference agent: the training rollout of the zoom-in agent, run for evaluation.

An episode is built exactly as TRL 1.16's `GRPOTrainer` builds a rollout with `environment_factory`
(`_tokenize_prompts`, `_tool_call_loop`, `_get_tool_suffix_ids`), so a checkpoint is scored on the interface it was
trained on:

- the prompt is the row's `prompt` column (`task.build_prompt`) with the image inserted by TRL's
  `prepare_multimodal_messages`, rendered by the processor's chat template with the environment's tools
  (`tools.environment_tools`);
- each turn is parsed by TRL's `parse_response` (tool calls; `<think>` moves to `reasoning_content`);
- tool calls run on a fresh `tools.ZoomInEnv` per episode, in the processor's pixel frame; a call that raises (wrong
  arguments, unknown tool) comes back to the model as `{"error": ...}` text, and a crop as an image in the tool
  message `{"role": "tool", "name": ..., "content": [...]}`;
- the next turn's input is the previous ids + the turn's own tokens + the tool-response tokens (what the model wrote
  is never re-tokenised), with every image of the conversation, in order, given to the image processor.

For evaluation a turn also stops at `</tool_call>` (then `<|im_end|>` is appended: what training sequences hold after
a call), decoding is greedy by default, and an `<answer>` ends the episode. A tool call whose JSON does not parse
ends the episode, as in training (TRL's parser then returns plain text), and is recorded as a failed call.

Backends: `TransformersBackend` (`model.generate`, CPU or GPU) and `VLLMBackend` (GPU; imports vLLM lazily).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from PIL import Image
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
from trl.chat_template_utils import add_response_schema, parse_response
from trl.data_utils import prepare_multimodal_messages

from models import pixel_budget
from task import extract_answer, message_text
from tools import TOOL_NAME, ZoomInEnv, environment_tools, make_environment_factory

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
IMAGE_PAD = "<|image_pad|>"

Prompt = tuple[list[int], list[Image.Image]]  # a conversation's token ids so far, and its images in order


# ------------------------------------------------------------------------------------------------------- records
@dataclass
class Call:
    """One tool call of an episode: what the model asked for, and the crop or error it got back."""

    turn: int  # the assistant turn (1-based) that made the call
    name: str | None  # None when the call's JSON did not parse
    arguments: Any
    label: str | None = None
    box: tuple[int, int, int, int] | None = None  # the cropped region, in original pixels
    crop: Image.Image | None = None  # the crop as the model saw it
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.crop is not None


@dataclass
class Episode:
    """One sample's trajectory. `messages` holds the assistant turns and tool responses, JSON-ready; the prompt is
    the row's own. `failure` says why the episode produced no usable answer."""

    id: str
    image: Image.Image | None = None  # the original image
    seen_size: tuple[int, int] | None = None  # the frame the model's coordinates live in
    messages: list[dict] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    prediction: str | None = None
    failure: str | None = None
    # rollout state
    env: ZoomInEnv | None = None
    ids: list[int] = field(default_factory=list)
    images: list[Image.Image] = field(default_factory=list)
    done: bool = False

    @property
    def num_turns(self) -> int:
        return sum(message["role"] == "assistant" for message in self.messages)

    def finish(self, prediction: str | None = None, failure: str | None = None) -> None:
        self.prediction, self.failure, self.done = prediction, failure, True


# ------------------------------------------------------------------------------------------------------ helpers
def open_image(value: Image.Image | Mapping[str, Any]) -> Image.Image:
    """An RGB image from a PIL image or an undecoded `datasets.Image` cell (`{"bytes", "path"}`), fully decoded now,
    so that a truncated file fails here, as its sample's failure."""
    image = value
    if not isinstance(image, Image.Image):
        image = Image.open(io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"])
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


def turn_stop_ids(tokenizer: PreTrainedTokenizerBase, eos_token_id: int | list[int] | None = None) -> list[int]:
    """Token ids that end an assistant turn: the tokenizer's EOS (`<|im_end|>`) and the model's own EOS ids, as TRL
    collects them, plus `</tool_call>`, which must be a single token (it is in Qwen's vocabulary)."""
    tool_call_end = tokenizer.encode(TOOL_CALL_END, add_special_tokens=False)
    if len(tool_call_end) != 1:
        raise ValueError(f"{TOOL_CALL_END!r} must be one token to stop turns on; this tokenizer splits it")
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    return list(dict.fromkeys([tokenizer.eos_token_id, *eos, *tool_call_end]))


def until_stop(ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """`ids` cut after the first stop token: what follows is padding of a batch that kept generating."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return list(ids[: i + 1])
    return list(ids)


def tool_suffix_ids(processor: ProcessorMixin, tool_messages: list[dict]) -> list[int]:
    """Token ids appended after a tool-calling turn: the tool responses and the next assistant header.

    TRL 1.16's `GRPOTrainer._get_tool_suffix_ids`, which is bound to a trainer: render a dummy user/assistant-call
    exchange with and without the tool messages and keep the difference, cut at the EOS that closes the assistant
    turn (the turn's own tokens already end with it).
    """
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


def prompt_ids(processor: ProcessorMixin, prompt: list[dict], env: ZoomInEnv) -> list[int]:
    """Token ids of a row's prompt (image already inserted), rendered with the tools schema as
    `GRPOTrainer._tokenize_prompts` renders it."""
    return list(
        processor.apply_chat_template(
            conversation=[prompt],
            tools=environment_tools(env),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"][0]
    )


def _assistant_message(parsed: dict, raw: str) -> dict:
    """The JSON record of a parsed turn; `raw` is the decoded turn, kept for turns the parser could not read."""
    return {
        "role": "assistant",
        "reasoning": parsed.get("reasoning_content"),
        "content": parsed.get("content") or "",
        "tool_calls": [call["function"] for call in parsed.get("tool_calls") or []],
        "raw": raw,
    }


# ------------------------------------------------------------------------------------------------------ backends
class Backend(Protocol):
    """Generates one assistant turn for each prompt, returning its token ids cut after the first stop token."""

    stop_token_ids: list[int]
    max_context: int

    def generate(self, prompts: Sequence[Prompt]) -> list[list[int]]: ...


class TransformersBackend:
    """`model.generate` on left-padded batches: TRL's generation path without vLLM, on CPU or GPU."""

    def __init__(
        self,
        model: PreTrainedModel,
        processor: ProcessorMixin,
        *,
        max_new_tokens: int = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ):
        self.model, self.processor = model.eval(), processor
        tokenizer = processor.tokenizer
        self.stop_token_ids = turn_stop_ids(tokenizer, model.generation_config.eos_token_id)
        self.max_context = model.config.get_text_config().max_position_embeddings
        self.image_token_id = model.config.image_token_id
        sampling = (
            dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature > 0 else dict(do_sample=False)
        )
        self.generation_config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=tokenizer.pad_token_id,
            suppress_tokens=[self.image_token_id],  # as TRL: a sampled image pad would not match the image features
            **sampling,
        )

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        pad, width = self.processor.tokenizer.pad_token_id, max(len(ids) for ids, _ in prompts)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in prompts])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in prompts])
        vision = self.processor.image_processor(
            images=[image for _, images in prompts for image in images], return_tensors="pt"
        )
        device = self.model.device
        output = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            mm_token_type_ids=(input_ids == self.image_token_id).long().to(device),  # as TRL builds it for tool turns
            **{key: value.to(device) for key, value in vision.items()},
            generation_config=self.generation_config,
        )
        return [until_stop(row, self.stop_token_ids) for row in output[:, width:].tolist()]


class VLLMBackend:
    """vLLM generation on a GPU (`pip install -r requirements-gpu.txt`).

    Prompts go in as text, with one `<|image_pad|>` per image, plus `multi_modal_data`, and vLLM expands each image
    itself: given the processor's already-expanded ids it would expand them again (trl#6294). vLLM resizes images
    with the processor's pixel budget; every call checks that it produced the same number of image tokens as the
    processor, since the model's box coordinates live in that frame.
    """

    def __init__(
        self,
        model_name_or_path: str,
        processor: ProcessorMixin,
        *,
        max_new_tokens: int = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_images: int = 16,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        seed: int = 0,
    ):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise ImportError(
                "backend='vllm' needs vLLM on a CUDA machine: pip install -r requirements-gpu.txt"
            ) from err
        tokenizer = self.tokenizer = processor.tokenizer
        min_pixels, max_pixels, _ = pixel_budget(processor)
        self.llm = LLM(
            model=str(model_name_or_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            limit_mm_per_prompt={"image": max_images},
            mm_processor_kwargs={"min_pixels": min_pixels, "max_pixels": max_pixels},
        )
        eos_token_id = GenerationConfig.from_pretrained(model_name_or_path).eos_token_id
        self.stop_token_ids = turn_stop_ids(tokenizer, eos_token_id)
        self.max_context = self.llm.llm_engine.model_config.max_model_len
        self.image_pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.sampling = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_new_tokens,
            stop_token_ids=self.stop_token_ids,
            skip_special_tokens=False,
        )

    def generate(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        requests = [
            {
                "prompt": re.sub(f"(?:{re.escape(IMAGE_PAD)})+", IMAGE_PAD, self.tokenizer.decode(ids)),
                "multi_modal_data": {"image": images},
            }
            for ids, images in prompts
        ]
        completions = []
        for output, (ids, _) in zip(self.llm.generate(requests, self.sampling, use_tqdm=False), prompts):
            if output.prompt_token_ids.count(self.image_pad_id) != ids.count(self.image_pad_id):
                raise RuntimeError(
                    f"vLLM expanded the images to {output.prompt_token_ids.count(self.image_pad_id)} image tokens, "
                    f"the processor to {ids.count(self.image_pad_id)}: the pixel budgets differ"
                )
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            if isinstance(completion.stop_reason, int) and tokens[-1:] != [completion.stop_reason]:
                tokens.append(completion.stop_reason)  # keep the stop token: the agent reads how the turn ended
            completions.append(until_stop(tokens, self.stop_token_ids))
        return completions


# --------------------------------------------------------------------------------------------------------- agent
class ZoomAgent:
    """Runs episodes of the zoom-in agent over a batch of rows, one generation call per turn for all of them.

    `rows` are dataset rows: `id`, `prompt` (conversational, from `task.build_prompt`) and `image` (a PIL image or
    an undecoded `datasets.Image` cell). `tool_limits` are `ZoomInEnv`'s keyword arguments (label limits), which
    must match training's.
    """

    def __init__(self, backend: Backend, processor: ProcessorMixin, *, max_turns: int = 6, **tool_limits):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.backend, self.max_turns = backend, max_turns
        if getattr(processor.tokenizer, "response_template", None) is None:
            add_response_schema(processor)  # what GRPOTrainer sets up so `parse_response` reads tool calls
        self.processor, self.tokenizer = processor, processor.tokenizer
        min_pixels, max_pixels, factor = pixel_budget(processor)
        self.make_env = make_environment_factory(
            "zoom_in", min_pixels=min_pixels, max_pixels=max_pixels, factor=factor, **tool_limits
        )
        self.tool_call_end = self.tokenizer.convert_tokens_to_ids(TOOL_CALL_END)

    def run(self, rows: Sequence[Mapping[str, Any]]) -> list[Episode]:
        episodes = [self._start(row) for row in rows]
        for turn in range(1, self.max_turns + 1):
            for episode in episodes:
                if not episode.done and len(episode.ids) >= self.backend.max_context:
                    episode.finish(failure=f"context full ({len(episode.ids)} tokens) before an <answer>")
            active = [episode for episode in episodes if not episode.done]
            if not active:
                break
            for episode, completion in zip(active, self.backend.generate([(e.ids, e.images) for e in active])):
                self._step(episode, completion, last=turn == self.max_turns)
        return episodes

    def _start(self, row: Mapping[str, Any]) -> Episode:
        episode = Episode(id=str(row["id"]))
        try:  # anything that stops this image becoming model input fails this sample, not the run
            image = open_image(row["image"])
            env = self.make_env()
            env.reset(image=image)
            ids = prompt_ids(self.processor, prepare_multimodal_messages(list(row["prompt"]), images=[env.image]), env)
        except Exception as err:
            episode.finish(failure=f"image could not be processed: {type(err).__name__}: {err}")
            return episode
        episode.image, episode.seen_size, episode.env = env.image, env.seen_size, env
        episode.ids, episode.images = ids, [env.image]
        return episode

    def _step(self, episode: Episode, completion: list[int], last: bool) -> None:
        parsed = parse_response(self.tokenizer, completion, prefix=episode.ids, tools=environment_tools(episode.env))
        episode.messages.append(_assistant_message(parsed, self.tokenizer.decode(completion)))
        text = message_text(parsed)
        answer = extract_answer(text)
        if answer is not None:
            episode.finish(prediction=answer)
            return
        tool_calls = parsed.get("tool_calls") or []
        if not tool_calls:
            if TOOL_CALL_START in text:  # a call whose JSON did not parse: training's parser ends the rollout too
                episode.calls.append(Call(episode.num_turns, None, None, error="tool call did not parse"))
            cut = bool(completion) and completion[-1] not in self.backend.stop_token_ids
            episode.finish(failure="no <answer>" + (" (turn cut at max_new_tokens)" if cut else ""))
            return
        if last:
            episode.finish(failure=f"no <answer> within max_turns={self.max_turns}")
            return
        tool_messages = [self._call(episode, call) for call in tool_calls]
        if completion[-1] == self.tool_call_end:
            completion = [*completion, self.tokenizer.eos_token_id]  # the turn stopped at the call; close it
        episode.ids = episode.ids + completion + tool_suffix_ids(self.processor, tool_messages)
        for message in tool_messages:  # the crops join the conversation's images in order, as TRL collects them
            if isinstance(message["content"], list):
                episode.images += [part["image"] for part in message["content"] if part.get("type") == "image"]

    def _call(self, episode: Episode, tool_call: dict) -> dict:
        """Run one parsed call as TRL's tool loop does; records it and returns the tool message."""
        name, arguments = tool_call["function"]["name"], tool_call["function"]["arguments"]
        recorded = len(episode.env.calls)
        try:
            if name != TOOL_NAME:
                raise ValueError(f"Tool {name} not found.")
            result = episode.env.image_zoom_in_tool(**arguments)
        except Exception as err:  # as TRL: the error goes back to the model, the episode goes on
            result = {"error": str(err)}
        content = result if isinstance(result, list) else str(result)
        if len(episode.env.calls) > recorded:  # the tool ran: ZoomInEnv recorded the crop, or why it refused
            made = episode.env.calls[recorded]
            call = Call(episode.num_turns, name, arguments, made.label, made.box, made.crop, made.error)
        else:
            call = Call(episode.num_turns, name, arguments, error=result["error"])
        episode.calls.append(call)
        observation = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        episode.messages.append({"role": "tool", "name": name, "content": observation, "call": len(episode.calls) - 1})
        return {"role": "tool", "name": name, "content": content}
