"""Training the tiny CLIP verifier: it learns (loss falls, held-out retrieval far above chance on a small label set),
is reproducible in steps mode, and is saved so that `models.load_clip` restores it."""

import json

import numpy as np
import pytest
import torch

from clip_training import METRICS_NAME, class_label, label_classes, render_crops, train_clip
from models import load_clip

SMALL = {"colours": ("red", "blue", "green"), "shapes": ("circle", "square"), "words": ("CAT", "SUN")}  # 9 labels


@pytest.fixture(autouse=True)
def one_thread():
    """Contended CPUs (CI, shared machines) make two threads far slower than one on these tiny matrices."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_batches_hold_each_label_once():
    classes = label_classes(**SMALL)
    labels = [class_label(*c) for c in classes]
    assert len(set(labels)) == len(labels) == 9 and labels[-1] == "an empty background"
    crops = render_crops(classes, np.random.default_rng(0))
    assert len(crops) == len(classes) and all(crop.mode == "RGB" for crop in crops)


def test_training_learns_the_labels_and_saves_a_loadable_clip(tiny_kit, tmp_path):
    metrics = train_clip(tmp_path, init=tiny_kit["clip"], steps=100, eval_rounds=5, **SMALL)
    assert metrics["steps"] == 100 and metrics["final_loss"] < 0.5 * metrics["initial_loss"]
    assert metrics["top1_colour_shape"] >= 0.8  # chance: 1 in 9
    assert json.loads((tmp_path / METRICS_NAME).read_text()) == metrics
    trained, _, _ = load_clip(tmp_path)
    kit, _, _ = load_clip(tiny_kit["clip"])
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), kit.state_dict().values()))


def test_steps_mode_is_reproducible(tiny_kit, tmp_path):
    runs = [train_clip(tmp_path / str(i), init=tiny_kit["clip"], steps=3, eval_rounds=1, **SMALL) for i in range(2)]
    assert runs[0] | {"seconds": 0} == runs[1] | {"seconds": 0}
    first, second = (load_clip(tmp_path / str(i))[0].state_dict() for i in range(2))
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_time_budget_mode_stops_on_time(tiny_kit, tmp_path):
    metrics = train_clip(tmp_path, init=tiny_kit["clip"], seconds=1.0, eval_rounds=1, **SMALL)
    assert metrics["steps"] >= 1 and metrics["seconds"] < 5
