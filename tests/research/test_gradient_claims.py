"""`research.gradient_claims` shrunk to 16 rollouts on the tiny kit, with scripted zoom-in calls (a random policy
writes none): every estimator's replayed advantages against the same trainer computing them live on the same
rollouts, the step score vectors against the rollout's whole gradient, and the analysis and report run on it."""

import argparse

import numpy as np
import pytest
import torch
from transformers import set_seed

from mapo_trainer import MAPOTrainer
from research import gradient_claims as gc
from tiny import stages
from tiny.scripted import force_tool_calls, tool_call_turn
from tools import seen_size
from utils.diagnostics import completion_logps, policy_gradient_loss, rollout_rows, trained_token_mask
from utils.models import pixel_budget

pytestmark = pytest.mark.slow

SIDE = 768


def quadrant_turn(row: int, label: str, seen: tuple[int, int]) -> str:
    """The first call of rollout `row`: one of the four quadrants of the frame the model sees, so in each group of 4
    one rollout's crop can frame the target (a quadrant is exactly the reader's largest zoom) and the others not."""
    w, h = seen
    x, y = (row % 2) * (w // 2), (row // 2 % 2) * (h // 2)
    return tool_call_turn(label, (x, y, x + w // 2, y + h // 2))


class Scripted:
    """Scripts the policy's first turn (`quadrant_turn`) and its answer; the real generation still runs."""

    def __init__(self, *args, model, processing_class, **kwargs):
        seen = seen_size((SIDE, SIDE), pixel_budget(processing_class))
        force_tool_calls(model, processing_class.tokenizer, first_turn=lambda i, label: quadrant_turn(i, label, seen))
        super().__init__(*args, model=model, processing_class=processing_class, **kwargs)


class ScriptedRecording(Scripted, gc.RecordingTrainer):
    pass


class ScriptedLive(Scripted, MAPOTrainer):
    pass


@pytest.fixture(scope="module")
def shrunk(tiny_kit, tmp_path_factory):
    start = tmp_path_factory.mktemp("claims")
    (start / "sft").symlink_to(tiny_kit["policy"].resolve())
    (start / "clip").symlink_to(tiny_kit["clip"].resolve())
    stages.make_data(start / "data", 8, 4, min_size=SIDE, max_size=SIDE)
    args = argparse.Namespace(rollouts=16, seed=0)
    measurement, batches = gc.measure(args, start, log=lambda *_: None, recording_cls=ScriptedRecording)
    return start, measurement, batches


def test_every_estimator_replays_what_the_trainer_computes_live(shrunk, tiny_kit):
    start, measurement, batches = shrunk
    r = measurement["rollouts"]
    q_star = r.well_formed * r.seen
    assert 0 < q_star.mean() < 1, "the scripted calls must frame the target in some rollouts, not all"
    replays = measurement["replays"]
    assert not np.allclose(replays[("mapo_walk", "group")].advantages, replays[("grpo", "group")].advantages)
    # The recipe's scaling for every estimator, and `none` once: the replay path does not depend on the scaling, and
    # `analyse` checks every scalar estimator's replay under both against `mapo_advantages`.
    checked = [key for key in replays if key[1] == measurement["recipe_scaling"]] + [("grpo", "none")]
    for name, scaling in checked:
        replayed = replays[(name, scaling)]
        live = gc.build(
            start, stages.tiny_kit(), f"live-{name}", ScriptedLive, scale_rewards=scaling, **gc.ESTIMATORS[name]
        )
        values = []
        for b, batch in enumerate(batches):
            set_seed(0 * 1_000_003 + b)  # as `collect` seeds the batch
            out = live._generate_and_score_completions(batch["inputs"])
            values += gc.step_advantages(out["advantages"], gc.turns_of(out))
        np.testing.assert_allclose(replayed.advantages, values, atol=1e-6, err_msg=f"{name}, scale_rewards {scaling}")


def test_step_vectors_sum_to_the_rollouts_gradient(shrunk, tiny_kit):
    start, measurement, batches = shrunk
    r = measurement["rollouts"]
    trainer = gc.build(start, stages.tiny_kit(), "direct", ScriptedLive, **gc.ESTIMATORS["grpo"])
    set_seed(0)
    out = trainer._generate_and_score_completions(batches[0]["inputs"])
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    row = rollout_rows(out)[0]
    loss = policy_gradient_loss(completion_logps(trainer, row), torch.ones(1), trained_token_mask(row))
    whole = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]).double()
    steps = np.flatnonzero(r.step_rollout == 0)
    assert len(steps) == 2  # the scripted call, then the answer
    # |sum_k s_k|^2 from the Gram matrix equals the squared norm of the rollout's whole loss gradient
    assert r.gram[np.ix_(steps, steps)].sum() == pytest.approx(float(whole @ whole), rel=1e-4)
    assert np.allclose(r.gram, r.gram.T)


def test_the_analysis_and_report_run_on_the_shrunk_measurement(shrunk, tmp_path):
    start, measurement, _ = shrunk
    results = gc.analyse(measurement, folds=2, bootstrap=3, seed=0, log=lambda *_: None)
    assert results["rollouts"] == 16 and results["prompts"] == 4
    for entry in results["table"].values():
        assert np.isfinite(entry["cosine"]) and -1 <= entry["cosine"] <= 1
    assert results["prop1"]["moments"]["lhs"] == pytest.approx(results["prop1"]["moments"]["rhs"])
    assert results["prop2"]["cosine"]["verdict"] in ("holds", "fails", "inconclusive")
    setup = {
        "date": "today", "command": "test", "start": str(start), "sft_steps": 0, "recipe_beta": 0.4,
        "parameters": 1, "timings": {"all": 1.0}, "minutes": 0.1, "cores": 1, "gate": None, "curves_verdict": None,
    }  # fmt: skip
    report = gc.write_report(tmp_path / "experiment.md", results, setup)
    text = report.read_text()
    assert "## What it shows" in text and "Proposition 2 (a)" in text
    assert (tmp_path / "experiment" / "results.json").exists()
    assert sorted(p.name for p in (tmp_path / "experiment").glob("*.png")) == [
        "batch_size.png", "beta.png", "quality.png", "reader.png",
    ]  # fmt: skip
