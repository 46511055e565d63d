"""Rewards by the name a recipe gives (`reward_funcs: [gated_outcome]`) or by import path (`package.module:name`), in
TRL's signature `(completions, **kwargs) -> list[float | None]` (None: a row not scored, advantage 0): `outcome` (R_out,
format, a tool bonus), `judge` (an LLM judge), `deepeyes` (DeepEyes' whole reward, judged). R_sem is `MAPOTrainer`'s,
from `verifiers`' z_t (eq. 2).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from rewards.deepeyes import deepeyes_reward
from rewards.judge import judge_reward, judge_settings
from rewards.outcome import format_reward, gated_outcome_reward, outcome_reward, tool_bonus_reward
from rewards.verifiers import verifier_factory
from utils.registry import required_columns, resolve

RewardFunc = Callable[..., list[float | None]]

REWARDS: dict[str, RewardFunc] = {
    "outcome": outcome_reward,
    "format": format_reward,
    "gated_outcome": gated_outcome_reward,
    "tool_bonus": tool_bonus_reward,
    "judge": judge_reward,
    "deepeyes": deepeyes_reward,
}
ASKS_JUDGE = (judge_reward, deepeyes_reward)  # the rewards that read the JUDGE_* settings


def get_reward_funcs(specs: Sequence[str]) -> list[RewardFunc]:
    """The reward functions `specs` name: names in `REWARDS` or import paths; a bad one fails with what is wrong."""
    return [resolve(spec, REWARDS, "reward_funcs") for spec in specs]


def check_columns(columns: Sequence[str], reward_specs: Sequence[str], verifier: str, where: str) -> None:
    """Fail at start, naming the reward or verifier and the missing columns, when the dataset at `where` lacks a
    column one of them reads (declared with `utils.registry.reads_columns`)."""
    readers = {f"reward {spec}": func for spec, func in zip(reward_specs, get_reward_funcs(reward_specs))}
    readers[f"semantic_verifier {verifier}"] = verifier_factory(verifier)
    missing = {reader: [c for c in required_columns(obj) if c not in columns] for reader, obj in readers.items()}
    missing = {reader: cols for reader, cols in missing.items() if cols}
    if missing:
        wants = "; ".join(f"{name} needs {cols}" for name, cols in missing.items())
        raise ValueError(f"{where}: {wants}, which the dataset lacks (its columns: {sorted(columns)})")


def check_judge(reward_specs: Sequence[str]) -> None:
    """Fail at start, naming the variable (or recipe key) and what is wrong, when a reward of `reward_specs` asks the
    LLM judge and its `JUDGE_*` settings do not hold (`rewards.judge.judge_settings`), rather than at the first step."""
    if any(func in ASKS_JUDGE for func in get_reward_funcs(reward_specs)):
        judge_settings(os.environ)
