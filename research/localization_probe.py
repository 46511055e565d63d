"""Can the tiny policy learn to say where a target is? A supervised probe, image + question -> zoom box, no tools.

Scenes are 448 x 448 (the tiny policy sees 112 x 112, 16 image tokens): a pale background and 1-6 saturated square
cards of different colours; the question asks for one card by colour. The policy is trained on the gold box alone
(the answer turn holds nothing else), then greedy boxes on held-out scenes are checked for holding the card. Two cues:

- `pixels`: "Where is the green card?"; the gold box is the card's `grid_box` (42 px boxes on 28 px cells, the grid
  the tiny SFT recipe used before region hints): finding the card is left to the pixels;
- `words`: the same question, plus "Look in the top left of the image." (`data.synthetic.REGIONS`); the gold box
  is the named cell's `region_box` (what the tiny SFT recipe trains on now).

`--readout cell` asks for the index (0-15) of the image token whose cell holds the card instead of four numbers: one
word, the token the card reaches (`research/vision_tokens.py`), chance 1 in 16.

`--tint A` adds a coordinate tint to the background (red rises left to right, blue top to bottom, A levels each), so
every image token's pixels say where it is. Chance is the mean over test scenes of the fraction of the cue's
candidate boxes (16 grid boxes, or 9 region boxes) that hold the card: what a policy that ignores the image scores.

    python -m research.localization_probe --cue pixels --cards 1 1 --tint 60 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from data import task
from data.synthetic import REGION_GRID
from data.trajectories import (
    THINK_ZOOM,
    grid_box,
    region_box,
)
from research.card_scenes import GRID, GRID_BOX, MARGIN, SCENE, VIEW, scenes
from tiny.kit import kit_paths
from tools import ToolConfig, box_contains, environment_tools, make_environment_factory, tool_call_text
from utils.models import load_model, load_processor, pixel_budget

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n"


def chat_prompt(processor) -> str:
    """The prompt as SFT and RL render it (system prompt, tool schema, the question with the task's instructions),
    then the gold thought and the tool call up to its box: `{question}` is left to fill in."""
    env = make_environment_factory(ToolConfig(), pixel_budget(processor))()
    messages = task.build_prompt("{question}")
    messages[1]["content"] = [{"type": "image"}, {"type": "text", "text": messages[1]["content"]}]
    text = processor.apply_chat_template(
        messages, tools=environment_tools(env), add_generation_prompt=True, tokenize=False
    )
    text = text.replace("{", "{{").replace("}", "}}").replace("{{question}}", "{question}")
    # Up to the colon: the space before the box tokenizes with its bracket (" ["), as in the rendered call.
    call = tool_call_text([0], "")  # the call's text up to its box, braces escaped for `str.format`
    call = call[: call.index('"bbox_2d":') + len('"bbox_2d":')].replace("{", "{{").replace("}", "}}")
    return text + f"<think>{THINK_ZOOM}</think>\n" + call


def candidate_boxes(cue: str) -> list[list[int]]:
    """Every box the cue's gold rule can produce, in the 112 x 112 view."""
    if cue == "pixels":
        centres = [GRID * i + GRID // 2 for i in range(VIEW // GRID)]
        return [grid_box([x, y, x, y], (VIEW, VIEW), GRID, GRID_BOX) for y in centres for x in centres]
    cell = VIEW // REGION_GRID
    centres = [cell * i + cell // 2 for i in range(REGION_GRID)]
    return [region_box([x, y, x, y], (VIEW, VIEW), MARGIN) for y in centres for x in centres]


def read_answer(text: str, readout: str) -> list | int | None:
    """The generated answer: the first `[...]` as a box (with chat context the call's JSON goes on after it), or the
    first whitespace-separated word as a cell index; None when it is neither."""
    try:
        if readout == "cell":
            return int(text.split()[0])
        box = json.loads(text[: text.index("]") + 1].strip())
        numbers = isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)
        return box if numbers else None
    except (ValueError, TypeError, IndexError):
        return None


def holds(view_box: list[int], card: list[int]) -> bool:
    return box_contains([v * SCENE / VIEW for v in view_box], card)


def encode(processor, prompt: str, before_box: str, batch: list[dict], with_answer: bool) -> dict:
    """Model inputs for `batch`: `prompt` with each question filled in, then (`with_answer`) the gold box and the end
    token, the only tokens in the loss (`labels`)."""
    tokenizer = processor.tokenizer
    texts = [
        prompt.format(question=s["question"])
        + (f"{before_box}{json.dumps(s['gold'])}<|im_end|>" if with_answer else "")
        for s in batch
    ]
    tokenizer.padding_side = "right" if with_answer else "left"
    enc = processor(text=texts, images=[s["image"] for s in batch], return_tensors="pt", padding=True)
    if with_answer:
        image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        labels = enc["input_ids"].clone()
        for row, s in enumerate(batch):  # the processor widens the one image placeholder to the image's tokens
            text_tokens = len(tokenizer(prompt.format(question=s["question"]))["input_ids"])
            labels[row, : text_tokens - 1 + int((enc["input_ids"][row] == image_pad).sum())] = -100
        labels[enc["attention_mask"] == 0] = -100
        enc["labels"] = labels
    return enc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cue", choices=["pixels", "words"], default="pixels")
    parser.add_argument("--cards", type=int, nargs=2, default=[1, 6], help="cards per scene, low and high")
    parser.add_argument("--tint", type=float, default=0.0, help="coordinate tint, levels across the scene")
    parser.add_argument(
        "--context",
        choices=["bare", "chat"],
        default="bare",
        help="bare: the question alone, the box right after it; chat: the prompt as SFT renders it (system prompt, "
        "tool schema, instructions; ~550 tokens) and the gold thought and tool call up to the box",
    )
    parser.add_argument(
        "--readout",
        choices=["box", "cell"],
        default="box",
        help="box: the four numbers of the gold box; cell: the index (0-15) of the image token's cell that holds the "
        "card's centre, one word (bare context only)",
    )
    parser.add_argument("--policy", default=str(kit_paths("outputs/tiny")["policy"]))
    parser.add_argument("--train_rows", type=int, default=1024)
    parser.add_argument("--test_rows", type=int, default=128)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--eval_every", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args()
    if args.readout == "cell" and (args.context != "bare" or args.cue != "pixels"):
        parser.error("--readout cell: with --context bare and --cue pixels only (the cell is the card's token)")

    torch.manual_seed(args.seed)
    processor = load_processor(args.policy)
    tokenizer = processor.tokenizer
    prompt = chat_prompt(processor) if args.context == "chat" else PROMPT
    before_box = " " if args.context == "chat" else ""
    model = load_model(args.policy, dtype=torch.float32)
    train = scenes(args.train_rows, args.seed, args.cue, tuple(args.cards), args.tint)
    test = scenes(args.test_rows, args.seed + 1, args.cue, tuple(args.cards), args.tint)
    if args.readout == "cell":  # the answer is the token's index, chance one in 16
        for s in train + test:
            s["gold"] = s["cell"]
        chance = 1 / (VIEW // GRID) ** 2
    else:
        candidates = candidate_boxes(args.cue)
        chance = float(np.mean([np.mean([holds(box, s["card"]) for box in candidates]) for s in test]))

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        hits = 0
        for start in range(0, len(test), 64):
            batch = test[start : start + 64]
            enc = encode(processor, prompt, before_box, batch, with_answer=False)
            out = model.generate(**enc, max_new_tokens=24, do_sample=False)
            for s, ids in zip(batch, out[:, enc["input_ids"].shape[1] :]):
                answer = read_answer(tokenizer.decode(ids, skip_special_tokens=True), args.readout)
                if args.readout == "cell":
                    hits += answer == s["cell"]
                elif answer is not None:  # not a box: a miss
                    hits += holds(answer, s["card"])
        model.train()
        return hits / len(test)

    figure = "box_holds_card" if args.readout == "box" else "cell_right"
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    rng, curve, start = np.random.default_rng(args.seed), [], time.perf_counter()
    for step in range(1, args.steps + 1):
        warmup = min(1.0, step / 20)
        for group in optimizer.param_groups:
            group["lr"] = args.learning_rate * warmup * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        batch = [train[i] for i in rng.choice(len(train), args.batch_size, replace=False)]
        loss = model(**encode(processor, prompt, before_box, batch, with_answer=True)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % args.eval_every == 0 or step == args.steps:
            curve.append({"step": step, "loss": round(loss.item(), 4), figure: evaluate()})
            print(json.dumps(curve[-1] | {"seconds": round(time.perf_counter() - start)}), flush=True)
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "chance": chance}
    result["curve"] = curve
    print(json.dumps({"chance": round(chance, 3), "final": curve[-1][figure]}))
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
