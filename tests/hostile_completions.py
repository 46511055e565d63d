"""Completions a broken policy could write, drawn by a seeded generator: the fuzz corpus of issue 59, item 1.

Each is one assistant turn's text, as generation would return it (ended by `<|im_end|>`, or not: cut by the budget).
The kinds: deep bracket nesting at depths around every recursion limit, NaN / Infinity / huge numbers in every field,
unicode (control characters, surrogates' neighbours, right-to-left, combining marks), floods of tags, malformed calls
of every shape TRL's parser can half-read, and well-formed calls among them so the tool really crops. `random_ids` adds
raw token ids drawn from the vocabulary, but never an image or video placeholder, which generation is kept from
sampling (`repairs.rollout.ban_placeholder_tokens`).
"""

from __future__ import annotations

import json
import random

import datasets
from PIL import Image

from data.task import build_prompt
from repairs import rollout
from tools import TOOL_NAME

FUZZ_TURNS = 10_000  # the count, through each path
ROWS = 64  # rollouts per generation batch (16 prompts x 4)
BUDGET = 2400  # tokens: room for a call nesting 1,000 brackets (one token each in the tiny tokenizer)
SIDE = 112  # the tiny policy's largest image (12,544 pixels): the processor resizes nothing, and runs fast

NUMBERS = (
    "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "0", "-0", "-1", "1.5", "1" * 400, "-" + "9" * 400,
    "9" * 5000, "1e308", "2e308", "123456789012345678901234567890", "0.0000001", "true", "null", '"10"', "[]", "{}",
)  # fmt: skip
TEXTS = (
    "the star", "", " ", "\x00", "\u202eelbat eht", "e\u0301\u0301\u0301", "\U0001f600" * 30, "\ud7ff\ue000",
    "a" * 500, "word " * 40, "<answer>A</answer>", "</tool_call>", '"}', "\\", "\n\n\n", "標識", "\t\r\x0b\x0c",
)  # fmt: skip
TAGS = ("<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "<tool_response>",
        "</tool_response>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|endoftext|>")  # fmt: skip


def call(arguments: object, name: object = TOOL_NAME) -> str:
    """A `<tool_call>` block around any JSON body: `arguments` raw text when a string, else JSON-dumped."""
    body = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {body}}}\n</tool_call>'


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def _box(rng: random.Random) -> str:
    """A `bbox_2d` value: four numbers, some hostile, or not four numbers at all."""
    roll = rng.random()
    if roll < 0.4:
        return "[" + ", ".join(rng.choice(NUMBERS) for _ in range(4)) + "]"
    if roll < 0.6:
        return nested(rng.choice((2, 5, 14, 15, 16, 17, 50, 300, 900, 990, 1000, 2000, 5000)))
    if roll < 0.8:
        return json.dumps([rng.randint(-50, 600) for _ in range(rng.choice((0, 1, 3, 4, 4, 4, 5, 40)))])
    return rng.choice(NUMBERS)


def _arguments(rng: random.Random) -> str:
    fields = [
        f'"bbox_2d": {_box(rng)}',
        f'"label": {rng.choice((json.dumps(rng.choice(TEXTS), ensure_ascii=False), *NUMBERS[:6]))}',
    ]
    if rng.random() < 0.4:
        fields.append(f'"img_idx": {rng.choice(NUMBERS)}')
    if rng.random() < 0.1:
        fields.append(f'"extra": {nested(rng.randint(1, 40), "{}")}')
    rng.shuffle(fields)
    return "{" + ", ".join(fields[: rng.randint(0, len(fields))] if rng.random() < 0.2 else fields) + "}"


def _malformed(rng: random.Random) -> str:
    box = [rng.randint(0, 200) for _ in range(2)] + [rng.randint(200, 400) for _ in range(2)]
    shapes = (
        lambda: call('"bbox_2d"'),  # arguments a string
        lambda: call(json.dumps([box, "x"])),  # arguments a list
        lambda: call("null"),
        lambda: call({"bbox_2d": box, "label": "x"}, name=rng.choice((None, 5, "", "rotate", TOOL_NAME * 20))),
        lambda: f"<tool_call>\n{json.dumps({'arguments': {'bbox_2d': box, 'label': 'x'}})}\n</tool_call>",
        lambda: f'<tool_call>\n{{"name": "{TOOL_NAME}", "arguments": {{"bbox_2d": {box}, "label": "x"}}',  # unclosed
        lambda: call({"bbox_2d": box, "label": "x"})[:-14] + "}} trailing {" + "</tool_call>",
        lambda: f'<tool_call>\n{{"name": "{TOOL_NAME}", "name": 7, "arguments": {{}}, "arguments": 3}}\n</tool_call>',
        lambda: call({"bbox_2d": box, "label": "x"}) * rng.randint(2, 30),  # many calls in one turn
        lambda: "<tool_call>" * rng.randint(1, 3000),
        lambda: call(nested(rng.randint(900, 3000), "{}")),  # arguments nested as objects
        lambda: "<tool_call>\n" + "{" * rng.randint(500, 3000) + "\n</tool_call>",
        lambda: '<tool_call>\n{"name": "' + TOOL_NAME + '", "arguments": "' + "\\u0000" * 50 + '"}\n</tool_call>',
    )
    return rng.choice(shapes)()


