"""Issue 59, item 1: no completion a policy writes raises out of training or evaluation. Each becomes a rollout: a
tool call the tool answers (its own error when the call is bad), or, when the call does not parse, plain text.

By hand: the guard's depth count and its error mapping. Then one training run driven by `FUZZ_TURNS` hostile turns
(`tests/hostile_completions.py`): `MAPOTrainer` (TRL's tool loop, the zoom-in tool, CLIP, R_sem, eq. 3's advantages;
one optimizer step on them). Evaluation's half is tests/test_hostile_evaluation.py, a file of its own so the two run
on the two workers side by side. Before `repairs.response_parser`, both raised `RecursionError` on a call nesting
about 1,000 brackets.
"""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
from hostile_completions import (
    BUDGET,
    FUZZ_TURNS,
    ROWS,
    SIDE,
    TOOL_NAME,
    HostilePolicy,
    call,
    hostile_completions,
    hostile_rows,
    nested,
    read_rollouts,
)
from PIL import Image
from trl.chat_template_utils import add_response_schema, parse_response

from mapo_trainer import MAPOTrainer
from repairs.response_parser import MAX_TURN_DEPTH, GuardedParser, guard_response_parser, nesting_depth
from tiny.scripted import tiny_trainer
from tools import ToolConfig, environment_tools, make_environment_factory
from utils.models import load_model, load_processor, pixel_budget


def test_nesting_depth_by_hand():
    assert [nesting_depth(v, 16) for v in (1, "[[", [], [1], {"a": [1, {"b": ()}]}, [[], [[]]])] == [0, 0, 1, 1, 4, 3]
    deep: list = []
    for _ in range(50_000):  # past any recursion limit: counted without recursion, stopped one past the limit
        deep = [deep]
    assert nesting_depth(deep, 16) == 17 and nesting_depth(deep, 49_999) == 50_000


def test_the_guard_turns_every_parser_failure_into_the_error_trl_falls_back_on():
    def raising(error):
        def parse(*args, **kwargs):
            raise error

        return parse

    for error in (RecursionError("deep"), OverflowError("big"), KeyError("k"), AttributeError("a"), MemoryError()):
        with pytest.raises(ValueError, match=f"did not parse: {type(error).__name__}"):
            GuardedParser(raising(error))([1, 2])
    with pytest.raises(ValueError, match="^own$"):  # TRL's own ValueError passes as it is
        GuardedParser(raising(ValueError("own")))([1])
    turn = {"role": "assistant", "tool_calls": [{"function": {"arguments": {"bbox_2d": [1, 2, 3, 4]}}}]}
    assert GuardedParser(lambda ids: turn)([1]) is turn  # 5 deep: read as it is
    too_deep = {"role": "assistant", "content": "", "x": json.loads(nested(MAX_TURN_DEPTH))}
    with pytest.raises(ValueError, match=f"nests deeper than {MAX_TURN_DEPTH}"):
        GuardedParser(lambda ids: too_deep)([1])


def test_a_call_nesting_1000_brackets_is_plain_text_and_a_zoom_call_still_parses(tiny_kit):
    processor = load_processor(tiny_kit["policy"])  # own copy: the guard and the schema mutate the tokenizer
    add_response_schema(processor)
    tokenizer = processor.tokenizer
    env = make_environment_factory(ToolConfig(), pixel_budget(processor))()
    env.reset(image=Image.new("RGB", (SIDE, SIDE)))
    tools = environment_tools(env)
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Zoom."}]}]
    prefix = processor.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, return_dict=False)[0]

    def parse(text):
        return parse_response(tokenizer, tokenizer(text + "<|im_end|>")["input_ids"], prefix=prefix, tools=tools)

    deep = call(f'{{"bbox_2d": {nested(1000)}, "label": "x"}}')
    with pytest.raises(RecursionError):  # what TRL let through
        parse(deep)
    guard_response_parser(tokenizer)
    guard_response_parser(tokenizer)  # once: a second call does not wrap the wrapper
    assert type(tokenizer.parse_response.parse).__name__ == "method"
    parsed = parse(deep)
    assert "tool_calls" not in parsed and parsed["content"].startswith("<tool_call>")
    good = parse(call({"bbox_2d": [1, 2, 50, 60], "label": "the star"}))
    assert good["tool_calls"][0]["function"] == {"name": TOOL_NAME, "arguments": {"bbox_2d": [1, 2, 50, 60], "label": "the star"}}  # fmt: skip
    assert pickle.loads(pickle.dumps(tokenizer)).parse_response is not None  # a guarded tokenizer still pickles


