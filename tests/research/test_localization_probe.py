"""research/localization_probe.py: the probe trains on the box alone, in either context, and its chance level and gold
boxes follow the repo's own box rules."""

import json

import pytest

from data.synthetic import REGIONS, region_of
from research import localization_probe as probe
from research.card_scenes import token_cell


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


def test_the_cell_readout_names_the_token_that_holds_the_card_centre_and_answers_are_read_strictly():
    # 28 px cells of the 112 px view, row-major: centre (14, 14) -> 0; (70, 42) -> column 2, row 1 -> 6; a box
    # at the view's far corner (centre 111) is the last.
    assert token_cell([0, 0, 28, 28]) == 0
    assert token_cell([60, 30, 80, 54]) == 6
    assert token_cell([110, 110, 112, 112]) == 15
    assert token_cell([50, 25, 60, 35]) == 5  # centre (55, 30): column 1, row 1
    assert token_cell([75, 105, 85, 110]) == 14  # centre (80, 107.5): column 2, row 3
    assert probe.read_answer("6 the rest", "cell") == 6
    assert probe.read_answer(' [1, 2, 3, 4], "label": "x"}', "box") == [1, 2, 3, 4]
    for text, readout in (
        ("", "cell"),
        ("six", "cell"),
        ("[1, 2, 3]", "box"),
        ('["a", 2, 3, 4]', "box"),
        ("no", "box"),
    ):
        assert probe.read_answer(text, readout) is None
    for scene in probe.scenes(4, seed=2, cue="pixels", cards=(1, 1), tint=0.0):
        x1, y1, x2, y2 = (v / 4 for v in scene["card"])  # 448 px scene, 112 px view
        assert scene["cell"] == int((y1 + y2) / 2 // 28) * 4 + int((x1 + x2) / 2 // 28)
