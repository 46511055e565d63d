"""Issue 64, items 1, 2 and 5: Avg@k with a bootstrap interval, the answer-order check (options shuffled by a fixed
seed beside the released order) and the reply-level reading beside ours; by hand on hand-made records, on the
synthetic set's rows and on V*'s layout in its annotations' order (gold always the first option)."""

import json
from dataclasses import asdict

import pytest

from configs import EvalArguments
from data.benchmarks import read_benchmark
from data.synthetic import build_synthetic
from data.task import OPTION_LETTERS, USER_SUFFIX, parse_choice
from evaluation.metrics import reply_metrics, reply_verdict
from evaluation.reproduce_time import RowMeter, records_per_row
from evaluation.reproduction import score_notes
from evaluation.robustness import (
    RELEASED,
    SHUFFLED,
    avg_at_k,
    bootstrap_interval,
    check_samples,
    fixed_gold_letter,
    headline,
    option_permutation,
    order_check,
    plan_units,
    question_means,
    shuffle_seed,
    unit_row,
)
from evaluation.run import _check_resume as check_resume
from tests.eval_releases import write_vstar_release
from tools import ToolConfig


def verdict(qid, correct, order=RELEASED, sample=0, source="vstar/direct_attributes", answer="A"):
    return {"id": f"{qid}#{order}#{sample}", "question_id": qid, "order": order, "sample": sample, "source": source,
            "correct": correct, "options": ["x", "y"], "answer": answer}  # fmt: skip


# ---------------------------------------------------------------------------------------------- settings, units
def test_auto_shuffles_where_the_rows_put_every_right_option_under_one_letter():
    four = [["a", "b"]] * 4
    assert fixed_gold_letter(["A"] * 4, four) == "A"  # V*'s annotation order: the right option first
    assert fixed_gold_letter(["A", "A", "B", "A"], four) is None  # test_questions.jsonl's: shuffled
    assert fixed_gold_letter(["A"] * 3, four[:3]) is None  # fewer than MIN_FIXED_ROWS: chance, not a layout
    assert fixed_gold_letter(["b", "b", "b", "b", "x"], [*four, []]) == "B"  # by option text; open rows aside
    assert shuffle_seed("auto", "A") == 0 and shuffle_seed("auto", None) is None
    assert shuffle_seed("off", "A") is None and shuffle_seed("7", None) == 7
    with pytest.raises(ValueError, match="shuffle_options must be 'auto', 'off' or an integer seed; got 'x'"):
        shuffle_seed("x")


def test_k_samples_need_sampling():
    check_samples(1, 0.0)
    check_samples(4, 0.7)
    with pytest.raises(ValueError, match="samples=2 needs sampling"):
        check_samples(2, 0.0)


def test_units_cover_every_order_and_sample_once():
    units = plan_units(["a", "b"], [1, 0], samples=2, seed=5)
    assert [u.id for u in units] == [
        "b#s0", "b#s1", "b#released#s0", "b#released#s1", "a#s0", "a#s1", "a#released#s0", "a#released#s1",
    ]  # fmt: skip
    assert [(u.row, u.order, u.sample) for u in units[:3]] == [(1, SHUFFLED, 0), (1, SHUFFLED, 1), (1, RELEASED, 0)]
    assert [u.id for u in plan_units(["a", "b"], [0, 1], samples=1, seed=None)] == ["a", "b"]  # ids as they were
    with pytest.raises(ValueError, match="share the id 'a#released' \\(rows 0 and 1\\)"):
        plan_units(["a", "a#released"], [0, 1], samples=1, seed=0)


