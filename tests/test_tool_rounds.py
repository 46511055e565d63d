"""`repairs.tool_rounds.AgreedToolRounds` without processes or an engine: a fake round agreement (`_agree`) and a fake
parent `_generate_single_turn` that samples from torch's random stream, as generation does.

The 2-process runs (tests/test_multiprocess.py, tests/test_vllm_server.py) give each rank one tool depth, so a round's
counts are (4, 4) then (4, 0): the pad-within-a-round branch and the random stream around a filler are checked here.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from repairs.tool_rounds import AgreedToolRounds

IMAGE = "image"


class Parent:
    """Stands in for `GRPOTrainer._generate_single_turn`: draws one random number per row from torch's default
    generator (sampling), records what it was asked, and answers each row with a completion that names the row's
    prompt (its first token) and a logprob that names it too."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        torch.rand(len(prompt_ids))
        max_new_tokens = getattr(getattr(self, "generation_config", None), "max_new_tokens", None)
        self.calls.append({"prompt_ids": [list(p) for p in prompt_ids], "images": images, "max_new": max_new_tokens})
        return [[ids[0], 0] for ids in prompt_ids], [[-float(ids[0]), 0.0] for ids in prompt_ids]


class Rank(AgreedToolRounds, Parent):
    """One process of a multi-process run, as the mixin reads it; `agreed` is what the all-reduce would return."""

    def __init__(self, use_vllm: bool, agreed: int = 0, filler=([7, 7, 7], None)):
        self.use_vllm, self.agreed, self._filler, self.calls = use_vllm, agreed, filler, []
        self.accelerator = SimpleNamespace(device=torch.device("cpu"))
        if not use_vllm:
            self.generation_config = SimpleNamespace(max_new_tokens=64)

    def _agree(self, count: int) -> int:
        return max(count, self.agreed)


# ----------------------------------------------------------------------------------------------- the filler's RNG
def test_a_transformers_filler_leaves_the_random_stream_as_it_found_it():
    """Under transformers generation the filler samples one token on a forked stream: this rank's next draws are the
    ones it would have made without the filler."""
    rank = Rank(use_vllm=False)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    expected = torch.rand(4)  # what the rank draws next without a filler
    torch.set_rng_state(before)
    saved_config = rank.generation_config
    rank._generate_filler(3)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(4), expected)
    # one row, one new token, the config restored afterwards
    assert rank.calls == [{"prompt_ids": [[7, 7, 7]], "images": None, "max_new": 1}]
    assert rank.generation_config is saved_config and saved_config.max_new_tokens == 64


def test_a_vllm_filler_is_not_rewound():
    """Under vLLM the filler is a request like any other: no rank rewinds the stream it sampled from (a
    tensor-parallel group's engines must advance it alike), and it pads the round to the agreed count."""
    rank = Rank(use_vllm=True, filler=([7, 7, 7], [IMAGE]))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    rank._generate_filler(3)
    assert not torch.equal(torch.get_rng_state(), before)  # the draws stand
    assert rank.calls == [{"prompt_ids": [[7, 7, 7]] * 3, "images": [[IMAGE]] * 3, "max_new": None}]


def test_the_vllm_filler_advances_the_stream_exactly_as_its_draws_do():
    """A vLLM filler's stream after it is the stream after its own draws: neither rewound nor skipped."""
    rank = Rank(use_vllm=True)
    torch.manual_seed(1)
    reference = torch.Generator().manual_seed(1)
    rank._generate_filler(2)
    torch.rand(2, generator=reference)
    assert torch.equal(torch.get_rng_state(), reference.get_state())


# --------------------------------------------------------------------------------------- pad within a round (vLLM)
def round_of(rank: Rank, prompts: list[list[int]]):
    images = [[f"{IMAGE}{p[0]}"] for p in prompts]
    rank._in_tool_loop = True
    return rank._generate_single_turn(prompts, images, {}, 1, True)


def test_counts_3_and_1_in_one_round_each_rank_gets_its_own_rows():
    """Counts (3, 1) in one vLLM round: the rank with 1 prompt pads with 2 copies of its filler, so TRL's gather and
    slice see equal counts, and gets back only its own row; the rank with 3 sends and gets its 3."""
    busy, light = Rank(use_vllm=True, agreed=3), Rank(use_vllm=True, agreed=3, filler=([9, 9], [IMAGE]))
    completions, logprobs = round_of(busy, [[1, 5], [2, 5], [3, 5]])
    assert busy.calls[0]["prompt_ids"] == [[1, 5], [2, 5], [3, 5]]  # nothing to pad
    assert completions == [[1, 0], [2, 0], [3, 0]] and logprobs == [[-1.0, 0.0], [-2.0, 0.0], [-3.0, 0.0]]

    completions, logprobs = round_of(light, [[4, 5]])
    sent = light.calls[0]
    assert sent["prompt_ids"] == [[4, 5], [9, 9], [9, 9]]  # its row, then the filler twice
    assert sent["images"] == [[f"{IMAGE}4"], [IMAGE], [IMAGE]]
    assert completions == [[4, 0]] and logprobs == [[-4.0, 0.0]]  # its own row only


def test_transformers_generation_never_pads_a_round():
    """Synchronized generation needs no equal counts: each rank generates its own rows only."""
    rank = Rank(use_vllm=False, agreed=3)
    completions, _ = round_of(rank, [[4, 5]])
    assert rank.calls[0]["prompt_ids"] == [[4, 5]] and completions == [[4, 0]]


@pytest.mark.parametrize("counts", [(2, 1), (4, 1), (4, 3)])
def test_every_padded_round_returns_exactly_the_ranks_rows(counts):
    agreed = max(counts)
    for count in counts:
        rank = Rank(use_vllm=True, agreed=agreed)
        prompts = [[10 + i, 5] for i in range(count)]
        completions, logprobs = round_of(rank, copy.deepcopy(prompts))
        assert len(rank.calls[0]["prompt_ids"]) == agreed
        assert completions == [[p[0], 0] for p in prompts]
        assert logprobs == [[-float(p[0]), 0.0] for p in prompts]
