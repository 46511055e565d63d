"""How an evaluated sample is scored under its benchmark's rule, what it records (`samples.jsonl`), and the run's
metrics computed from those records; the definitions are in docs/evaluation.md."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from PIL.Image import Image

from data.task import OPTION_LETTERS, is_correct, message_text, parse_choice
from evaluation.agent import Episode
from rewards.verifiers import ClipVerifier
from tools import ZoomCall, box_contains, boxes_overlap

# ------------------------------------------------------------------------------------------------------- scoring
_MME_PREFIXES = (
    "The best answer is", "The correct answer is", "The answer is", "The answer", "The best option is",
    "The correct option is", "Best answer:", "Best option:",
)  # fmt: skip


def mme_choice(prediction: str, options: Sequence[str]) -> int | None:
    """The option MME-RealWorld's reference scorer reads in `prediction` (`eval_your_results.py`,
    `extract_characters_regex`): the first capital A-E anywhere, once answer prefixes are removed; without one, the
    option whose "(X) text" contains the prediction. Looser than `task.parse_choice`, and kept so because the
    benchmark's published numbers use it."""
    text = prediction.strip()
    for prefix in _MME_PREFIXES:
        text = text.replace(prefix, "")
    letter = re.search(r"[ABCDE]", text)
    if letter is None:
        if len(text.split()) > 10:
            return None
        choices = [f"({OPTION_LETTERS[i]}) {option}".lower() for i, option in enumerate(options)]
        return next((i for i, choice in enumerate(choices) if text.lower() in choice), None)
    index = OPTION_LETTERS.index(letter.group())
    return index if index < len(options) else None


def score_answer(
    benchmark: str, prediction: str | None, answer: str, options: Sequence[str]
) -> tuple[bool, str | None]:
    """(correct, failure reason) of a final answer under the benchmark's rule: training's (`task.is_correct`: the
    option letter or the option's text, else normalised equality) everywhere but MME-RealWorld (`mme_choice`). A
    multiple-choice answer that names no option is a failure; a missing answer is the agent's failure, already
    recorded."""
    if prediction is None:
        return False, None
    if not prediction.strip():
        return False, "empty <answer>"
    if not options:
        return is_correct(prediction, answer), None
    if benchmark == "mme_realworld":
        choice = mme_choice(prediction, options)
        correct = choice is not None and choice == parse_choice(answer, options)
    else:
        choice = parse_choice(prediction, options)
        correct = is_correct(prediction, answer, options)
    if choice is None:
        return False, f"answer outside the options: {prediction[:100]!r}"
    return correct, None


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def accuracy_by(records: Iterable[dict], key: Callable[[dict], str]) -> dict[str, float]:
    """Accuracy of `records` (dicts with a boolean `correct`) grouped by `key(record)`, in key order."""
    groups = defaultdict(list)
    for record in records:
        groups[key(record)].append(float(record["correct"]))
    return {name: mean(values) for name, values in sorted(groups.items())}


def benchmark_metrics(benchmark: str, records: Sequence[dict]) -> dict:
    """The breakdowns a benchmark's reference reports, from records carrying `source` and `correct`."""
    if benchmark == "hrbench":  # the reference reports each category and their mean
        by_category = accuracy_by(records, lambda r: r["source"].rsplit("/", 1)[-1])
        single, cross = by_category.get("single"), by_category.get("cross")
        return {"single": single, "cross": cross, "mean": mean([v for v in (single, cross) if v is not None])}
    if benchmark == "mme_realworld":  # sources are <variant>/<Task>/<Subtask>/<Category>
        return {
            "accuracy_by_task": accuracy_by(records, lambda r: r["source"].split("/")[1]),
            "accuracy_by_subtask": accuracy_by(records, lambda r: "/".join(r["source"].split("/")[1:3])),
        }
    return {}


def clip_scores(verifier: ClipVerifier, images: Sequence[Image], calls: Sequence[list[ZoomCall]]) -> list[list]:
    """For each episode (its original image and its calls), per call: `(z_t, z_full)`, the CLIP cosine of the call's
    label with its crop and with the whole image, or None for a call that returned no crop. One batched CLIP call."""
    pairs = [(call, image) for image, episode_calls in zip(images, calls) for call in episode_calls if call.ok]
    cosine = verifier.similarity(
        [call.label for call, _ in pairs] * 2, [call.crop for call, _ in pairs] + [image for _, image in pairs]
    ).tolist()
    scores = iter(zip(cosine[: len(pairs)], cosine[len(pairs) :]))
    return [[next(scores) if call.ok else None for call in episode_calls] for episode_calls in calls]


def _messages(episode: Episode, tokenizer) -> list[dict]:
    """The episode's completion, JSON-ready: assistant turns as parsed (with their raw text, for turns the parser
    could not read) and tool replies as text, each pointing at its call."""
    messages, turns, call = [], iter(episode.turn_ids), 0
    for message in episode.completion:
        if message["role"] == "assistant":
            messages.append(
                {
                    "role": "assistant",
                    "reasoning": message.get("reasoning_content"),
                    "content": message.get("content") or "",
                    "tool_calls": [c.get("function", c) for c in message.get("tool_calls") or []],
                    "raw": tokenizer.decode(next(turns)),
                }
            )
        else:
            messages.append({"role": "tool", "name": message["name"], "content": message_text(message), "call": call})
            call += 1
    return messages