def test_a_shuffled_synthetic_row_keeps_its_gold_option_and_records_the_order():
    rows = build_synthetic(4, seed=0, split="test", min_size=448, max_size=640)
    row = next(r for r in rows if r["options"])
    unit = plan_units([row["id"]], [0], samples=1, seed=3)[0]
    shown = unit_row(row, unit, seed=3)
    permutation = option_permutation(3, row["id"], len(row["options"]))
    assert shown["option_order"] == permutation and sorted(permutation) == [0, 1, 2, 3]
    assert shown["options"] == [row["options"][p] for p in permutation]
    gold = row["options"][parse_choice(row["answer"], row["options"])]
    assert shown["options"][OPTION_LETTERS.index(shown["answer"])] == gold  # the gold letter follows its option
    user = shown["prompt"][-1]["content"]
    assert [f"{letter}. {option}" for letter, option in zip(OPTION_LETTERS, shown["options"])] == user.split("\n")[
        -1 - len(permutation) : -1
    ] and user.endswith(USER_SUFFIX)
    assert row["prompt"][-1]["content"] != user or permutation == [0, 1, 2, 3]  # the read row is not changed
    released = unit_row(row, plan_units([row["id"]], [0], samples=1, seed=3)[1], seed=3)
    assert released["options"] == row["options"] and released["option_order"] == [0, 1, 2, 3]
    assert option_permutation(3, row["id"], 4) == permutation  # the same draw on every call


# ------------------------------------------------------------------------------------- V*'s release layout
@pytest.fixture
def vstar_release(tmp_path):
    return write_vstar_release(tmp_path / "vstar_bench")


def test_vstar_is_shuffled_by_default_and_the_gold_letter_moves(vstar_release):
    dataset, _ = read_benchmark("vstar", vstar_release)
    seed = shuffle_seed("auto", fixed_gold_letter(dataset["answer"], dataset["options"]))
    assert seed == 0
    units = plan_units(dataset["id"], range(len(dataset)), samples=1, seed=seed)
    shown = [unit_row(dataset[u.row], u, seed) for u in units]
    released = [r["answer"] for r, u in zip(shown, units) if u.order == RELEASED]
    shuffled = [r for r, u in zip(shown, units) if u.order == SHUFFLED]
    assert released == ["A"] * 8
    assert len({r["answer"] for r in shuffled}) > 1  # seed 0 puts the gold elsewhere for some questions
    assert all(r["options"][OPTION_LETTERS.index(r["answer"])] == f"colour{i}" for i, r in enumerate(shuffled))
    # An "always A" model scores 100% released and only where the gold stayed at A when shuffled; each flip counted.
    records = [verdict(u.question_id, r["answer"] == "A", u.order, answer=r["answer"]) for r, u in zip(shown, units)]
    check = order_check("vstar", records, seed)
    stayed = sum(r["answer"] == "A" for r in shuffled)
    assert check["released"] == 1.0 and check["shuffled"] == stayed / 8
    assert check["flip_rate"] == (8 - stayed) / 8 and check["right_only_released"] == 8 - stayed
    assert check["gold_letter"][RELEASED] == {"A": 8} and sum(check["gold_letter"][SHUFFLED].values()) == 8


# ------------------------------------------------------------------------------------------------- figures
def test_headline_is_hrbench_mean_of_categories_else_the_mean():
    items = [("hrbench_4k/single", 1.0), ("hrbench_4k/single", 0.0), ("hrbench_4k/cross", 1.0)]
    assert headline("hrbench", items) == 0.75  # (1/2 + 1) / 2
    assert headline("vstar", items) == 2 / 3


def test_avg_at_k_by_hand():
    records = [verdict("q1", True), verdict("q1", False, sample=1), verdict("q2", True), verdict("q2", True, sample=1)]
    figure = avg_at_k("vstar", records, samples=2, temperature=0.7)
    assert figure["score"] == 0.75 and figure["question_means"] == {"q1": 0.5, "q2": 1.0}  # (0.5 + 1) / 2
    assert (figure["k"], figure["temperature"], figure["n_questions"]) == (2, 0.7, 2)
    assert "question_means" not in avg_at_k("vstar", records[::2], samples=1, temperature=0.0)


def test_bootstrap_interval_by_hand():
    # Two questions scoring 0 and 1: a resample's mean is 0, 1/2 or 1 (1/4, 1/2, 1/4): the 95% interval is [0, 1].
    assert bootstrap_interval("vstar", {"a": ("vstar/x", 0.0), "b": ("vstar/x", 1.0)}) == (0.0, 1.0)
    # Every question the same: no spread.
    assert bootstrap_interval("vstar", {q: ("vstar/x", 0.5) for q in "abc"}) == (0.5, 0.5)
    assert bootstrap_interval("vstar", {}) is None
    means = question_means([verdict("q1", True), verdict("q2", False), verdict("q2", True, sample=1)])
    assert means == {"q1": ("vstar/direct_attributes", 1.0), "q2": ("vstar/direct_attributes", 0.5)}
    first = bootstrap_interval("vstar", {f"q{i}": ("vstar/x", float(i % 3 == 0)) for i in range(30)})
    assert first == bootstrap_interval("vstar", {f"q{i}": ("vstar/x", float(i % 3 == 0)) for i in range(30)})


