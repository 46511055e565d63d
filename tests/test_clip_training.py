"""Training the tiny CLIP verifier on referent labels: which crops match which labels, the multi-positive loss (worked
by hand), that it learns (loss falls, held-out retrieval far above chance on a small vocabulary), that it is
reproducible in steps mode, that it is saved so that `models.load_clip` restores it, and that it fits crops to its input
as the RL recipe does."""

import json
import math

import numpy as np
import pytest
import torch

import tiny.clip
from tests.tolerance import approx
from tiny import stages
from tiny.clip import (
    METRICS_NAME,
    Referent,
    make_batch,
    multi_positive_loss,
    referents,
    train_clip,
    warmup_cosine,
)
from utils.models import load_clip

SMALL = {"colours": ("red", "blue", "green"), "shapes": ("circle", "square"), "words": ("CAT", "SUN")}


@pytest.fixture(autouse=True)
def one_thread():
    """Contended CPUs (CI, shared machines) make two threads far slower than one on these tiny matrices."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_referent_matches_the_crops_that_show_it():
    diamond, green = Referent("shape", shape="diamond"), Referent("colour", colour="green")
    assert diamond.label == "the diamond" and green.label == "the green object"
    assert diamond.matches([("diamond", "red")]) and green.matches([("star", "green")])
    assert not diamond.matches([("star", "red")]) and not green.matches([("CAT", None)])
    pair = Referent("pair", "star", "red", Referent("single", "circle", "blue"))
    assert pair.label == "the red star and the blue circle"
    assert pair.matches([("circle", "blue"), ("star", "red")]) and not pair.matches([("star", "red")])
    sign = Referent("sign")
    assert sign.label == "the sign" and sign.matches([("CAT", None)]) and not sign.matches([])


def test_batches_hold_each_label_once_and_know_their_positives():
    pool = referents(SMALL["colours"], SMALL["shapes"])
    batch = make_batch(pool, {"group": 2, "pair": 2}, 3, np.random.default_rng(0), **SMALL)
    assert len(set(batch.labels)) == len(batch.labels) == 2 + 3 + 1 + 2 + 2  # shapes, colours, sign, groups, pairs
    assert len(batch.crops) == len(batch.labels) + 3 and batch.kinds[-3:] == ["empty"] * 3
    assert batch.positives.shape == (len(batch.crops), len(batch.labels))
    assert batch.positives[: len(batch.labels)].diagonal().all()  # every crop shows the label it was drawn for
    # Crops drawn for no label hold only distractors, if any: a crop of bare background matches no label.
    assert not batch.positives[-3:].all(dim=1).any() and not batch.positives[-3:].any(dim=1).all()


def test_multi_positive_loss_by_hand():
    # Two crops, three labels. Crop 0 shows labels 0 and 1 (logits 0 and log 3) and not label 2 (logit 0): over labels,
    # -log((1 + 3) / (1 + 3 + 1)) = log(5/4). Crop 1 shows nothing: a negative only. Over crops, label 0 (logits 0 for
    # crop 0, log 4 for crop 1): -log(1 / 5) = log 5; label 1 (log 3, 0): -log(3 / 4) = log(4/3); label 2 has no
    # positive crop and is left out. Loss: (log(5/4) + (log 5 + log(4/3)) / 2) / 2.
    logits = torch.tensor([[0.0, math.log(3.0), 0.0], [math.log(4.0), 0.0, 5.0]])
    positives = torch.tensor([[True, True, False], [False, False, False]])
    expected = (math.log(5 / 4) + (math.log(5) + math.log(4 / 3)) / 2) / 2
    # float32 log-sum-exps over <= 3 logits, their differences (log 5 - log 4 = 0.22: condition ~14), two means
    assert multi_positive_loss(logits, positives).item() == approx(expected, terms=12, condition=14)


def test_warmup_cosine_by_hand():
    """Linear to lr over the warm-up, then lr * (1 + cos(pi * done)) / 2: half way, lr / 2; at the end, zero."""
    assert warmup_cosine(4e-3, 0.0, 0.1) == 0.0
    # float64, a few operations: relative error of a few ulp
    assert warmup_cosine(4e-3, 0.05, 0.1) == approx(2e-3 * 0.5 * (1 + math.cos(math.pi * 0.05)), torch.float64)
    assert warmup_cosine(4e-3, 0.5, 0.1) == approx(2e-3, torch.float64)  # cos(pi / 2) is 6e-17, not 0
    assert warmup_cosine(4e-3, 1.0, 0.1) == 0.0  # cos(pi) is exactly -1 in float64


def test_training_learns_the_labels_and_saves_a_loadable_clip(tiny_kit, tmp_path):
    metrics = train_clip(tmp_path, init=tiny_kit["clip"], steps=100, eval_batches=5, **SMALL)
    assert metrics["steps"] == 100 and metrics["final_loss"] < 0.5 * metrics["initial_loss"]
    assert metrics["top1_colour"] >= 0.8  # chance: 1 in 3
    assert metrics["z_pos"] > metrics["z_neg"]
    assert json.loads((tmp_path / METRICS_NAME).read_text()) == metrics
    trained, _, _ = load_clip(tmp_path)
    kit, _, _ = load_clip(tiny_kit["clip"])
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), kit.state_dict().values()))


def test_steps_mode_is_reproducible(tiny_kit, tmp_path):
    runs = [train_clip(tmp_path / str(i), init=tiny_kit["clip"], steps=3, eval_batches=1, **SMALL) for i in range(2)]
    assert runs[0] | {"seconds": 0} == runs[1] | {"seconds": 0}
    first, second = (load_clip(tmp_path / str(i))[0].state_dict() for i in range(2))
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_time_budget_mode_stops_on_time(tiny_kit, tmp_path):
    metrics = train_clip(tmp_path, init=tiny_kit["clip"], seconds=1.0, eval_batches=1, **SMALL)
    assert metrics["steps"] >= 1 and metrics["seconds"] < 5


def test_the_verifier_trains_on_crops_fitted_as_the_rl_recipe_scores_them(tiny_kit, tmp_path, monkeypatch):
    """`clip_resize` is read from the RL recipe, so the tiny CLIP learns on crops fitted to its input the way the
    trainer's verifier will fit RL's crops (not always `pad`)."""
    seen = []
    real = tiny.clip.load_clip
    monkeypatch.setattr(tiny.clip, "load_clip", lambda *args, **kwargs: seen.append(kwargs) or real(*args, **kwargs))
    recipe = tmp_path / "config_rl.yaml"
    recipe.write_text("clip_resize: squash\n", encoding="utf-8")
    metrics = stages.train_verifier(tmp_path / "clip", tiny_kit, steps=1, recipe=str(recipe))
    assert [kwargs.get("resize") for kwargs in seen] == ["squash"] and metrics["clip_resize"] == "squash"