def test_the_corpus_is_seeded_and_holds_every_kind():
    corpus = hostile_completions(2000, seed=3)
    assert corpus == hostile_completions(2000, seed=3) and corpus != hostile_completions(2000, seed=4)
    text = "".join(corpus)
    for needle in ("NaN", "Infinity", "1" * 400, "[" * 990, "<tool_call><tool_call>", "\u202e", '"img_idx"'):
        assert needle in text, needle


def scripted_generate(model, policy: HostilePolicy) -> None:
    """`model.generate` writes `policy`'s turns, each within the budget TRL gives the call (`max_new_tokens`)."""
    pad = policy.tokenizer.pad_token_id

    def generate(*args, input_ids, generation_config, **kwargs):
        rows = [policy.turn(generation_config.max_new_tokens) for _ in input_ids]
        completion = torch.full((len(rows), max(map(len, rows))), pad, dtype=input_ids.dtype)
        for i, ids in enumerate(rows):
            completion[i, : len(ids)] = torch.tensor(ids)
        return torch.cat([input_ids, completion], dim=1)

    model.generate = generate


@pytest.mark.slow
def test_no_hostile_completion_raises_out_of_training(tiny_kit, tmp_path):
    processor = load_processor(tiny_kit["policy"])
    model = load_model(tiny_kit["policy"], dtype=torch.float32)
    policy = HostilePolicy(processor, FUZZ_TURNS, seed=0)
    scripted_generate(model, policy)
    tool_config = ToolConfig(clip_model=str(tiny_kit["clip"]), accept_img_idx=True)  # img_idx NaN reaches the tool
    trainer = tiny_trainer(
        MAPOTrainer, tiny_kit, hostile_rows(ROWS // 4), tmp_path, model=model, processor=processor,
        tool_config=tool_config, reward_funcs=("outcome", "format", "target_in_view"), max_steps=1,
        per_device_train_batch_size=ROWS, num_generations=4, max_completion_length=BUDGET,
        max_tool_calling_iterations=3,
    )  # fmt: skip
    seen = {}
    generate = trainer._generate

    def spy(prompts):
        out = generate(prompts)
        for key, value in read_rollouts(out[3], trainer.environments).items():
            seen[key] = seen.get(key, 0) + value
        return out

    trainer._generate = spy
    trainer.train()  # one optimizer step on hostile rollouts: loss, backward, R_sem and all
    assert math.isfinite(trainer.state.log_history[0]["loss"])
    rows = [trainer.train_dataset[i] for i in range(ROWS // 4)] * 4
    batches = 1
    while policy.turns < FUZZ_TURNS:
        out = trainer._generate_and_score_completions(rows)
        assert torch.isfinite(out["advantages"]).all()
        batches += 1
    assert policy.turns >= FUZZ_TURNS and batches * ROWS >= FUZZ_TURNS / 4
    # The tool really ran both ways, and the calls that broke TRL's parser came through as text.
    assert seen["cropped"] > 100 and seen["tool_error"] > 1000 and seen["over_depth"] > 20, seen
    semantic = trainer._metrics["train"]["rewards/semantic/mean"]
    assert semantic and all(math.isfinite(v) for v in semantic)
