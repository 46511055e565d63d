"""A response parser no completion can break: whatever a policy writes becomes a turn (a tool call, or plain text when
its call does not parse), never an exception out of training or evaluation.

TRL 1.16's `parse_response` falls back to decoding a turn as plain text when the tokenizer's parser raises `ValueError`
or `TypeError`, the errors of a malformed `<tool_call>`. Others escape it: a call whose arguments nest about 1,000
brackets deep raises `RecursionError` from the JSON decoder (issue 59: 246 of 3,000 hostile completions), and one that
nests just under the decoder's limit parses, then fails in whatever walks the call next (pickling it between
processes, rendering it back into the chat template), each with the Python stack's headroom at that point. So the
tokenizer's own `parse_response` is wrapped: any exception it raises becomes a `ValueError`, and a turn that nests
deeper than `MAX_TURN_DEPTH` is refused the same way. TRL's fallback then reads the turn as plain text, as it
reads any call that does not parse: the rollout ends there, scored (no answer: outcome 0), and evaluation records "a
<tool_call> that did not parse". No tool of the repo takes arguments nested more than 2 deep (`bbox_2d` is a list).
"""

from __future__ import annotations

from typing import Any

# Containers in one parsed turn: a zoom-in call is 6 deep (the message, `tool_calls`, the call, `function`, `arguments`,
# `bbox_2d`). Well above any tool's schema, far below the depth at which the JSON decoder, pickle or Jinja's `tojson`
# run out of stack.
MAX_TURN_DEPTH = 16


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply `value` nests lists, tuples and dicts (a scalar: 0), counted without recursion and only up to
    `limit + 1`: enough to tell that it is too deep, whatever its size."""
    depth, level = 0, [value]
    while depth <= limit:
        containers = [item for item in level if isinstance(item, dict | list | tuple)]
        if not containers:
            break
        depth += 1
        level = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)]
    return depth


class GuardedParser:
    """A tokenizer's `parse_response`, raising only `ValueError` for a turn it cannot read (`guard_response_parser`).
    A class rather than a closure, so a tokenizer carrying it still pickles (spawned workers, `copy.deepcopy`)."""

    def __init__(self, parse):
        self.parse = parse

    def __call__(self, *args, **kwargs):
        try:
            parsed = self.parse(*args, **kwargs)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to read a completion is a malformed turn
            raise ValueError(f"the response did not parse: {type(err).__name__}") from None
        if nesting_depth(parsed, MAX_TURN_DEPTH) > MAX_TURN_DEPTH:
            raise ValueError(f"the response nests deeper than {MAX_TURN_DEPTH}")
        return parsed


def guard_response_parser(tokenizer) -> None:
    """Wrap `tokenizer.parse_response` in `GuardedParser`, once: TRL's `parse_response`, in `GRPOTrainer`'s rollout
    and in `evaluation.agent`, then reads any completion it cannot parse as plain text instead of raising."""
    if not isinstance(tokenizer.parse_response, GuardedParser):
        tokenizer.parse_response = GuardedParser(tokenizer.parse_response)
