"""SFT collation that renders the tool schema into the prompt exactly as the RL trainer does.

TRL's `DataCollatorForVisionLanguageModeling` renders conversations without `tools=`, so an SFT prompt would lack the
`# Tools` system block every GRPO prompt carries, and the cold start would teach calls to a tool the model was never
shown. `DataCollatorForVisionToolCalling` is that collator with the environment's tools bound into its one
`apply_chat_template` call, and TRL's training chat template (the repo's template plus `{% generation %}` markers) for
the assistant-only loss mask: tool calls and answers are trained on, tool responses and image tokens are not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import ProcessorMixin
from trl.chat_template_utils import get_training_chat_template
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
