"""Rewards by the name a recipe gives (`reward_funcs: [gated_outcome]`) or by import path (`package.module:name`), in
TRL's signature `(completions, **kwargs) -> list[float | None]` (None: a row not scored, advantage 0): `outcome` (R_out,
format, a tool bonus), `target_in_view` (grounding: a zoom that framed the row's target box), `simulated_reader` (a
noisy outcome paid by where the policy looked), `judge` (an LLM judge), `deepeyes` (DeepEyes' whole reward, judged).
R_sem is `MAPOTrainer`'s,
from `verifiers`' z_t (eq. 2).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from data.rl_sets import JUDGED_SOURCES
from rewards.deepeyes import deepeyes_reward
from rewards.grounding import target_in_view_reward
from rewards.judge import judge_reward, judge_settings
from rewards.outcome import format_reward, gated_outcome_reward, outcome_reward, tool_bonus_reward
from rewards.simulated_reader import simulated_reader_reward
from rewards.verifiers import verifier_factory
from utils.registry import required_columns, resolve

RewardFunc = Callable[..., list[float | None]]

REWARDS: dict[str, RewardFunc] = {
    "outcome": outcome_reward,
    "format": format_reward,
    "gated_outcome": gated_outcome_reward,
    "tool_bonus": tool_bonus_reward,
    "target_in_view": target_in_view_reward,
    "simulated_reader": simulated_reader_reward,
    "judge": judge_reward,
    "deepeyes": deepeyes_reward,
}
ASKS_JUDGE = (judge_reward, deepeyes_reward)  # the rewards that read the JUDGE_* settings


# Rewards that compare the answer by rule (`data.task.is_correct`), or do not read it: no judge behind any of them.
RULE_REWARDS = ("outcome", "format", "gated_outcome", "tool_bonus", "target_in_view", "simulated_reader")


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


def check_rule_rewards(sources: Sequence[str], reward_specs: Sequence[str], where: str) -> None:
    """Fail at start when every outcome reward is a rule (`RULE_REWARDS`) and the dataset at `where` holds rows only a
    judge scores fairly (`data.rl_sets.JUDGED_SOURCES`, e.g. DeepEyes-47k's chart file): their right answers would mostly
    score 0. A judge reward or one named by import path is the recipe's own choice and passes."""
    if any(spec not in RULE_REWARDS for spec in reward_specs):
        return
    counts = {source: 0 for source in JUDGED_SOURCES}
    for source in sources:
        if source in counts:
            counts[source] += 1
    found = {source: n for source, n in counts.items() if n}
    if found:
        rows = "; ".join(f"{n} rows of {source} ({JUDGED_SOURCES[source]})" for source, n in found.items())
        raise ValueError(
            f"{where}: {rows}, under the rule-based reward_funcs {list(reward_specs)}. Leave their file out of "
            "dataset_path (recipes/mapo_paper.yaml's default: the fine-grained and ThinkLite files), or score them "
            "with a judge: reward_funcs: [judge] (rewards/judge.py; docs/reproduce.md)."
        )


def check_judge(reward_specs: Sequence[str]) -> None:
    """Fail at start, naming the variable (or recipe key) and what is wrong, when a reward of `reward_specs` asks the
    LLM judge and its `JUDGE_*` settings do not hold (`rewards.judge.judge_settings`), rather than at the first step."""
    if any(func in ASKS_JUDGE for func in get_reward_funcs(reward_specs)):
        judge_settings(os.environ)
