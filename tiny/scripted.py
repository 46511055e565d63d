"""Scripted tool calls for the random tiny policy, shared by the tests and `scripts/bench.py`.

A random policy almost never writes a valid `<tool_call>`, so nothing downstream of the tool loop would run.
`force_tool_calls` wraps one model instance's `generate`: the real generation still runs (same code path, same RNG
use), then its tokens are replaced by a scripted turn: a zoom-in call on the first turn, an answer once a tool
response is in the context. Everything after that (TRL's tool loop, ZoomInEnv, crops, CLIP, rewards, loss) is the
production path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from configs import MAPOConfig
from mapo_trainer import MAPOTrainer
from rewards import get_reward_funcs
from tools import ToolConfig, make_environment_factory, tool_call_text
from utils.models import load_model, load_processor, pixel_budget

DEFAULT_LABELS = ("red circle", "blue square")  # alternated over rows, so z_t differs within a group
DEFAULT_BOX = (8, 8, 80, 80)  # inside the seen frame of any image at the tiny kit's pixel budget


def tool_call_turn(label: str, box: Sequence[float] = DEFAULT_BOX, think: str = "look closer") -> str:
    """An assistant turn that thinks, then calls the zoom-in tool, in the Qwen2.5 `<tool_call>` JSON format."""
    return f"<think>{think}</think>\n{tool_call_text(box, label)}<|im_end|>"


def answer_turn(row: int) -> str:
    """A final turn answering "A"; odd rows skip `<think>`, so format rewards (hence GRPO advantages) vary."""
    return ("<think>seen</think>" if row % 2 == 0 else "") + "<answer>A</answer><|im_end|>"


def force_tool_calls(
    model,
    tokenizer,
    labels: Sequence[str] = DEFAULT_LABELS,
    first_turn: Callable[[int, str], str] | None = None,
    answer: Callable[[int], str] = answer_turn,
    depth: Callable[[str], int] | None = None,
) -> list[str]:
    """Make `model.generate` emit a zoom-in call on turns without a tool response, and an answer after one.

    Returns the list the scripted turns are appended to, for inspection. `first_turn(row, label)` overrides the
    scripted call text and `answer(row)` the answer; `row` is the row's index in the generation batch. `depth(text)`,
    given a rollout's decoded context, sets how many calls it makes in all (default 1): a turn calls the tool while
    the context holds fewer tool responses than that.
    """
    original = model.generate
    scripts: list[str] = []

    def generate(*args, **kwargs):
        original(*args, **kwargs)  # the real generation runs; its tokens are then replaced
        input_ids = kwargs["input_ids"]
        rows = []
        for i, ids in enumerate(input_ids):
            context = tokenizer.decode(ids)
            if context.count("<tool_response>") < (depth(context) if depth else 1):
                label = labels[i % len(labels)]
                text = first_turn(i, label) if first_turn else tool_call_turn(label)
            else:
                text = answer(i)
            scripts.append(text)
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        completion = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_token_id, dtype=input_ids.dtype)
        for i, ids in enumerate(rows):
            completion[i, : len(ids)] = torch.tensor(ids)
        return torch.cat([input_ids, completion.to(input_ids.device)], dim=1)

    model.generate = generate
    return scripts


def tiny_trainer(
    trainer_cls,
    kit: dict,
    dataset,
    output_dir: str,
    *,
    peft_config=None,
    reward_funcs: Sequence = ("outcome", "format"),
    tool_config=None,
    callbacks=None,
    script: dict | None = None,
    model=None,
    processor=None,
    **config,
):
    """A `MAPOTrainer` (or stock `GRPOTrainer`) on the tiny kit with scripted tool calls, for tests and benchmarks.

    `config` overrides the small CPU defaults below; any `MAPOConfig` field is accepted (the stock trainer ignores
    the MAPO ones). `reward_funcs` are registry names or callables. `tool_config` defaults to the kit's CLIP;
    `script` holds `force_tool_calls`' keyword arguments (`first_turn`, `answer`). A `model` and `processor` given
    (another architecture, or one policy shared by several trainers) are used as they are, not loaded from the kit:
    such a model is not scripted here, so wrap its `generate` once with `force_tool_calls` first.
    """
    processor = processor or load_processor(str(kit["policy"]))
    if model is None:
        model = load_model(str(kit["policy"]), dtype=torch.float32)
        force_tool_calls(model, processor.tokenizer, **(script or {}))
    fields = {
        "output_dir": str(output_dir),
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "seed": 7,
        "max_steps": 2,
        "learning_rate": 1e-2,
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 320,
        "max_tool_calling_iterations": 2,
        "beta": 0.0,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    } | config
    tool_config = tool_config or ToolConfig(clip_model=str(kit["clip"]))
    if issubclass(trainer_cls, MAPOTrainer):
        environment = {"tool_config": tool_config}
    else:
        environment = {"environment_factory": make_environment_factory(tool_config, pixel_budget(processor))}
    names = [f for f in reward_funcs if isinstance(f, str)]
    funcs = iter(get_reward_funcs(names))
    return trainer_cls(
        model=model,
        reward_funcs=[next(funcs) if isinstance(f, str) else f for f in reward_funcs],
        args=MAPOConfig(**fields),
        train_dataset=dataset,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=callbacks,
        **environment,
    )
