"""`research.gradient_claims` shrunk to 32 rollouts on the tiny kit, with scripted zoom-in calls (a random policy
writes none): every estimator's replayed advantages against the same trainer computing them live on the same
rollouts, the step score vectors against autograd through the trainer's `compute_loss`, and the analysis and report
run on it."""

import argparse

import numpy as np
import pytest
import torch
from transformers import set_seed

from mapo_trainer import MAPOTrainer
from research import gradient_claims as gc
from tests.tolerance import ADVANTAGE_TERMS, FLOAT64, HAND_TERMS, TINY_POLICY_FORWARD, approx, tolerance
from tiny import stages
from tiny.scripted import force_tool_calls, tool_call_turn
from tools import seen_size
from utils.models import pixel_budget

pytestmark = pytest.mark.slow

SIDE = 768
LIVE_BATCHES = 2  # batches each estimator is run live on (the replay path is the same for every batch)

# Float64 figures worked by hand or by a short chain of sums: HAND_TERMS rounded operations on the longest chain
# (tests/tolerance.py), of terms of order 1
FLOAT64_HAND = tolerance(FLOAT64, terms=HAND_TERMS, scale=1.0)


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
    measurement, batches = gc.measure(
        argparse.Namespace(), start, start / "sft", 32, 0, log=lambda *_: None, recording_cls=ScriptedRecording
    )
    return start, measurement, batches


def test_every_estimator_replays_what_the_trainer_computes_live(shrunk, tiny_kit):
    start, measurement, batches = shrunk
    r = measurement["rollouts"]
    q_star = r.well_formed * r.seen
    assert 0 < q_star.mean() < 1, "the scripted calls must frame the target in some rollouts, not all"
    replays = measurement["replays"]
    # the same replay code on the same rollouts: any difference is the estimator's
    assert not np.array_equal(replays[("mapo_walk", "group")].advantages, replays[("grpo", "group")].advantages)
    # The recipe's scaling for every estimator, and `none` once: the replay path does not depend on the scaling, and
    # `analyse` checks every scalar estimator's replay under both against `reference_advantages`.
    checked = [key for key in replays if key[1] == measurement["recipe_scaling"]] + [("grpo", "none")]
    live_steps = int(np.sum(r.step_rollout < LIVE_BATCHES * len(batches[0]["inputs"])))
    for name, scaling in checked:
        replayed = replays[(name, scaling)]
        live = gc.build(
            start, start / "sft", stages.tiny_kit(), f"live-{name}", ScriptedLive, scale_rewards=scaling,
            **gc.ESTIMATORS[name],
        )  # fmt: skip
        values = []
        for b, batch in enumerate(batches[:LIVE_BATCHES]):
            set_seed(0 * 1_000_003 + b)  # as `collect` seeds the batch
            out = live._generate_and_score_completions(batch["inputs"])
            values += gc.step_advantages(out["advantages"], gc.turns_of(out))
        # float32 group-normalised advantages against their float64 replay, at most 4 in size (0/1 outcome, R_sem)
        bound = tolerance(terms=ADVANTAGE_TERMS, scale=4.0)["abs"]
        np.testing.assert_allclose(replayed.advantages[:live_steps], values, rtol=0, atol=bound, err_msg=f"{name}")


