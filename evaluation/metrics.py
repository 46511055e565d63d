"""How an evaluated sample is scored under its benchmark's rule, what it records (`samples.jsonl`), and the run's
metrics computed from those records; the definitions are in docs/evaluation.md."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from PIL.Image import Image

from data.task import (
    MAX_ANSWER_CHARS,
    OPTION_LETTERS,
    USER_SUFFIX,
    extract_answer,
    final_text,
    is_correct,
    message_text,
    parse_choice,
)
from evaluation.agent import Episode
from rewards.judge import JudgeSettings, ask_judge, fill_judge_prompt
from rewards.verifiers import ClipVerifier
from tools import ZoomCall, box_contains, boxes_overlap

# ------------------------------------------------------------------------------------------------------- scoring
# Each benchmark is scored by the rule of the pipeline its published numbers come from (docs/evaluation.md,
# "Scoring"), and by training's strict rule beside it. The rule families, by the benchmark (and MME's variant):
SCORING_RULES = {
    "can_infer": "training's rule, then \\boxed{} unwrapped, then VLMEvalKit's can_infer (option letter, option "
    "text), then the LLM judge if asked",
    "mme_realworld": "MME-RealWorld's evaluation/eval_your_results.py (extract_characters_regex)",
    "mme_realworld_lite": "lmms-eval's tasks/mme_realworld/utils.py (extract_characters_regex, letters (A)-(E) only)",
    "treebench": "VLMEvalKit's TreeBench.evaluate (vlmeval/dataset/image_mcq.py): the <answer> block upper-cased, "
    "then extract_characters_regex, letters (A)-(E)",
    "mini_o3_mc": "Mini-o3's verl/utils/reward_score/general_qa_tool_mc.py (inner_acc_reward): the last <answer> "
    "block equal to the solution, or starting '(X)' or 'X.' with X the solution",
}
# What decided a sample's verdict (`rule` in samples.jsonl, counted in metrics.json's `decided_by`).
DECIDING_RULES = (
    "strict", "boxed", "letter", "option_text", "judge", "empty_read_as_A", "none", "judge_unscored", "empty",
    "no_answer", "exact",
)  # fmt: skip

# The reply-level reading recorded beside ours (`rule_reply`, `correct_reply`; metrics' `accuracy_reply`,
# `decided_by_reply`): the published pipelines read a reply without <answer> tags whole (docs/evaluation.md).
REPLY_RULE = (
    "the <answer> block when the last reply has one, else the whole last reply, scored by the benchmark's rule: "
    "DeepEyes' eval/eval_vstar.py (output_text = the whole response without <answer>...</answer>), MME-RealWorld's "
    "eval_your_results.py and lmms-eval's mme_realworld read the model's output whole"
)

# VLMEvalKit's can_infer reads these characters as spaces, and these replies as refusals (no option).
_CAN_INFER_SPACES = str.maketrans(dict.fromkeys(".()[],:;!*#{}", " "))
_REFUSALS = (
    "Sorry, I can't help with images of people yet.", "I can't process this file.",
    "I'm sorry, but without the image provided", "Cannot determine the answer",
)  # fmt: skip
# MME-RealWorld's official prefix list lacks two commas, so Python glues four of its strings into two, which never
# occur: "The best option is", "The correct option is", "Best answer:" and "Best option:" are not stripped there
# (so "Best answer: C" reads as B, the B of "Best"). lmms-eval's copy has the commas.
_MME_PREFIXES = ("The best answer is", "The correct answer is", "The answer is", "The answer")
MME_OFFICIAL_PREFIXES = (*_MME_PREFIXES, "The best option isThe correct option is", "Best answer:Best option:")
MME_LMMS_EVAL_PREFIXES = (
    *_MME_PREFIXES,
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)


@dataclass(frozen=True)
class Verdict:
    """A sample's verdict: under the benchmark's published rule (`correct`, decided by `rule`, one of
    `DECIDING_RULES`) and under training's (`correct_strict`: `task.is_correct`), with the failure to record."""

    correct: bool
    correct_strict: bool
    rule: str
    failure: str | None = None


