"""research/localization_probe.py: the probe trains on the box alone, in either context, and its chance level and gold
boxes follow the repo's own box rules."""

import json

import pytest

from data.synthetic import REGIONS, region_of
from research import localization_probe as probe


@pytest.mark.parametrize("context", ["bare", "chat"])
def test_the_loss_covers_exactly_the_box_and_its_end_token(tiny_processor, context):
    prompt = probe.chat_prompt(tiny_processor) if context == "chat" else probe.PROMPT
    before_box = " " if context == "chat" else ""
    batch = probe.scenes(2, seed=0, cue="words", cards=(2, 3), tint=0.0)
    enc = probe.encode(tiny_processor, prompt, before_box, batch, with_answer=True)
    for row, scene in enumerate(batch):
        trained = enc["labels"][row][enc["labels"][row] != -100]
        text = tiny_processor.tokenizer.decode(trained)
        assert text == f"{before_box}{json.dumps(scene['gold'])}<|im_end|>"
    if context == "chat":  # the real prompt: system prompt, tool schema and the gold thought before the box
        assert '"bbox_2d":' in prompt and "# Tools" in prompt and len(enc["input_ids"][0]) > 500


def test_gold_boxes_hold_the_card_and_chance_counts_the_candidates():
    for cue, count in (("pixels", 16), ("words", 9)):
        assert len({tuple(box) for box in probe.candidate_boxes(cue)}) == count
        for scene in probe.scenes(8, seed=1, cue=cue, cards=(1, 3), tint=30.0):
            assert probe.holds(scene["gold"], scene["card"])
            if cue == "words":  # the question names the cell of the gold box
                named = scene["question"].split("Look in the ")[1].removesuffix(" of the image.")
                assert REGIONS[region_of(scene["gold"], 112, 112)] == named
            else:
                assert "Look in" not in scene["question"]
