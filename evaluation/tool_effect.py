"""What the tool adds: a run of the model with its tools withheld (`--no_tools`) set against a run of the same model
with them, question by question (issue 64, item 3). No peer reports it; a table of accuracy with tools alone cannot
say whether zooming helped or the model answers as well without it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _verdicts(records: Iterable[Mapping[str, Any]], which: str) -> dict[str, bool]:
    verdicts: dict[str, bool] = {}
    for record in records:
        key = str(record["id"])
        if key in verdicts:
            raise ValueError(f"{which} run: sample id {key!r} is recorded twice")
        verdicts[key] = bool(record["correct"])
    return verdicts


def tool_effect(with_tools: Iterable[Mapping[str, Any]], without_tools: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """metrics.json's `tool_effect`: on the samples both runs hold (matched by id: the same rows, order and sample),
    the accuracy with and without the tools, their difference, and the questions where the tools turned a wrong answer
    right (`turned_right`) or a right one wrong (`turned_wrong`), with their ids; the difference is
    (turned_right - turned_wrong) / shared, exactly. Samples only one run holds are counted, never compared."""
    with_, without = _verdicts(with_tools, "with-tools"), _verdicts(without_tools, "no-tools")
    shared = sorted(with_.keys() & without.keys())
    if not shared:
        raise ValueError("the two runs share no sample id: were they run on the same benchmark, rows and options?")
    right = sorted(k for k in shared if with_[k] and not without[k])
    wrong = sorted(k for k in shared if without[k] and not with_[k])
    n = len(shared)
    accuracy_with = sum(with_[k] for k in shared) / n
    accuracy_without = sum(without[k] for k in shared) / n
    return {
        "samples": n,
        "accuracy_with_tools": accuracy_with,
        "accuracy_without_tools": accuracy_without,
        "difference": accuracy_with - accuracy_without,
        "turned_right": len(right),
        "turned_wrong": len(wrong),
        "both_right": sum(with_[k] and without[k] for k in shared),
        "both_wrong": sum(not with_[k] and not without[k] for k in shared),
        "only_with_tools_run": len(with_.keys() - without.keys()),
        "only_without_tools_run": len(without.keys() - with_.keys()),
        "turned_right_ids": right,
        "turned_wrong_ids": wrong,
    }
