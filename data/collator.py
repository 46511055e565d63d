"""SFT collation that renders the tool schema into the prompt exactly as the RL trainer does: TRL's
`DataCollatorForVisionLanguageModeling` renders without `tools=`, so the cold start would teach calls to a tool the
model was never shown. The assistant-only loss mask trains tool calls and answers, not tool responses or images.

The mask is computed here, not by the processor: transformers 5.17 (the version vLLM 0.31 allows) maps the template's
`{% generation %}` character spans onto the tokens of the text *after* it expanded every image into its N pads, so
after the first image the mask lands N - 1 tokens early per image (TRL 1.16 refuses vision datasets with
`assistant_only_loss` below 5.18 for that reason). `assistant_mask` renders the same conversation with the tokenizer
(one pad per image, where the spans are right), then expands each image's pad to the processor's count, masked.

Nothing is truncated: a cut through an image fails at the model's forward (its pixel values outnumber its pads) and a
cut after the last image drops the answer silently. `fit_to_max_length` measures every row once, as rendered here,
and leaves out the rows over `max_length`, as LLaMA-Factory drops rows over its cutoff.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch
from transformers import ProcessorMixin
from trl.chat_template_utils import get_training_chat_template
from trl.data_utils import prepare_multimodal_messages
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

from data.rows import percentiles
from tools import seen_size
from utils.models import pixel_budget

logger = logging.getLogger(__name__)


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
        # TRL's collation without the processor's mask (see the module docstring) and without truncation: a cut
        # through an image fails at the model's forward, a cut after it drops the answer silently. Rows over
        # max_length are left out before training (`fit_to_max_length`); one that reaches here is refused.
        masked, limit = self.assistant_only_loss, self.max_length
        self.assistant_only_loss, self.max_length = False, None
        try:
            output = super()._collate_language_modeling(examples)
        finally:
            self.assistant_only_loss, self.max_length = masked, limit
        lengths = output["attention_mask"].sum(dim=-1).tolist()
        if limit is not None and max(lengths) > limit:
            row = max(range(len(lengths)), key=lengths.__getitem__)
            raise ValueError(
                f"Example {row} of the batch renders {lengths[row]} tokens, over max_length={limit}: SFT never "
                "truncates (a cut image or answer); leave such rows out first (data.collator.fit_to_max_length)."
            )
        if masked:
            output["labels"][assistant_mask(self.processor, examples, output, self.chat_template) == 0] = -100
        return output

    def rendered_length(self, example: dict[str, Any]) -> tuple[int, int]:
        """(tokens, image tokens) of `example` as this collator renders it, without the processor's pixel work: the
        tokenizer's rendering with one pad per image (as `assistant_mask`), each pad expanded to its image's token
        count, the size the processor resizes it to (`tools.seen_size` under its budget) over factor^2."""
        tokenizer, budget = self.processor.tokenizer, pixel_budget(self.processor)
        messages = prepare_multimodal_messages(copy.deepcopy(example["messages"]), images=example["images"])
        ids = tokenizer.apply_chat_template(
            messages,
            tools=self.processor.tools or None,
            chat_template=self.chat_template or self.processor.chat_template,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        images = [part["image"] for m in messages if isinstance(m["content"], list) for part in m["content"]
                  if part.get("type") == "image"]  # fmt: skip
        image_tokens = sum(math.prod(seen_size(image.size, budget)) // budget.factor**2 for image in images)
        pads = ids.count(tokenizer.convert_tokens_to_ids(self.processor.image_token))
        if pads != len(images):
            raise ValueError(f"the rendering holds {pads} image pads for {len(images)} images")
        return len(ids) - pads + image_tokens, image_tokens


def fit_to_max_length(
    dataset: datasets.Dataset, collator: DataCollatorForVisionToolCalling, max_length: int | None
) -> tuple[datasets.Dataset, dict[str, Any]]:
    """`dataset` less the rows longer than `max_length` (LLaMA-Factory's rule: dropped, never truncated), each row
    measured once as `collator` renders it (`rendered_length`), and what was measured: rows, rows over the limit
    (`rows_over_max_length`, the first few `over_examples` by index and length), and the percentiles of their
    tokens and image tokens, which `scripts.memory --sft_lengths` reads."""
    lengths, images = [], []
    for example in dataset:
        tokens, image_tokens = collator.rendered_length(example)
        lengths.append(tokens)
        images.append(image_tokens)
    over = [i for i, n in enumerate(lengths) if max_length is not None and n > max_length]
    ids = dataset.with_format(None)["id"] if "id" in dataset.column_names else range(len(lengths))
    stats = {
        "rows": len(lengths),
        "max_length": max_length,
        "rows_over_max_length": len(over),
        "over_examples": [f"row {ids[i]}: {lengths[i]} tokens" for i in over[:3]],
        "tokens": percentiles(lengths),
        "image_tokens": percentiles(images),
    }
    if len(over) == len(lengths) and lengths:
        raise ValueError(f"every row renders more than max_length={max_length} tokens ({stats['tokens']}): raise it")
    if over:
        logger.warning("left out %d of %d rows over max_length=%d: %s", len(over), len(lengths), max_length,
                       ", ".join(stats["over_examples"]))  # fmt: skip
        dataset = dataset.select(sorted(set(range(len(lengths))) - set(over)))
    return dataset, stats


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
