"""The token budget of a rollout's worst case, measured with the real chat template before training or evaluation
starts (`check_token_budget`): a tool response costs its image's tokens, and TRL silently drops one that overflows
`max_completion_length`. Built on the rollout's own pieces (`repairs.rollout`)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

from PIL import Image
from transformers import ProcessorMixin
from trl.data_utils import prepare_multimodal_messages

from data.task import build_prompt
from repairs.rollout import IMAGE_PAD, prompt_ids, tool_suffix_ids
from tools import ToolConfig, get_tools, make_environment_factory
from tools.zoom_in import CALL_FORMATS
from utils.models import pixel_budget, turn_format

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenBudget:
    """The worst case of one rollout in tokens, against the lengths it must fit (`check_token_budget`)."""

    prompt_image: int  # tokens of the largest prompt image
    prompt_text: int  # system prompt, tools schema and a one-word question
    crop_response: int  # one tool response with the largest image, plus the next assistant header
    call_turn: int  # the shortest well-formed turn that calls that tool
    answer_turn: int  # the shortest well-formed answering turn
    iterations: int
    max_completion_length: int
    context_length: int

    @property
    def completion(self) -> int:
        """Every tool round used, one call per turn, each turn as short as it can be."""
        return self.iterations * (self.call_turn + self.crop_response) + self.answer_turn

    @property
    def prompt(self) -> int:
        return self.prompt_image + self.prompt_text

    def problems(self) -> list[str]:
        out = []
        arithmetic = (
            f"{self.iterations} x ({self.crop_response} tool response with a full-size crop + {self.call_turn} "
            f"shortest call turn) + {self.answer_turn} shortest answer = {self.completion} tokens"
        )
        if self.completion > self.max_completion_length:
            out.append(
                f"a rollout that uses all max_tool_calling_iterations needs at least {arithmetic}, over "
                f"max_completion_length={self.max_completion_length}: its later tool responses are dropped. Lower "
                "crop_max_pixels or max_tool_calling_iterations, or raise max_completion_length."
            )
        if self.prompt + self.max_completion_length > self.context_length:
            out.append(
                f"prompt ({self.prompt_image} image + {self.prompt_text} text tokens) + max_completion_length="
                f"{self.max_completion_length} exceeds the model's context ({self.context_length}): lower max_pixels "
                "or max_completion_length."
            )
        return out


def token_budget(
    processor: ProcessorMixin,
    config: ToolConfig,
    *,
    max_completion_length: int,
    max_tool_calling_iterations: int,
    context_length: int,
) -> TokenBudget:
    """Measure a rollout's worst case with the real chat template: the largest prompt image and tool image the
    budgets allow, the tool response exactly as TRL renders it, and the shortest well-formed turns. With several tools
    (`config.tools`), a round costs what the dearest tool's call turn and response cost together."""
    budget = pixel_budget(processor)
    env = make_environment_factory(config, budget)()
    side = int(budget.max_pixels**0.5)
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    tokenizer = processor.tokenizer
    turns = turn_format(processor.chat_template)  # the turns as this template has the model write them

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    rounds = []  # (call turn, response) of each tool
    for tool in get_tools(config.tools):
        env.reset(image=Image.new("RGB", (side, side)))  # a box in this frame has as many digits as real ones
        response = getattr(env, tool.function)(**tool.budget_arguments(env))
        suffix = tool_suffix_ids(processor, [{"role": "tool", "name": tool.function, "content": response}])
        images = sum(isinstance(part, dict) and part.get("type") == "image" for part in response)
        # The response's text as rendered, and the largest image the budget allows (smart_resize keeps h * w under it).
        tool_response = len(suffix) - suffix.count(pad) + images * env.crop_budget.max_tokens
        call = CALL_FORMATS[turns.call_format](tool.function, tool.short_arguments)
        rounds.append((length(f"{turns.think('zoom')}\n{call}{tokenizer.eos_token}"), tool_response))
    call_turn, crop_response = max(rounds, key=sum)
    small = Image.new("RGB", (budget.factor, budget.factor))
    prompt = build_prompt("?", box_convention=config.box_convention, tools=config.tools)
    text_ids = prompt_ids(processor, prepare_multimodal_messages(prompt, images=[small]), env)

    return TokenBudget(
        prompt_image=budget.max_tokens,
        prompt_text=len(text_ids) - text_ids.count(pad),
        crop_response=crop_response,
        call_turn=call_turn,
        answer_turn=length(f"{turns.think('seen')}<answer>A</answer>{tokenizer.eos_token}"),
        iterations=max_tool_calling_iterations,
        max_completion_length=max_completion_length,
        context_length=context_length,
    )


def check_token_budget(
    processor: ProcessorMixin,
    config: ToolConfig,
    *,
    max_completion_length: int,
    max_tool_calling_iterations: int | None,
    context_length: int,
) -> TokenBudget | None:
    """Warn, with the numbers, when a rollout's worst case does not fit `max_completion_length` or the context: a
    crop costs up to `crop_max_pixels / factor^2` completion tokens, and TRL silently drops a tool response that
    overflows. Returns the measured budget."""
    if max_tool_calling_iterations is None:
        warnings.warn(
            "max_tool_calling_iterations is None: TRL lets a rollout call the tool until max_completion_length runs "
            "out, and drops the response that overflows it. Set a limit.",
            stacklevel=2,
        )
        return None
    budget = token_budget(
        processor,
        config,
        max_completion_length=max_completion_length,
        max_tool_calling_iterations=max_tool_calling_iterations,
        context_length=context_length,
    )
    logger.info("rollout token budget: %s", budget)
    for problem in budget.problems():
        warnings.warn(problem, stacklevel=2)
    return budget