def scoring_rule(benchmark: str, source: str = "") -> str:
    """The rule family (a key of `SCORING_RULES`) a sample of `benchmark` from `source` is scored by: MME-RealWorld's
    official script for the full set, lmms-eval's for Lite (its published numbers: DeepEyes table 2), VLMEvalKit's
    fallback after training's rule everywhere else."""
    if benchmark == "mme_realworld":
        return "mme_realworld_lite" if source.startswith("mme_realworld_lite/") else "mme_realworld"
    return {"treebench": "treebench", "visualprobe": "mini_o3_mc"}.get(benchmark, "can_infer")


def can_infer(prediction: str, options: Sequence[str]) -> tuple[int | None, str]:
    """(option index or None, the step that read it) by VLMEvalKit's `can_infer`, as lmms-eval's HR-Bench task copies
    it (`lmms_eval/tasks/hrbench/hrbench_evals.py`, `HRBenchEval.can_infer`): the one option letter standing as a
    token once `.()[],:;!*#{}` are spaces ("letter"); else the one option whose lower-cased text is inside the
    lower-cased prediction ("option_text"). Two candidates, a lone "Z" token or a refusal read as no option ("none")."""
    if any(refusal in prediction for refusal in _REFUSALS):
        return None, "none"
    tokens = set(prediction.translate(_CAN_INFER_SPACES).split())
    letters = [i for i, letter in enumerate(OPTION_LETTERS[: len(options)]) if letter in tokens]
    if len(letters) == 1:
        return letters[0], "letter"
    if not letters and "Z" in tokens:  # VLMEvalKit's "no option fits" answer: its text match is not tried
        return None, "none"
    lowered = prediction.lower()
    texts = [i for i, option in enumerate(options) if option.lower() in lowered]
    return (texts[0], "option_text") if len(texts) == 1 else (None, "none")


def mme_choice(prediction: str, options: Sequence[str], lite: bool = False) -> tuple[str, str]:
    """(letter or "", the step that read it) by MME-RealWorld's `extract_characters_regex`: the official script's
    (`evaluation/eval_your_results.py`) or, with `lite`, lmms-eval's (`tasks/mme_realworld/utils.py`). Answer prefixes
    are removed (the official list glues four of them, `MME_OFFICIAL_PREFIXES`); then the first capital A-E anywhere
    ("letter": "Definitely (E)" reads as D); without one, an answer of more than ten words reads as nothing, else the
    first choice containing it: "(X) text" officially, only "(A)"-"(E)" in lmms-eval ("option_text"). Both read an
    empty answer as A ("empty_read_as_A": "" is in every choice)."""
    text = prediction.strip()
    for prefix in MME_LMMS_EVAL_PREFIXES if lite else MME_OFFICIAL_PREFIXES:
        text = text.replace(prefix, "")
    letter = re.search(r"[ABCDE]", text)
    if letter is not None:
        return letter.group(), "letter"
    if len(text.split()) > 10:
        return "", "none"
    letters = OPTION_LETTERS[:5] if lite else OPTION_LETTERS[: len(options)]
    choices = [f"({x})" if lite else f"({x}) {options[i]}" for i, x in enumerate(letters)]
    for letter, choice in zip(letters, choices):
        if text.lower() in choice.lower():
            return letter, "option_text" if text.strip() else "empty_read_as_A"
    return "", "none"


def mini_o3_choice(prediction: str, answer: str) -> tuple[bool, str]:
    r"""(right, the step that decided) by Mini-o3's `general_qa_tool_mc.inner_acc_reward` on an <answer> block: equal
    to the solution once stripped ("exact"), else `^\(([A-Z])\).*$` or `^([A-Z])\..*$` whose letter is the solution
    ("letter"); case-sensitive, as there."""
    text, gold = prediction.strip(), answer.strip()
    if text == gold:
        return True, "exact"
    for pattern in (r"^\(([A-Z])\).*$", r"^([A-Z])\..*$"):
        match = re.match(pattern, text, re.DOTALL)
        if match and match.group(1) == gold:
            return True, "letter"
    return False, "none"


