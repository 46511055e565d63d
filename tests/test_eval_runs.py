"""Issue 64 end to end: one evaluation of the tiny policy (turns scripted) on the synthetic set with k = 2 sampled
rollouts per question, its options shuffled by seed 3 beside the released order, and half its answers given without
<answer> tags; every figure of metrics.json recomputed by hand from samples.jsonl; then its resume and its refusals."""

import json

import pytest

from configs import EvalArguments
from data.synthetic import build_synthetic
from data.task import OPTION_LETTERS, parse_choice
from evaluation import run as evaluation_run
from evaluation.grounding import iou
from evaluation.robustness import fixed_gold_letter
from evaluation.run import read_samples, run_evaluation
from tests.eval_releases import write_vstar_release
from tests.tolerance import FLOAT64, approx
from tiny.scripted import answer_turn, force_tool_calls
from tools import ToolConfig, box_contains
from utils.models import load_processor


def untagged_or_tagged(i: int) -> str:
    """Even rows of a batch answer "A" inside <answer>, odd ones write "It is A." with no tags."""
    return answer_turn(i) if i % 2 == 0 else "It is A.<|im_end|>"


def eval_args(tiny_kit, data_path, output_dir, **overrides):
    fields = dict(
        model_name_or_path=str(tiny_kit["policy"]), benchmark="synthetic", data_path=str(data_path),
        output_dir=str(output_dir), max_completion_length=320, max_tool_calling_iterations=2, batch_size=4,
        device="cpu", samples=2, temperature=1.0, shuffle_options="3",
    )  # fmt: skip
    return EvalArguments(**(fields | overrides)), ToolConfig(clip_model=str(tiny_kit["clip"]))


@pytest.fixture(scope="module")
def sampled_run(tiny_kit, synthetic_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("avgk")
    original = evaluation_run.load_model

    def load_model(name_or_path, **kwargs):
        model = original(name_or_path, **kwargs)
        force_tool_calls(model, load_processor(name_or_path).tokenizer, answer=untagged_or_tagged)
        return model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation_run, "load_model", load_model)
        metrics = run_evaluation(*eval_args(tiny_kit, synthetic_dir, output_dir))
    return metrics, output_dir, read_samples(output_dir / "samples.jsonl")


def test_every_question_runs_k_times_in_both_orders(sampled_run):
    metrics, _, records = sampled_run
    assert len(records) == 16 and len({r["id"] for r in records}) == 16  # 4 questions x 2 orders x 2 samples
    assert {(r["order"], r["sample"]) for r in records} == {(o, j) for o in ("shuffled", "released") for j in (0, 1)}
    mc = [r for r in records if r["options"]]
    assert mc, "the synthetic set's multiple-choice half"
    released_gold = {
        r["question_id"]: r["options"][parse_choice(r["answer"], r["options"])] for r in mc if r["order"] == "released"
    }
    released_options = {r["question_id"]: r["options"] for r in mc if r["order"] == "released"}
    for record in mc:
        shown_gold = record["options"][OPTION_LETTERS.index(record["answer"])]
        assert shown_gold == released_gold[record["question_id"]]  # the gold letter followed its option
        assert record["options"] == [released_options[record["question_id"]][p] for p in record["option_order"]]


def test_avg_at_k_and_its_interval_from_the_records(sampled_run):
    metrics, _, records = sampled_run
    shuffled = [r for r in records if r["order"] == "shuffled"]
    means = {}
    for r in shuffled:
        means.setdefault(r["question_id"], []).append(float(r["correct"]))
    score = sum(sum(v) / len(v) for v in means.values()) / len(means)
    figure = metrics["avg_at_k"]
    assert (figure["k"], figure["temperature"], figure["n_questions"]) == (2, 1.0, 4)
    assert figure["score"] == score and metrics["accuracy"] == score and metrics["n"] == 8
    assert figure["question_means"] == {q: sum(v) / len(v) for q, v in sorted(means.items())}
    low, high = figure["interval"]
    assert min(figure["question_means"].values()) <= low <= score <= high <= max(figure["question_means"].values())


def test_the_released_order_and_the_flips_from_the_records(sampled_run):
    metrics, _, records = sampled_run
    verdicts = {(r["question_id"], r["sample"], r["order"]): r["correct"] for r in records}
    pairs = {(q, j) for q, j, _ in verdicts}
    flips = sum(verdicts[(q, j, "shuffled")] != verdicts[(q, j, "released")] for q, j in pairs)
    order = metrics["answer_order"]
    assert order["seed"] == 3 and order["pairs"] == 8 and order["flip_rate"] == flips / 8
    released = [float(r["correct"]) for r in records if r["order"] == "released"]
    assert order["released"] == sum(released) / len(released)
    # the scripted model always answers A: right exactly where the shown gold letter is A
    for r in records:
        if r["options"]:
            assert r["correct_reply"] == (r["answer"] == "A")