def _flood(rng: random.Random) -> str:
    return "".join(rng.choice(TAGS) + rng.choice(("", " ", "x", "\n")) for _ in range(rng.randint(10, 1500)))


def _unicode(rng: random.Random) -> str:
    points = [rng.choice((rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)))
              for _ in range(rng.randint(1, 400))]  # fmt: skip
    text = "".join(map(chr, points))
    return text if rng.random() < 0.5 else call({"bbox_2d": [1, 2, 300, 300], "label": text[:60]})


def hostile_completion(rng: random.Random) -> str:
    """One hostile assistant turn; about one in six is a well-formed call or answer."""
    kind = rng.random()
    if kind < 0.35:
        text = call(_arguments(rng))
    elif kind < 0.55:
        text = _malformed(rng)
    elif kind < 0.65:
        text = _flood(rng)
    elif kind < 0.8:
        text = _unicode(rng)
    elif kind < 0.9:
        box = [rng.randint(0, 100), rng.randint(0, 100), rng.randint(120, 400), rng.randint(120, 400)]
        text = call({"bbox_2d": box, "label": rng.choice(("the star", "red circle"))})
    else:
        text = "<answer>" + rng.choice(("A", "B", "", "A" * 1000, nested(400))) + "</answer>"
    prefix = rng.choice(("", "<think>look</think>\n", "<think>" * 50))
    return prefix + text + ("<|im_end|>" if rng.random() < 0.9 else "")


def hostile_completions(n: int, seed: int) -> list[str]:
    """`n` hostile turns, the same for the same seed."""
    rng = random.Random(seed)
    return [hostile_completion(rng) for _ in range(n)]


def random_ids(rng: random.Random, vocab_size: int, banned: set[int], length: int) -> list[int]:
    """`length` token ids drawn uniformly from the vocabulary but the `banned` ones."""
    ids = []
    while len(ids) < length:
        token = rng.randrange(vocab_size)
        if token not in banned:
            ids.append(token)
    return ids


class HostilePolicy:
    """Turns for a scripted policy: the next hostile completion, or (one in twenty) random token ids, tokenized and cut
    to the turn's budget and after the first EOS, as generation returns them. `turns` counts what it has written."""

    def __init__(self, processor, n: int, seed: int):
        self.tokenizer = processor.tokenizer
        self.texts = iter(hostile_completions(n, seed))
        self.rng = random.Random(seed + 1)
        self.banned = set(self.tokenizer.convert_tokens_to_ids(rollout.placeholder_tokens(processor)))
        self.eos = self.tokenizer.eos_token_id
        self.turns = 0

    def turn(self, budget: int) -> list[int]:
        self.turns += 1
        text = next(self.texts, None)
        if text is None or self.rng.random() < 0.05:
            ids = random_ids(self.rng, len(self.tokenizer), self.banned, self.rng.randint(1, 300))
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = ids[:budget]
        return ids[: ids.index(self.eos) + 1] if self.eos in ids else ids


def hostile_rows(n: int) -> datasets.Dataset:
    """`n` rows of the repo's columns, each a small image with a target box, for the rewards to read."""
    options = ["A. red", "B. blue"]
    return datasets.Dataset.from_list(
        [
            {
                "prompt": build_prompt("What colour is the star?", options),
                "image": Image.new("RGB", (SIDE, SIDE), "white"),
                "answer": "A",
                "options": options,
                "source": "synthetic",
                "target_bbox": [10, 10, 60, 60],
                "target_label": "the star",
                "id": str(i),
            }  # fmt: skip
            for i in range(n)
        ]
    )


def read_rollouts(completions, environments) -> dict[str, int]:
    """What the rollouts did: calls the tool answered with a crop, with its own error, and turns holding a
    `<tool_call>` that did not parse (read as plain text)."""
    seen = {"cropped": 0, "tool_error": 0, "unparsed": 0, "over_depth": 0}
    for completion, env in zip(completions, environments):
        for message in completion:
            if message["role"] == "assistant" and not message.get("tool_calls"):
                unparsed = "<tool_call>" in (message.get("content") or "")
                seen["unparsed"] += unparsed
                seen["over_depth"] += unparsed and "[" * 990 in message["content"]
        seen["cropped"] += sum(c.ok for c in env.calls)
        seen["tool_error"] += sum(not c.ok for c in env.calls)
    return seen
