"""research/vision_tokens.py: the tokens a card covers by hand, and what the kit's vision tower hands the language
model (the token holding a card's centre, `research.card_scenes.token_cell`: tests/research/test_localization_probe.py)."""

import torch
from PIL import Image

from research import vision_tokens as vt
from research.card_scenes import token_cell
from utils.models import load_model


def test_covered_tokens_are_every_cell_the_card_overlaps():
    # 448 px scene seen at 112 px: a 28 px token cell is 112 scene pixels; the index is row-major over 4 x 4.
    # x 100-124 spans columns 0 (to 111) and 1; y 0-40 row 0 only; an end exactly on a cell's edge (224) is exclusive.
    assert vt.covered_tokens([100, 0, 124, 40]) == {0, 1}
    assert vt.covered_tokens([200, 200, 224, 224]) == {5}


def test_identical_pixels_give_identical_tokens_and_a_card_moves_its_own(tiny_kit, tiny_processor):
    model = load_model(tiny_kit["policy"], dtype=torch.float32).eval()
    blank = Image.new("RGB", (448, 448), (215, 215, 215))
    tokens = vt.image_tokens(model, tiny_processor, blank)
    assert tokens.shape[0] == 16
    # float32 through the same ops on the same patch: equal up to summation order, ~1e-7 relative per reduction; 1e-5
    # leaves room for the ~64-term sums of the tiny hidden size, far below the card's change (>1 relative).
    assert torch.cdist(tokens, tokens).max() <= 1e-5 * tokens.norm(dim=-1).mean()
    card = blank.copy()
    card.paste((0, 160, 0), (200, 100, 240, 140))  # inside token 5's cell
    delta = (vt.image_tokens(model, tiny_processor, card) - tokens).norm(dim=-1)
    assert int(delta.argmax()) == token_cell([50, 25, 60, 35])  # the card in the 112 px view: centre (55, 30), cell 5
