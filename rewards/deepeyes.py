"""`deepeyes` reward: DeepEyes' training reward as DeepEyes computes it (github.com/Visual-Agent/DeepEyes,
`verl/utils/reward_score/vl_agent.py`, `compute_score`), on this repo's rollouts:

    R = 0.8 acc + 0.2 format + 1.2 tool

acc is the LLM judge's verdict on every rollout's answer (DeepEyes' prompt and reading: `JUDGE_VERDICT=deepeyes`), the
tool term is 1 when the rollout holds a returned crop and that same verdict is right, and the format term is -1 only
for unbalanced `<think>`, vision or (after the last `</think>`) `<answer>` tags, or an answer of `MAX_ANSWER_CHARS`
characters or more (which also zeroes acc), else 0. DeepEyes reads the rollout as one decoded string; `rollout_text`
writes this repo's message form of it in that shape.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from data.task import MAX_ANSWER_CHARS, USER_SUFFIX, message_text
from rewards.judge import ask_judge, fill_judge_prompt, judge_settings, prompt_question
from utils.registry import reads_columns

logger = logging.getLogger(__name__)

# DeepEyes' weights of accuracy, format and the tool bonus (`compute_score`'s "reward 2", the one it returns).
WEIGHTS = {"accuracy": 0.8, "format": 0.2, "tool": 1.2}
# How a returned image reads in the decoded rollout: Qwen2.5-VL's vision tokens, which DeepEyes counts.
VISION_START, VISION_END = "<|vision_start|><|image_pad|>", "<|image_pad|><|vision_end|>"


@dataclass(frozen=True)
class DeepEyesTerms:
    """What DeepEyes' `compute_score` reads of a decoded rollout before it asks its judge."""

    answer: str  # the text after the last `<answer>`, up to the next `</answer>`: the whole rollout without one
    format_error: bool  # unbalanced tags, or an answer of MAX_ANSWER_CHARS characters or more
    images: int  # the vision-start markers: images the tool returned (and any the policy wrote)

    @property
    def too_long(self) -> bool:
        return len(self.answer) >= MAX_ANSWER_CHARS


def rollout_text(completion: list[dict] | str) -> str:
    """A completion as one decoded string, in the shape DeepEyes' reward reads (`tokenizer.decode` of the response,
    special tokens kept): each assistant turn as the policy wrote it (`<think>` put back around the reasoning TRL's
    parser took out, its tool calls as `<tool_call>` blocks); each tool reply that returned a crop as DeepEyes'
    observation (`visual_toolbox_v2.py`: the image's vision tokens, then the format instruction, whose
    `<think>...</think>` and `<answer>...</answer>` are balanced, so that a rollout which zooms and never answers is
    judged on "...", as DeepEyes judges it, not on its whole text); any other reply as its text (DeepEyes' "Error:")."""
    if isinstance(completion, str):
        return completion
    parts = []
    for message in completion:
        if message.get("role") == "assistant":
            if message.get("reasoning_content") is not None:
                parts.append(f"<think>{message['reasoning_content']}</think>")
            parts.append(message_text(message))
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                call_json = json.dumps({"name": function.get("name"), "arguments": function.get("arguments")})
                parts.append(f"<tool_call>\n{call_json}\n</tool_call>")
            continue
        content = message.get("content")
        images = (
            sum(p.get("type") == "image" for p in content if isinstance(p, dict)) if isinstance(content, list) else 0
        )
        if images:
            vision = f"{VISION_START}{VISION_END.removeprefix('<|image_pad|>')}" * images
            parts.append(f"<tool_response>{vision}\n{USER_SUFFIX}</tool_response>")
        else:
            parts.append(message_text(message))
    return "".join(parts)


def deepeyes_terms(text: str) -> DeepEyesTerms:
    """The answer, format flag and image count DeepEyes' `compute_score` reads in a decoded rollout `text`."""
    unbalanced = text.count("<think>") != text.count("</think>") or text.count(VISION_START) != text.count(VISION_END)
    after_think = text.split("</think>")[-1]
    unbalanced |= after_think.count("<answer>") != after_think.count("</answer>")
    answer = text.split("<answer>")[-1].split("</answer>")[0].strip()
    return DeepEyesTerms(answer, unbalanced or len(answer) >= MAX_ANSWER_CHARS, text.count(VISION_START))


def deepeyes_score(terms: DeepEyesTerms, verdict: float) -> float:
    """DeepEyes' reward of a rollout with `terms` whose answer the judge called `verdict` (1.0 or 0.0)."""
    accuracy = 0.0 if terms.too_long else verdict
    tool = float(terms.images > 0 and accuracy > 0.5)
    fmt = -1.0 if terms.format_error else 0.0
    return WEIGHTS["accuracy"] * accuracy + WEIGHTS["format"] * fmt + WEIGHTS["tool"] * tool


@reads_columns("answer")
def deepeyes_reward(completions: list, answer: list[str], prompts: list | None = None, **kwargs) -> list[float | None]:
    """DeepEyes' reward (module docstring) with the judge of the `JUDGE_*` settings (a recipe's `judge_*` keys): every
    rollout's answer is judged, an answer of `MAX_ANSWER_CHARS` characters or more excepted (DeepEyes asks, then scores
    it 0 whatever the reply). The judge's question is the prompt's last user turn less the format instruction, its
    standard answer the row's `answer`. A row whose request fails is None (unscored: advantage 0; DeepEyes' run would
    stop), with one warning a batch giving the count."""
    settings = judge_settings(os.environ)
    prompts = prompts if prompts is not None else [None] * len(completions)
    terms = [deepeyes_terms(rollout_text(c)) for c in completions]
    asked = [i for i, t in enumerate(terms) if not t.too_long]
    filled = [
        fill_judge_prompt(settings.template, prompt_question(prompts[i]), answer[i], terms[i].answer) for i in asked
    ]
    verdicts: list[float | None] = [0.0] * len(completions)
    failures = []
    if asked:
        with ThreadPoolExecutor(max_workers=min(settings.concurrency, len(asked))) as pool:
            replies = list(pool.map(lambda p: ask_judge(settings, p), filled))
        for i, (verdict, why) in zip(asked, replies):
            verdicts[i] = verdict
            if why is not None:
                failures.append(why)
    if failures:
        why = f"{len(failures)} of {len(asked)} requests to {settings.base_url} got no verdict (first: {failures[0]})"
        logger.warning("deepeyes reward: %s; those rows are unscored", why)
    return [None if v is None else deepeyes_score(t, v) for t, v in zip(terms, verdicts)]