def episode_record(
    benchmark: str, row: dict, episode: Episode, calls: list[ZoomCall], scores: list, tokenizer
) -> dict:
    """The `samples.jsonl` line of one sample; `calls` are `episode.calls`, `scores` their `clip_scores`."""
    correct, reason = score_answer(benchmark, episode.prediction, row["answer"], row["options"])
    messages = _messages(episode, tokenizer)
    turn_of_call, turn = {}, 0
    for message in messages:
        turn += message["role"] == "assistant"
        if message["role"] == "tool":
            turn_of_call[message["call"]] = turn
    records = []
    for k, (call, score) in enumerate(zip(calls, scores)):
        z, z_full = score or (None, None)
        records.append(
            {
                "t": call.turn,
                "turn": turn_of_call[k],
                "name": call.name,
                "arguments": call.arguments,
                "label": call.label,
                "box": list(call.box) if call.box else None,
                "error": call.error,
                "z": z,
                "z_full": z_full,
                "gap": None if z is None else z <= z_full,
            }
        )
    return {
        "id": row["id"],
        "source": row["source"],
        "question": row["prompt"][-1]["content"],
        "options": list(row["options"]),
        "answer": row["answer"],
        "prediction": episode.prediction,
        "correct": correct,
        "failure": episode.failure or reason,
        "num_turns": episode.num_turns,
        "completion_tokens": len(episode.completion_ids),
        "image_size": list(episode.image.size) if episode.image else None,
        "seen_size": list(episode.seen_size) if episode.seen_size else None,
        # the frame of the calls' bbox_2d (the seen size in pixels, or 1000 x 1000: `ToolConfig.box_convention`)
        "box_frame": list(episode.env.box_frame) if episode.env is not None else None,
        "target_bbox": row.get("target_bbox"),
        "target_label": row.get("target_label"),
        "messages": messages,
        "calls": records,
    }


def _target_rate(records: Sequence[dict], hit: Callable[[Sequence[int], Sequence[int]], bool]) -> float | None:
    """Over the valid calls of rows that have a `target_bbox`, the fraction whose crop `hit`s it; None without any."""
    hits = [
        float(hit(call["box"], record["target_bbox"]))
        for record in records
        if record.get("target_bbox")
        for call in record["calls"]
        if call["box"] is not None
    ]
    return mean(hits) if hits else None


def compute_metrics(records: Sequence[dict], benchmark: str, skipped_rows: int = 0) -> dict[str, Any]:
    """Accuracy under the benchmark's reporting rule plus the agent's tool use; definitions in docs/evaluation.md."""
    calls = [call for record in records for call in record["calls"]]
    valid = [call for call in calls if call["box"] is not None]
    scored = [call for call in valid if call["z"] is not None]
    metrics = {
        "benchmark": benchmark,
        "n": len(records),
        "n_failed": sum(record["failure"] is not None for record in records),
        "skipped_rows": skipped_rows,
        "accuracy": mean([float(record["correct"]) for record in records]),
        "accuracy_by_source": accuracy_by(records, lambda r: r["source"]),
        "turns_per_sample": mean([record["num_turns"] for record in records]),
        "calls_per_sample": mean([len(record["calls"]) for record in records]),
        "tool_call_rate": mean([float(bool(record["calls"])) for record in records]),
        "valid_call_rate": len(valid) / len(calls) if calls else None,
        "box_contains_target": _target_rate(records, box_contains),
        "box_touches_target": _target_rate(records, boxes_overlap),
        "mean_z": mean([call["z"] for call in scored]),
        "gap_rate": mean([float(call["gap"]) for call in scored]),
    }
    paid = reward_summary(records)
    return metrics | benchmark_metrics(benchmark, records) | ({"rewards": paid} if paid else {})


def reward_summary(records: Sequence[dict]) -> dict[str, dict[str, float | int | None]]:
    """Per RL reward the samples were scored with (`EvalArguments.reward_funcs`): its mean over the rollouts it scored,
    how many it scored (None: a row it cannot score) and how many it paid (a value above 0)."""
    names = dict.fromkeys(name for record in records for name in record.get("rewards") or {})
    summary = {}
    for name in names:
        values = [record["rewards"][name] for record in records if (record.get("rewards") or {}).get(name) is not None]
        summary[name] = {"mean": mean(values), "scored": len(values), "paid": sum(value > 0 for value in values)}
    return summary


def no_valid_call(records: Sequence[dict], max_completion_length: int, max_tool_calling_iterations: int) -> str | None:
    """Why an evaluation in which no zoom-in call was valid cannot say anything of the tool (no crop, no z_t), with the
    likely causes and the fields to change; None when some call was valid."""
    calls = [call for record in records for call in record["calls"]]
    if not records or any(call["box"] is not None for call in calls):
        return None
    if not calls:
        made = (
            f"no sample called image_zoom_in_tool in {len(records)}: the model has not learned the tool's format (no "
            "SFT cold start, or too short a one), or max_tool_calling_iterations="
            f"{max_tool_calling_iterations} or max_completion_length={max_completion_length} leaves it no room"
        )
    else:
        errors = Counter(str(call["error"]) for call in calls).most_common(1)[0]
        made = (
            f"all {len(calls)} zoom-in calls of {len(records)} samples were rejected, most often ({errors[1]}x) "
            f"with {errors[0][:200]!r}: a model trained in another box_convention, a label over the tool's limits, "
            "or a call format its SFT did not teach"
        )
    return f"No valid zoom-in call: {made}. Accuracy here is the model's without the tool, and mean_z is empty."
