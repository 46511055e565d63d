"""Issue 59, item 1, evaluation's half: no completion a policy writes raises out of `evaluation.agent.ZoomAgent` or the
records `samples.jsonl` and metrics.json are made of. `FUZZ_TURNS` hostile turns (`tests/hostile_completions.py`)
through the agent, CLIP's scores, `episode_record`, a JSON round trip and `compute_metrics`. Before
`repairs.response_parser`, a call nesting about 1,000 brackets raised `RecursionError` and lost the batch. A file of
its own, so that it and the training half (tests/test_hostile_completions.py) run on the two workers side by side.
"""

from __future__ import annotations

import json
import random

import pytest
from hostile_completions import BUDGET, FUZZ_TURNS, ROWS, HostilePolicy, hostile_rows, read_rollouts

from evaluation.agent import ZoomAgent
from evaluation.metrics import clip_scores, compute_metrics, episode_record
from rewards.verifiers import ClipVerifier
from tools import ToolConfig
from utils.models import load_processor


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
