"""The outcome and format rewards a recipe names (`reward_funcs: [gated_outcome]`), in TRL's reward signature
`(completions, **kwargs) -> list[float | None]`: R_out of the paper (section 3.3) and DeepEyes' format and tool terms.
"""

from __future__ import annotations

from collections.abc import Sequence

from data.task import extract_answer, final_text, is_correct, is_well_formed_turn
from tools import executed_calls
from utils.registry import reads_columns


@reads_columns("answer")
def outcome_reward(completions: list, answer: list[str], options: list[Sequence[str]] | None = None, **kwargs):
    """R_out: 1.0 when the final `<answer>` (fallback `\\boxed{}`) is correct, else 0.0. See `is_correct`."""
    options = options if options is not None else [()] * len(completions)
    return [float(is_correct(extract_answer(final_text(c)), a, o)) for c, a, o in zip(completions, answer, options)]


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 when every assistant turn is `<think>...</think>` followed by a tool call (intermediate turns) or by one
    `<answer>...</answer>` (the last turn), else 0.0."""
    scores = []
    for completion in completions:
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        turns = [m for m in completion if m.get("role") == "assistant"]
        ok = bool(turns) and all(is_well_formed_turn(m, i == len(turns) - 1) for i, m in enumerate(turns))
        scores.append(float(ok))
    return scores


@reads_columns("answer")
def gated_outcome_reward(completions: list, answer: list[str], options: list[Sequence[str]] | None = None, **kwargs):
    """Binary R_out with format as a gate: 1.0 when the answer is correct *and* every turn is well formed
    (`format_reward`), else 0.0. MAPO pairs R_sem with a binary outcome reward (section 3.3); gating keeps it binary
    while still refusing credit to a right answer in a broken format."""
    correct = outcome_reward(completions, answer, options)
    return [c * f for c, f in zip(correct, format_reward(completions))]


@reads_columns("answer")
def tool_bonus_reward(
    completions: list, answer: list[str], environments: list, options: list[Sequence[str]] | None = None, **kwargs
):
    """DeepEyes' tool bonus: 1.0 when the answer is correct and at least one zoom-in call of the trained completion
    returned a crop (DeepEyes counts returned images; a call that only errored earns nothing), else 0.0."""
    correct = outcome_reward(completions, answer, options)
    used = [any(call.ok for call in executed_calls(env, c)) for env, c in zip(environments, completions)]
    return [c * float(u) for c, u in zip(correct, used)]