def score_answer(
    benchmark: str, prediction: str | None, answer: str, options: Sequence[str], source: str = "", tagged: bool = True
) -> Verdict:
    """The `Verdict` on a final answer (`prediction`; None: the agent gave none, its failure already recorded).

    MME-RealWorld: its published pipeline's rule alone (`mme_choice`). Elsewhere, multiple choice: training's rule
    (`task.parse_choice`, "strict"), then training's rule on the answer's `\\boxed{}` ("boxed"), then VLMEvalKit's
    `can_infer` ("letter", "option_text"); an answer none of them reads is wrong ("none"), until the LLM judge, if asked,
    rules on it (`judge_records`). Open answers: training's rule ("strict"). `correct_strict` is always training's
    verdict (`task.is_correct`, which also refuses answers of `MAX_ANSWER_CHARS` characters or more)."""
    if prediction is None:
        return Verdict(False, False, "no_answer")
    strict = is_correct(prediction, answer, options)
    family = scoring_rule(benchmark, source)
    if family == "mini_o3_mc":
        right, rule = mini_o3_choice(prediction, answer)
        return Verdict(right, strict, rule, None if right else f"not the solution: {prediction[:100]!r}")
    if family != "can_infer":
        text = prediction.strip().upper() if family == "treebench" and tagged else prediction  # an <answer> block
        letter, rule = mme_choice(text, options, lite=family in ("mme_realworld_lite", "treebench"))
        failure = None if letter else f"answer outside the options: {prediction[:100]!r}"
        return Verdict(bool(letter) and letter == answer.strip(), strict, rule, failure)
    if not prediction.strip():
        return Verdict(False, False, "empty", "empty <answer>")
    if not options:
        return Verdict(strict, strict, "strict")
    gold = parse_choice(answer, options)
    choice, rule = None, "none"
    if len(prediction) < MAX_ANSWER_CHARS:
        choice, rule = parse_choice(prediction, options), "strict"
        boxed = extract_answer(prediction) if choice is None else None
        if boxed is not None:
            choice, rule = parse_choice(boxed, options), "boxed"
    if choice is None:
        choice, rule = can_infer(prediction, options)
    failure = None if choice is not None else f"answer outside the options: {prediction[:100]!r}"
    return Verdict(choice is not None and choice == gold, strict, rule, failure)


def reply_verdict(benchmark: str, prediction: str | None, reply: str, row: dict) -> Verdict:
    """The reply-level reading (`REPLY_RULE`): our verdict when the last reply has an <answer> block; else its whole
    text scored by the benchmark's rule (an empty reply: no answer). VisualProbe's rule reads <answer> blocks only
    (Mini-o3 scores a reply without one 0), so its reading is ours."""
    whole = prediction is None and scoring_rule(benchmark, row["source"]) != "mini_o3_mc" and reply.strip()
    text = reply if whole else prediction
    return score_answer(benchmark, text, row["answer"], row["options"], row["source"], tagged=not whole)


def judge_question(user_turn: str) -> str:
    """The bare question of a sample's user turn (`task.format_question`: question, options, format instruction), as
    DeepEyes' evaluation shows it to its judge (its annotation's `question`)."""
    return user_turn.removesuffix(USER_SUFFIX).split("\nOptions:\n")[0].strip()


def judge_gold(benchmark: str, answer: str, options: Sequence[str]) -> str:
    """The standard answer DeepEyes' evaluation shows its judge: "X. option text" (`eval/judge_result.py`), the letter
    alone on HR-Bench (`eval/judge_result_hrbench.py` passes `answer`), an open question's answer as it is."""
    choice = parse_choice(answer, options)
    if choice is None or benchmark == "hrbench":
        return answer
    return f"{OPTION_LETTERS[choice]}. {options[choice]}"


