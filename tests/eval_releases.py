"""Benchmark files in their release layouts for issue 64's tests (shared by tests/test_eval_robustness.py and
tests/test_eval_runs.py)."""

import json
from pathlib import Path

from PIL import Image

VSTAR_SUFFIX = "Answer with the option's letter from the given choices directly."


def write_vstar_release(root: Path, questions: int = 8, size: tuple[int, int] = (64, 48)) -> Path:
    """craigwu/vstar_bench's layout (test_questions.jsonl, <category>/<image>.jpg and its .json annotation) with its
    questions in the annotations' option order: every label A, the right option `colour<i>` first (penghao-wu/vstar
    issue 8; the released test_questions.jsonl is shuffled, DeepEyes PR 66): what "auto" shuffles. The target box of
    an even question at x, y 40-60, of an odd one at 0-10."""
    lines = []
    for qid in range(questions):
        rel = f"direct_attributes/sa_{qid}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (qid * 20 % 256, 0, 0)).save(root / rel)
        options = [f"colour{qid}", "blue", "green", "white"]
        annotation = {
            "question": "What colour?",
            "options": options,
            "target_object": ["cup"],
            "bbox": [[40, 40, 20, 20] if qid % 2 == 0 else [0, 0, 10, 10]],
        }
        (root / rel).with_suffix(".json").write_text(json.dumps(annotation))
        letters = "\n".join(f"({chr(65 + i)}) {option}" for i, option in enumerate(options))
        record = {"image": rel, "text": f"What colour?\n{letters}\n{VSTAR_SUFFIX}", "category": "direct_attributes",
                  "question_id": qid, "label": "A"}  # fmt: skip
        lines.append(json.dumps(record))
    (root / "test_questions.jsonl").write_text("\n".join(lines) + "\n")
    return root
