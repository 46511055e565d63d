"""Issue 64, item 4: the zoom boxes against the target boxes, by hand (IoU, hits, accuracy when the model looked
where the answer is, z_t of crops that hit and missed); and what report.html shows of items 1, 2 and 5."""

from evaluation.grounding import NO_VERIFIER, grounding, iou, z_by_hit
from evaluation.report import render_report


def call(box, z=None):
    return {"box": box, "z": z}


def record(source, target, calls, correct):
    return {"source": source, "target_bbox": target, "calls": calls, "correct": correct}


def test_iou_by_hand():
    assert iou([0, 0, 10, 10], [5, 5, 15, 15]) == 25 / 175  # 5 x 5 shared, 100 + 100 - 25
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0 and iou([0, 0, 1, 1], [2, 2, 3, 3]) == 0.0
    assert iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0  # no area


def test_grounding_per_category_by_hand():
    records = [
        # covers the target [2, 2, 4, 4] (IoU 4/100) and misses it (IoU 0): looked there, answered right
        record("vstar/direct_attributes", [2, 2, 4, 4], [call([0, 0, 10, 10], 0.3), call([5, 5, 9, 9], 0.1)], True),
        # the exact target (IoU 1, a hit), answered wrong
        record("vstar/relative_position", [1, 1, 3, 3], [call([1, 1, 3, 3], 0.5)], False),
        # zoomed, missed: answered wrong; an invalid call (no box) does not count
        record("vstar/direct_attributes", [0, 0, 2, 2], [call([4, 4, 6, 6], 0.2), call(None)], False),
        record("vstar/direct_attributes", [0, 0, 2, 2], [], True),  # no zoom: neither hit nor missed
        record("synthetic/x", None, [call([0, 0, 1, 1])], True),  # no target: not counted
    ]
    result = grounding(records)
    figures = result["all"]
    assert (figures["samples"], figures["boxes"], figures["samples_hit"]) == (4, 4, 2)
    assert figures["mean_iou"] == (4 / 100 + 0 + 1 + 0) / 4
    assert figures["best_iou_per_sample"] == (4 / 100 + 1 + 0) / 3
    assert figures["hit_rate"] == 2 / 4
    assert (figures["accuracy_when_hit"], figures["accuracy_when_missed"]) == (0.5, 0.0)
    direct = result["by_source"]["vstar/direct_attributes"]
    assert (direct["boxes"], direct["hit_rate"], direct["samples"]) == (3, 1 / 3, 3)
    assert set(result["by_source"]) == {"vstar/direct_attributes", "vstar/relative_position"}
    assert z_by_hit(records) == {"hit": (0.3 + 0.5) / 2, "miss": (0.1 + 0.2) / 2} and "z_note" not in result


def test_without_targets_or_z():
    assert grounding([record("synthetic/x", None, [call([0, 0, 1, 1])], True)]) is None
    unscored = grounding([record("vstar/x", [0, 0, 1, 1], [call([0, 0, 1, 1])], True)])
    assert unscored["z_note"] == NO_VERIFIER and z_by_hit([record("vstar/x", [0, 0, 1, 1], [], True)]) == {}


def test_the_report_shows_the_order_and_the_reply_reading_and_leaves_per_question_means_out():
    record = {
        "id": "q1#released", "source": "vstar/direct_attributes", "question": "What colour?", "prediction": None,
        "answer": "A", "correct": False, "failure": "no <answer>", "calls": [], "messages": [], "order": "released",
        "sample": 1, "correct_reply": True, "rule_reply": "letter",
    }  # fmt: skip
    page = render_report(
        [record], lambda _: None, metrics={"avg_at_k": {"score": 0.5, "question_means": {"q1": 0.5}}}, title="t"
    )
    assert "released order, sample 1" in page and "read as a whole reply: right (letter)" in page
    assert "avg_at_k / score" in page and "question_means" not in page
