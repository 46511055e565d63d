"""Issue 59, item 1: no completion a policy writes raises out of training or evaluation. Each becomes a rollout: a
tool call the tool answers (its own error when the call is bad), or, when the call does not parse, plain text.

By hand: the guard's depth count and its error mapping. Then one run each of the two rollout paths, driven by
`FUZZ_TURNS` hostile turns (`tests/hostile_completions.py`): `MAPOTrainer` (TRL's tool loop, the zoom-in tool, CLIP,
R_sem, eq. 3's advantages; one optimizer step on them), and `evaluation.agent.ZoomAgent` through the records
`samples.jsonl` and metrics.json are made of. Before `repairs.response_parser`, both raised `RecursionError` on a call
nesting about 1,000 brackets.
"""

from __future__ import annotations

import json
import math
import pickle
import random

import datasets
import pytest
import torch
from hostile_completions import TOOL_NAME, HostilePolicy, call, hostile_completions, nested
from PIL import Image
from trl.chat_template_utils import add_response_schema, parse_response

from data.task import build_prompt
from evaluation.agent import ZoomAgent
from evaluation.metrics import clip_scores, compute_metrics, episode_record
from mapo_trainer import MAPOTrainer
from repairs.response_parser import MAX_TURN_DEPTH, GuardedParser, guard_response_parser, nesting_depth
from rewards.verifiers import ClipVerifier
from tiny.scripted import tiny_trainer
from tools import ToolConfig, environment_tools, make_environment_factory
from utils.models import load_model, load_processor, pixel_budget

FUZZ_TURNS = 10_000  # the count, through each path
ROWS = 64  # rollouts per generation batch (16 prompts x 4)
BUDGET = 2400  # tokens: room for a call nesting 1,000 brackets (one token each in the tiny tokenizer)
SIDE = 112  # the tiny policy's largest image (12,544 pixels): the processor resizes nothing, and runs fast


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


def hostile_rows(n: int) -> datasets.Dataset:
    """`n` rows of the repo's columns, each a small image with a target box, for the rewards to read."""
    options = ["A. red", "B. blue"]
    return datasets.Dataset.from_list(
        [
            {
                "prompt": build_prompt("What colour is the star?", options),
                "image": Image.new("RGB", (SIDE, SIDE), "white"),
                "answer": "A",
                "options": options,
                "source": "synthetic",
                "target_bbox": [10, 10, 60, 60],
                "target_label": "the star",
                "id": str(i),
            }  # fmt: skip
            for i in range(n)
        ]
    )


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


def read_rollouts(completions, environments) -> dict[str, int]:
    """What the rollouts did: calls the tool answered with a crop, with its own error, and turns holding a
    `<tool_call>` that did not parse (read as plain text)."""
    seen = {"cropped": 0, "tool_error": 0, "unparsed": 0, "over_depth": 0}
    for completion, env in zip(completions, environments):
        for message in completion:
            if message["role"] == "assistant" and not message.get("tool_calls"):
                unparsed = "<tool_call>" in (message.get("content") or "")
                seen["unparsed"] += unparsed
                seen["over_depth"] += unparsed and "[" * 990 in message["content"]
        seen["cropped"] += sum(c.ok for c in env.calls)
        seen["tool_error"] += sum(not c.ok for c in env.calls)
    return seen


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


class ScriptedBackend:
    """An evaluation backend writing `policy`'s turns."""

    def __init__(self, policy: HostilePolicy):
        self.policy = policy
        self.eos_token_ids = [policy.eos]
        self.max_context = 8192

    def generate(self, prompts, max_new_tokens):
        return [self.policy.turn(budget) for budget in max_new_tokens]


@pytest.mark.slow
def test_no_hostile_completion_raises_out_of_evaluation(tiny_kit):
    processor = load_processor(tiny_kit["policy"])
    policy = HostilePolicy(processor, FUZZ_TURNS, seed=1)
    config = ToolConfig(clip_model=str(tiny_kit["clip"]), accept_img_idx=True)
    agent = ZoomAgent(ScriptedBackend(policy), processor, config, max_completion_length=BUDGET, max_tool_calling_iterations=3)  # fmt: skip
    verifier = ClipVerifier(config)
    rows = list(hostile_rows(ROWS))
    records, seen, k = [], {}, 0
    while policy.turns < FUZZ_TURNS:
        episodes = agent.run([row | {"id": f"{k}-{row['id']}"} for row in rows])
        k += 1
        calls = [episode.calls for episode in episodes]
        scores = clip_scores(verifier, [episode.image for episode in episodes], calls)
        for row, episode, episode_calls, score in zip(rows, episodes, calls, scores):
            record = episode_record("synthetic", row, episode, episode_calls, score, processor.tokenizer)
            records.append(json.loads(json.dumps(record)))  # as samples.jsonl writes and resume reads it
        for key, value in read_rollouts([e.completion for e in episodes], [e.env for e in episodes]).items():
            seen[key] = seen.get(key, 0) + value
    assert policy.turns >= FUZZ_TURNS and len(records) == k * ROWS
    assert seen["cropped"] > 100 and seen["tool_error"] > 1000 and seen["over_depth"] > 20, seen
    failures = {record["failure"] for record in records}
    assert "no <answer>: a <tool_call> that did not parse" in failures
    metrics = compute_metrics(records, "synthetic")
    assert metrics["n"] == len(records) and 0 < metrics["valid_call_rate"] < 1
    assert random.Random(0).choice(records)["messages"]  # every record carries its conversation