def judge_records(records: Sequence[dict], benchmark: str, settings: JudgeSettings) -> list[dict]:
    """`records` with the LLM judge's ruling on the answers the deterministic rules leave open, DeepEyes' evaluation
    protocol (`eval/judge_result*.py`: rules first, the judge for the rest): multiple-choice answers no rule read
    (`rule` "none") and open answers training's rule calls wrong; MME-RealWorld's rules are left as published. The
    judge's verdict decides ("judge", no failure); a request that gets none leaves the answer wrong ("judge_unscored",
    the reason in `judge_error`). Requests run `settings.concurrency` at a time."""
    records = list(records)
    asked = [
        i
        for i, r in enumerate(records)
        if scoring_rule(benchmark, r["source"]) == "can_infer"
        and (r["rule"] == "none" or (not r["options"] and r["rule"] == "strict" and not r["correct"]))
    ]
    if not asked:
        return records
    prompts = [
        fill_judge_prompt(
            settings.template,
            judge_question(records[i]["question"]),
            judge_gold(benchmark, records[i]["answer"], records[i]["options"]),
            records[i]["prediction"],
        )
        for i in asked
    ]
    with ThreadPoolExecutor(max_workers=min(settings.concurrency, len(asked))) as pool:
        replies = list(pool.map(lambda prompt: ask_judge(settings, prompt), prompts))
    for i, (verdict, why) in zip(asked, replies):
        if verdict is None:
            records[i] = records[i] | {"rule": "judge_unscored", "judge_error": why}
        else:
            records[i] = records[i] | {"correct": verdict == 1.0, "rule": "judge", "failure": None}
            if records[i].get("rule_reply") == "none" and records[i]["prediction"] is not None:  # the same text
                records[i] |= {"correct_reply": verdict == 1.0, "rule_reply": "judge"}
    return records


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
    if benchmark == "treebench":  # sources are treebench/<Task>/<Subtask>; its Overall is `accuracy`
        return {
            "accuracy_by_task": accuracy_by(records, lambda r: r["source"].split("/")[1]),
            "accuracy_by_subtask": accuracy_by(records, lambda r: "/".join(r["source"].split("/")[1:3])),
        }
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
    verdict = score_answer(benchmark, episode.prediction, row["answer"], row["options"], row["source"])
    reply = reply_verdict(benchmark, episode.prediction, final_text(episode.completion), row)
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
        "correct": verdict.correct,
        "correct_strict": verdict.correct_strict,
        "rule": verdict.rule,
        "correct_reply": reply.correct,
        "rule_reply": reply.rule,
        "failure": episode.failure or verdict.failure,
        "num_turns": episode.num_turns,
        "completion_tokens": len(episode.completion_ids),
        "image_size": list(episode.image.size) if episode.image else None,
        "seen_size": list(episode.seen_size) if episode.seen_size else None,
        # the frame of the calls' bbox_2d (the seen size in pixels, or 1000 x 1000: `ToolConfig.box_convention`)
        "box_frame": list(episode.env.box_frame) if episode.env is not None else None,
        "target_bbox": row.get("target_bbox"),
        "target_label": row.get("target_label"),
        **{key: row[key] for key in ("question_id", "order", "sample", "option_order") if key in row},
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


def _strict_accuracy(records: Sequence[dict]) -> float | None:
    """Accuracy under training's rule; None when a record predates `correct_strict` (a run resumed across versions)."""
    strict = [record.get("correct_strict") for record in records]
    return None if None in strict else mean([float(c) for c in strict])


def compute_metrics(records: Sequence[dict], benchmark: str, skipped_rows: int = 0) -> dict[str, Any]:
    """Accuracy under the benchmark's reporting rule plus the agent's tool use; definitions in docs/evaluation.md."""
    calls = [call for record in records for call in record["calls"]]
    valid = [call for call in calls if call["box"] is not None]
    scored = [call for call in valid if call["z"] is not None]
    families = {scoring_rule(benchmark, record["source"]) for record in records}
    metrics = {
        "benchmark": benchmark,
        "n": len(records),
        "n_failed": sum(record["failure"] is not None for record in records),
        "skipped_rows": skipped_rows,
        "scoring": {family: SCORING_RULES[family] for family in sorted(families)},
        "accuracy": mean([float(record["correct"]) for record in records]),
        "accuracy_strict": _strict_accuracy(records),
        "decided_by": dict(sorted(Counter(record.get("rule", "unrecorded") for record in records).items())),
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


def reply_metrics(records: Sequence[dict]) -> dict[str, Any]:
    """The reply-level reading beside ours (`REPLY_RULE`): its accuracy (None when a record predates it: a run
    resumed across versions), what decided it, and the rule."""
    reply = [record.get("correct_reply") for record in records]
    return {
        "accuracy_reply": None if None in reply or not reply else mean([float(c) for c in reply]),
        "decided_by_reply": dict(sorted(Counter(r.get("rule_reply", "unrecorded") for r in records).items())),
        "reply_rule": REPLY_RULE,
    }


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