def test_replies_without_tags_are_read_whole_beside_ours(sampled_run):
    metrics, _, records = sampled_run
    untagged = [r for r in records if r["prediction"] is None]
    assert untagged and all(r["rule"] == "no_answer" and not r["correct"] for r in untagged)
    assert {r["rule_reply"] for r in untagged if r["options"]} == {"letter"}  # "It is A." holds the letter A
    shuffled = [r for r in records if r["order"] == "shuffled"]
    assert metrics["accuracy_reply"] == sum(float(r["correct_reply"]) for r in shuffled) / len(shuffled)
    assert sum(metrics["decided_by_reply"].values()) == 8


def test_grounding_against_the_synthetic_targets(sampled_run):
    metrics, output_dir, records = sampled_run
    shuffled = [r for r in records if r["order"] == "shuffled"]
    boxes = [(c["box"], r["target_bbox"]) for r in shuffled for c in r["calls"] if c["box"]]
    figures = metrics["grounding"]["all"]
    assert figures["boxes"] == len(boxes) > 0
    # the same float64 IoUs on both sides; only the sum's order and the division may differ
    assert figures["mean_iou"] == approx(sum(iou(b, t) for b, t in boxes) / len(boxes), FLOAT64, terms=len(boxes) + 1)
    assert figures["hit_rate"] == sum(box_contains(b, t) for b, t in boxes) / len(boxes)
    assert set(metrics["grounding"]["by_source"]) == {r["source"] for r in shuffled}
    z_split = json.loads((output_dir / "grounding_z.json").read_text())["z_by_hit"]
    scored = [(c["z"], box_contains(c["box"], r["target_bbox"])) for r in shuffled for c in r["calls"] if c["box"]]
    for side, hit in (("hit", True), ("miss", False)):
        zs = [z for z, h in scored if h == hit]
        assert z_split.get(side) == (approx(sum(zs) / len(zs), FLOAT64, terms=len(zs) + 1) if zs else None)


def test_auto_leaves_the_synthetic_set_as_read(sampled_run):
    """The synthetic set draws its options shuffled: "auto" does not shuffle it (this run names seed 3)."""
    metrics, _, _ = sampled_run
    assert metrics["answer_order"]["why"] == "--shuffle_options 3"
    rows = build_synthetic(12, seed=0, split="test", min_size=448, max_size=640)
    assert sum(1 for o in rows["options"] if o) >= 4 and fixed_gold_letter(rows["answer"], rows["options"]) is None


def test_a_resumed_run_adds_nothing_and_a_changed_order_is_refused(tiny_kit, synthetic_dir, sampled_run):
    metrics, output_dir, records = sampled_run
    again = run_evaluation(*eval_args(tiny_kit, synthetic_dir, output_dir))  # every unit recorded: no model loads
    assert again == metrics and len(read_samples(output_dir / "samples.jsonl")) == len(records)
    with pytest.raises(ValueError, match="option_shuffle_seed"):
        run_evaluation(*eval_args(tiny_kit, synthetic_dir, output_dir, shuffle_options="off"))
    with pytest.raises(ValueError, match="samples=2 needs sampling"):
        run_evaluation(*eval_args(tiny_kit, synthetic_dir, output_dir, temperature=0.0))


def test_vstar_in_its_release_layout_k_samples_shuffled_by_default(tiny_kit, tmp_path):
    """V*'s release layout (every right option first), k = 2, `shuffle_options` left at auto: every question in both
    orders, its gold letter all A as released; Avg@k, the reply reading and the grounding from the annotations'
    boxes, each recomputed from samples.jsonl (even questions' targets inside the scripted zoom, odd ones outside)."""
    root = write_vstar_release(tmp_path / "vstar_bench", questions=4, size=(448, 336))
    original = evaluation_run.load_model

    def load_model(name_or_path, **kwargs):
        model = original(name_or_path, **kwargs)
        force_tool_calls(model, load_processor(name_or_path).tokenizer, answer=untagged_or_tagged)
        return model

    args = eval_args(tiny_kit, root, tmp_path / "run", benchmark="vstar", shuffle_options="auto")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation_run, "load_model", load_model)
        metrics = run_evaluation(*args)
    records = read_samples(tmp_path / "run" / "samples.jsonl")
    assert len(records) == 16 and metrics["n"] == 8  # 4 questions x 2 orders x 2 samples; the headline's 8
    order = metrics["answer_order"]
    assert order["seed"] == 0 and order["gold_letter"]["released"] == {"A": 4}
    assert order["why"] == "auto: every multiple-choice row's right option is A as read"
    assert order["released"] == 0.5  # "A" is right on every released question, tagged on one sample of two
    shuffled = [r for r in records if r["order"] == "shuffled"]
    assert metrics["avg_at_k"]["score"] == sum(r["correct"] for r in shuffled) / 8
    assert metrics["accuracy_reply"] == sum(r["answer"] == "A" for r in shuffled) / 8  # tag-less "It is A." read
    boxes = [(c["box"], r["target_bbox"]) for r in shuffled for c in r["calls"] if c["box"]]
    hits = [box_contains(b, t) for b, t in boxes]
    figures = metrics["grounding"]["by_source"]["vstar/direct_attributes"]
    assert figures["boxes"] == len(boxes) == 8 and figures["hit_rate"] == sum(hits) / 8
    assert 0 < sum(hits) < 8  # the scripted zoom covers the even questions' targets only