def test_the_score_vectors_are_the_trainers_compute_loss_gradients(shrunk, tiny_kit):
    """Each step's score vector equals autograd through `MAPOTrainer.compute_loss` with a one-hot advantage on that
    step's tokens, over B x (gradient accumulation): TRL's own loss, not the repo's helper. The recorded Gram matrix
    holds their products."""
    start, measurement, batches = shrunk
    r = measurement["rollouts"]
    trainer = gc.build(start, start / "sft", stages.tiny_kit(), "direct", ScriptedLive, **gc.ESTIMATORS["grpo"])
    set_seed(0)
    out = trainer._generate_and_score_completions(batches[0]["inputs"])
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    vectors, counts, _ = gc.step_vectors(trainer, out)
    turns = gc.turns_of(out)
    rows = turns.shape[0]
    trainer.current_gradient_accumulation_steps = 2  # what `Trainer.train` sets; the loss divides by it
    scale = 1.0 / (rows * 2)
    first = np.flatnonzero(r.step_rollout == 0)
    assert counts[0] == len(first) == 2  # the scripted call, then the answer
    autograd = []
    for k in (1, 2):
        one_hot = torch.zeros(turns.shape)
        one_hot[0][turns[0] == k] = 1.0
        loss = trainer.compute_loss(trainer.model, dict(out, advantages=one_hot))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        autograd.append(
            torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)])
        )
        torch.testing.assert_close(autograd[-1], scale * vectors[k - 1], rtol=1e-4, atol=1e-9)
    # a rollout-level one-hot advantage (the episode advantage TRL applies) is the sum of its steps'
    loss = trainer.compute_loss(trainer.model, dict(out, advantages=torch.eye(rows)[0]))
    whole = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, allow_unused=False)])
    torch.testing.assert_close(whole, autograd[0] + autograd[1], rtol=1e-4, atol=1e-9)
    stacked = torch.stack(autograd).double() / scale
    # products of the measurement's score vectors against autograd's, each within a backward's rounding (normwise)
    gram = (stacked @ stacked.T).numpy()
    assert r.gram[np.ix_(first, first)] == approx(gram, terms=2 * TINY_POLICY_FORWARD, scale=float(np.abs(gram).max()))
    # dot products of score vectors as long as the parameters: a (float64) sum of that many products each way
    bound = tolerance(FLOAT64, terms=int(vectors[0].numel()), scale=float(np.abs(r.gram).max()))
    np.testing.assert_allclose(r.gram, r.gram.T, rtol=bound["rel"], atol=bound["abs"])


def test_the_analysis_and_report_run_on_the_shrunk_measurement(shrunk, tmp_path):
    start, measurement, _ = shrunk
    results = gc.analyse([measurement], folds=4, bootstrap=3, log=lambda *_: None)
    assert results["rollouts"] == 32 and results["prompts"] == 8
    assert results["runs"][0]["prompt_range"] == [0, 7]
    for entry in results["table"].values():
        for direction in gc.DIRECTIONS:
            figures = entry[direction]
            assert 0 <= figures["with_gradient"] <= 1
            assert np.isnan(figures["cosine"]) or -1 - 1e-9 <= figures["cosine"] * figures["with_gradient"] <= 1
    assert set(results["chain"]) == {f"{a} - {b}" for a, b in zip(gc.CHAIN, gc.CHAIN[1:])}
    for n in results["batch_sizes"]:
        assert results["prop2"]["a"]["group"][f"b{n}"]["verdict"] in ("holds", "fails", "inconclusive")
    assert results["prop1"]["mixed"]["moments"]["lhs"] == pytest.approx(
        results["prop1"]["mixed"]["moments"]["rhs"], **FLOAT64_HAND
    )
    replication = gc.analyse_replication(measurement, folds=4, bootstrap=3, batches=results["batch_sizes"])
    # the same rollouts give the replication the primary's point estimates of Proposition 2 (a)'s contrasts
    for key in ("information", "density"):
        assert replication["prop2a"]["group"]["b2"][key]["value"] == pytest.approx(
            results["prop2"]["a"]["group"]["b2"][key]["value"], nan_ok=True, **FLOAT64_HAND
        )
    setup = {
        "date": "today", "command": "test", "start": str(start), "sft_steps": 0, "parameters": 1,
        "timings": {"all": 1.0}, "minutes": 0.1, "cpu_minutes": 0.1, "load": 1.0, "cores": 1, "gate": None,
    }  # fmt: skip
    report = gc.write_report(tmp_path / "experiment.md", results, [replication], setup)
    text = report.read_text()
    assert "## What it shows" in text and "Proposition 2 (a)" in text and "## Runs" in text
    assert (tmp_path / "experiment" / "results.json").exists()
    assert sorted(p.name for p in (tmp_path / "experiment").glob("*.png")) == ["gain_vs_batch.png", "quality.png"]
