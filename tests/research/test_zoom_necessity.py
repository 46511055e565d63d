"""research/zoom_necessity.py: the `crop` view holds exactly what the gold zoom-in call shows the policy. Its SFT,
evaluation and chance levels are the demo's own stages, tested in tests/test_demo.py."""

import numpy as np
from PIL import ImageChops

from data.synthetic import build_synthetic
from data.trajectories import plan_calls
from research import zoom_necessity
from tools import ToolConfig, make_environment_factory
from utils.models import load_processor, pixel_budget


def test_the_crop_view_is_the_gold_calls_crop(tiny_kit):
    rows = build_synthetic(3, min_size=600, max_size=900, question_types=["shape", "text", "count"])
    cropped = zoom_necessity.gold_crops(rows, tiny_kit["policy"])
    make_env = make_environment_factory(ToolConfig(), pixel_budget(load_processor(tiny_kit["policy"])))
    for row, view in zip(rows, cropped):
        env = make_env()
        (call,) = plan_calls(row, row["target_label"], env, 1, np.random.default_rng(0))
        env.image_zoom_in_tool(**call)
        crop = env.calls[-1].crop
        assert view["image"].size == crop.size and ImageChops.difference(view["image"], crop).getbbox() is None
        assert view["target_bbox"] == [0, 0, crop.width, crop.height]
        assert (view["prompt"], view["answer"], view["options"]) == (row["prompt"], row["answer"], row["options"])
        assert view["image"].size != row["image"].size  # the crop, not the scene
