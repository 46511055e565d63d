"""Grounding faithfulness: did the model look where the answer is? Per benchmark category (a record's `source`), the
IoU of each valid zoom box with the row's target box (V*'s annotations, TreeBench's boxes), the share of boxes that
hit it (cover the whole target), the answers' accuracy when some box hit and when none did, and the verifier's z_t
over crops that hit and crops that missed. Definitions: docs/evaluation.md, "Grounding"."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from tools import box_contains

NO_VERIFIER = "no z_t: no call was scored by the CLIP verifier (no valid crop, or no verifier loaded)"


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of boxes `a` and `b` (x1, y1, x2, y2); 0 for boxes without area."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, width) * max(0.0, height)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _figures(records: Sequence[dict]) -> dict[str, Any]:
    calls = [(call, record) for record in records for call in record["calls"] if call["box"] is not None]
    ious = [iou(call["box"], record["target_bbox"]) for call, record in calls]
    hits = [box_contains(call["box"], record["target_bbox"]) for call, record in calls]
    looked = [any(box_contains(c["box"], r["target_bbox"]) for c in r["calls"] if c["box"]) for r in records]
    boxed = [any(c["box"] for c in r["calls"]) for r in records]
    zoomed = [r for r, has_box in zip(records, boxed) if has_box]
    hit_records = [r for r, hit in zip(records, looked) if hit]
    missed = [r for r, hit, has_box in zip(records, looked, boxed) if has_box and not hit]
    return {
        "samples": len(records),
        "boxes": len(calls),
        "mean_iou": _mean(ious),
        "best_iou_per_sample": _mean(
            [max(iou(c["box"], r["target_bbox"]) for c in r["calls"] if c["box"]) for r in zoomed]
        ),
        "hit_rate": _mean([float(hit) for hit in hits]),
        "samples_hit": len(hit_records),
        "accuracy_when_hit": _mean([float(r["correct"]) for r in hit_records]),
        "accuracy_when_missed": _mean([float(r["correct"]) for r in missed]),
    }


def grounding(records: Sequence[dict]) -> dict[str, Any] | None:
    """metrics.json's `grounding`: `_figures` over every record with a target box (`all`) and per source; None when
    no record has one. Says so when no crop carries a z_t (`z_by_hit`)."""
    targeted = [record for record in records if record.get("target_bbox")]
    if not targeted:
        return None
    groups = defaultdict(list)
    for record in targeted:
        groups[record["source"]].append(record)
    result = {"hit": "the zoom box covers the whole target box", "all": _figures(targeted)}
    result["by_source"] = {source: _figures(group) for source, group in sorted(groups.items())}
    if not z_by_hit(targeted):
        result["z_note"] = NO_VERIFIER
    return result


def z_by_hit(records: Sequence[dict]) -> dict[str, float]:
    """metrics.json's `z_by_hit`: the mean z_t (CLIP of a call's label with its crop) of the valid crops that hit the
    target (`hit`) and of those that missed (`miss`), over records with a target box; a side without a scored crop
    is left out."""
    groups: dict[str, list[float]] = {"hit": [], "miss": []}
    for record in records:
        if record.get("target_bbox"):
            for call in record["calls"]:
                if call["box"] is not None and call.get("z") is not None:
                    side = "hit" if box_contains(call["box"], record["target_bbox"]) else "miss"
                    groups[side].append(call["z"])
    return {side: sum(values) / len(values) for side, values in groups.items() if values}
