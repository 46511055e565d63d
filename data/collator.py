"""SFT collation that renders the tool schema into the prompt exactly as the RL trainer does: TRL's
`DataCollatorForVisionLanguageModeling` renders without `tools=`, so the cold start would teach calls to a tool the
model was never shown. The assistant-only loss mask trains tool calls and answers, not tool responses or images.

The mask is computed here, not by the processor: transformers 5.17 (the version vLLM 0.31 allows) maps the template's
`{% generation %}` character spans onto the tokens of the text *after* it expanded every image into its N pads, so
after the first image the mask lands N - 1 tokens early per image (TRL 1.16 refuses vision datasets with
`assistant_only_loss` below 5.18 for that reason). `assistant_mask` renders the same conversation with the tokenizer
(one pad per image, where the spans are right), then expands each image's pad to the processor's count, masked.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import ProcessorMixin
from trl.chat_template_utils import get_training_chat_template
from trl.data_utils import prepare_multimodal_messages
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling


class _ToolsBoundProcessor:
    """A view of a processor whose `apply_chat_template` always renders `tools`; everything else is the processor's."""

    def __init__(self, processor: ProcessorMixin, tools: list[Callable]):
        self.processor, self.tools = processor, tools

    def __getattr__(self, name: str) -> Any:
        if name in ("processor", "tools"):  # not set yet (e.g. while unpickling): don't recurse
            raise AttributeError(name)
        return getattr(self.processor, name)

    def apply_chat_template(self, conversation, **kwargs):
        return self.processor.apply_chat_template(conversation, tools=self.tools or None, **kwargs)


@dataclass
class DataCollatorForVisionToolCalling(DataCollatorForVisionLanguageModeling):
    """TRL's vision-language collator, rendering `tools` into every example as `GRPOTrainer._tokenize_prompts` does.

    Args:
        tools: the callables whose schemas are rendered, e.g. `tools.environment_tools(env)` (`None` is passed for
            an empty list, as TRL does, since some templates render tool boilerplate for `tools=[]`).
        chat_template: defaults, with `assistant_only_loss`, to TRL's training template for the processor's one;
            SFTTrainer picks the same template but only hands it to the collator it builds itself.
    """

    tools: list[Callable] = field(default_factory=list)

    def __post_init__(self):
        if self.assistant_only_loss and self.chat_template is None:
            self.chat_template = get_training_chat_template(self.processor)
        self.processor = _ToolsBoundProcessor(self.processor, self.tools)

    def _collate_language_modeling(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.assistant_only_loss:
            return super()._collate_language_modeling(examples)
        self.assistant_only_loss = False  # TRL's collation without the processor's mask (see the module docstring)
        try:
            output = super()._collate_language_modeling(examples)
        finally:
            self.assistant_only_loss = True
        output["labels"][assistant_mask(self.processor, examples, output, self.chat_template) == 0] = -100
        return output


def assistant_mask(
    processor, examples: list[dict[str, Any]], batch: dict[str, Any], chat_template: str
) -> torch.Tensor:
    """1 on the tokens of `batch["input_ids"]` inside the template's `{% generation %}` spans, 0 elsewhere.

    Each example's `messages`, with its images put in as TRL's collation puts them, are rendered by the tokenizer with
    one `<|image_pad|>` per image and the assistant mask transformers computes right without images in the way; each
    pad is then expanded to its image's token count (`image_grid_thw` / merge_size^2, in the batch's image order),
    masked. The result must equal the processor's ids on the example's attended tokens, or this raises.
    """
    tokenizer = processor.tokenizer
    pad_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    merge = processor.image_processor.merge_size**2
    counts = iter((batch["image_grid_thw"].prod(dim=-1) // merge).tolist() if "image_grid_thw" in batch else [])
    mask = torch.zeros_like(batch["input_ids"])
    for row, example in enumerate(examples):
        rendered = tokenizer.apply_chat_template(
            prepare_multimodal_messages(copy.deepcopy(example["messages"]), images=example["images"]),  # as TRL does
            tools=processor.tools or None,
            chat_template=chat_template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids, row_mask = [], []
        for token, trained in zip(rendered["input_ids"], rendered["assistant_masks"], strict=True):
            n = next(counts) if token == pad_id else 1
            ids += [token] * n
            row_mask += [0 if token == pad_id else trained] * n
        attended = batch["attention_mask"][row].bool()
        expected = batch["input_ids"][row][attended].tolist()
        if ids[: len(expected)] != expected:
            raise ValueError(
                f"Example {row}: the tokenizer's rendering of its messages, images expanded, is not the processor's "
                "(the assistant-only loss mask would be misplaced)."
            )
        mask[row, attended.nonzero().squeeze(-1)] = torch.tensor(row_mask[: len(expected)], dtype=mask.dtype)
    return mask