def test_the_reproduce_table_carries_the_interval_and_the_released_order():
    metrics = {"avg_at_k": {"interval": [0.5, 0.75]}, "answer_order": {"released": 0.9, "flip_rate": 0.25}}
    assert score_notes(metrics) == " [50.0, 75.0]; released order 90.0, flips 25.0"
    assert score_notes({}) == ""


# ------------------------------------------------------------------------------------------- reply reading
def test_a_reply_without_tags_is_read_whole_beside_ours():
    mme = {"answer": "C", "options": ["a", "b", "c", "d"], "source": "mme_realworld/Perception/OCR/x"}
    reply = reply_verdict("mme_realworld", None, "I compared them. (C) fits.", mme)
    assert (reply.correct, reply.rule) == (True, "letter")  # the first capital A-E is C ("I" is not one)
    tagged = reply_verdict("mme_realworld", "C", "<think>A</think><answer>C</answer>", mme)
    assert (tagged.correct, tagged.rule) == (True, "letter")  # an <answer> block: ours
    vstar = {"answer": "B", "options": ["red", "blue"], "source": "vstar/direct_attributes"}
    assert reply_verdict("vstar", None, "so the cup is blue", vstar).rule == "option_text"
    assert reply_verdict("vstar", None, "   ", vstar).rule == "no_answer"
    records = [
        {"id": "1", "source": "vstar/x", "correct": False, "correct_strict": False, "rule": "no_answer",
         "correct_reply": True, "rule_reply": "letter", "failure": "no <answer>", "calls": [], "num_turns": 1},
        {"id": "2", "source": "vstar/x", "correct": True, "correct_strict": True, "rule": "strict",
         "correct_reply": True, "rule_reply": "strict", "failure": None, "calls": [], "num_turns": 1},
    ]  # fmt: skip
    metrics = reply_metrics(records)
    assert metrics["accuracy_reply"] == 1.0  # ours: 0.5, the tag-less right answer scoring 0
    assert metrics["decided_by_reply"] == {"letter": 1, "strict": 1} and "eval_vstar.py" in metrics["reply_rule"]


def test_the_reproduction_clock_counts_rows_not_records(tmp_path):
    """A V* evaluation shuffled by default writes 2 records a row, 2 x k with k samples: the clock's rows are rows."""
    assert records_per_row(tmp_path) == 1  # before eval_args.json
    (tmp_path / "eval_args.json").write_text(json.dumps({"samples": 3, "option_shuffle_seed": 0}))
    (tmp_path / "samples.jsonl").write_text('{"id": "x"}\n' * 13)
    assert records_per_row(tmp_path) == 6 and RowMeter(tmp_path, 10).rows() == 2
    (tmp_path / "eval_args.json").write_text(json.dumps({"samples": 1, "option_shuffle_seed": None}))
    assert RowMeter(tmp_path, 10).rows() == 13


def test_a_run_recorded_before_samples_and_shuffling_resumes_only_as_it_was(tmp_path):
    """An eval_args.json without `samples` and `option_shuffle_seed` was one greedy sample in the released order: it
    resumes unshuffled and is refused shuffled (V*'s new default), naming the field."""
    args = EvalArguments(model_name_or_path="m", benchmark="vstar", data_path=["d"], output_dir=str(tmp_path))
    tool = ToolConfig()
    record = asdict(args) | {"tool": asdict(tool)}
    for key in ("samples", "shuffle_options"):
        record.pop(key)
    (tmp_path / "eval_args.json").write_text(json.dumps(record))
    check_resume(tmp_path, args, tool, None)
    with pytest.raises(ValueError, match="'option_shuffle_seed': \\(None, 0\\)"):
        check_resume(tmp_path, args, tool, 0)
