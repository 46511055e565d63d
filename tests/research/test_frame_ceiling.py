"""The frame-blind ceiling by hand: one frame, every row framed; two frames, no one box frames both."""

from research.frame_ceiling import frame_blind_ceiling
from tools.config import PixelBudget

BUDGET = PixelBudget(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28, factor=28)  # the tiny processor's


def test_one_frame_frames_every_row():
    # 768 px squares are seen at 84 x 84: every "right" row has the same gold box, [50, 22, 84, 62].
    rows = [((768, 768), [600, 300, 620, 320]), ((768, 768), [700, 450, 720, 470])]
    (cell,) = frame_blind_ceiling(rows, BUDGET, margin=6).values()
    assert cell == {"rows": 2, "frames": [(84, 84)], "best_box": [50, 22, 84, 62], "framed": 2}


def test_two_frames_one_box_frames_one_row():
    # "right" in a landscape 896 x 672 (seen 112 x 84) and a portrait 672 x 896 (seen 84 x 112). The landscape's box
    # [68, 22, 112, 62] clamps to x 68-84 in the portrait frame, original x 544-672: the portrait target at x 460
    # is left of it. The portrait's box [50, 31, 84, 80] is original x 400-672 in the landscape: its target at x 800
    # is right of it. So a policy that cannot tell the frames apart frames one row of the two.
    rows = [((896, 672), [800, 320, 820, 340]), ((672, 896), [460, 420, 480, 440])]
    cells = frame_blind_ceiling(rows, BUDGET, margin=6)
    assert list(cells) == ["right"]
    assert cells["right"]["frames"] == [(84, 112), (112, 84)]
    assert cells["right"]["framed"] == 1
