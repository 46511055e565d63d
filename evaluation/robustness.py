"""What an evaluation's headline is worth: Avg@k over `samples` sampled rollouts per question with a bootstrap
interval over questions, and the answer-order check (each question also shown with its options shuffled by a fixed
seed; the share of verdicts that flip between orders). Definitions and sources: docs/evaluation.md, "Avg@k and
intervals" and "Answer order".

An evaluation's unit is a `Unit`: one row of the benchmark, in one option order, drawn once (sample j of k). A run of
k samples, or with the options shuffled, records one `samples.jsonl` line per unit, its `id` the row's id with the
order and the sample appended (`unit_id`); a greedy run in the released order keeps the row ids as they were."""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from data.task import OPTION_LETTERS, parse_choice

RELEASED, SHUFFLED = "released", "shuffled"
# A benchmark whose files, as read, put every question's right option under one letter is shuffled by default (seed
# AUTO_SEED) and evaluated in the read order beside: V*'s per-image annotations list the right option first
# (penghao-wu/vstar issue 8; DeepEyes' eval/eval_vstar.py reads them, saves `answer = anno['options'][0]` and its
# judge scores against "A": DeepEyes PR 66 measured 89.0 and 91.6 so against 84.3 and 85.9 shuffled), while its
# test_questions.jsonl, which `data.benchmarks` reads, lists them shuffled (PR 66): decided from the rows, not the name.
AUTO_SEED, MIN_FIXED_ROWS = 0, 4
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, INTERVAL_LEVEL = 1000, 0, 0.95
OFF = ("off", "none", "no", "false")


@dataclass(frozen=True)
class Unit:
    """One rollout to run: dataset row `row` (id `question_id`) in option `order`, sample `sample` of k."""

    row: int
    question_id: str
    order: str
    sample: int
    id: str


def fixed_gold_letter(answers: Sequence[str], options: Sequence[Sequence[str]]) -> str | None:
    """The letter every multiple-choice row's right option sits under, when at least `MIN_FIXED_ROWS` rows have
    options and all agree; else None."""
    letters = {
        OPTION_LETTERS[parse_choice(a, o)] for a, o in zip(answers, options) if o and parse_choice(a, o) is not None
    }
    rows = sum(1 for o in options if o)
    return next(iter(letters)) if rows >= MIN_FIXED_ROWS and len(letters) == 1 else None


def shuffle_seed(setting: str | int | None, fixed_letter: str | None = None) -> int | None:
    """The seed options are shuffled with, or None for the order as read only. `setting`: "auto" (`AUTO_SEED` when
    the rows put every right option under one letter, `fixed_letter`; else no shuffling), "off", or a seed."""
    if setting is None or str(setting).strip().lower() == "auto":
        return AUTO_SEED if fixed_letter is not None else None
    text = str(setting).strip().lower()
    if text in OFF:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"shuffle_options must be 'auto', 'off' or an integer seed; got {setting!r}") from None


def check_samples(samples: int, temperature: float) -> None:
    """Refuse k > 1 samples of greedy decoding (k identical rollouts are not k samples)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if samples > 1 and temperature <= 0:
        raise ValueError(f"samples={samples} needs sampling: set temperature > 0 (Avg@k is over sampled rollouts)")


def unit_id(question_id: str, order: str, sample: int, samples: int, shuffling: bool) -> str:
    """A unit's record id: the row's id, `#released` for the released order of a shuffled run, `#s<j>` for sample j
    of k > 1."""
    suffix = "#released" if shuffling and order == RELEASED else ""
    return question_id + suffix + (f"#s{sample}" if samples > 1 else "")


def plan_units(ids: Sequence[str], selected: Sequence[int], samples: int, seed: int | None) -> list[Unit]:
    """Every unit of the selected rows: per row, its orders (shuffled first, the headline, then released) and the k
    samples of each; a ValueError if two units share an id (a row id that already ends like a unit's suffix)."""
    orders = (SHUFFLED, RELEASED) if seed is not None else (RELEASED,)
    units = [
        Unit(i, ids[i], order, j, unit_id(ids[i], order, j, samples, seed is not None))
        for i in selected
        for order in orders
        for j in range(samples)
    ]
    seen: dict[str, Unit] = {}
    for unit in units:
        if unit.id in seen:
            raise ValueError(
                f"two evaluation units share the id {unit.id!r} (rows {seen[unit.id].row} and {unit.row})"
            )
        seen[unit.id] = unit
    return units


def option_permutation(seed: int, question_id: str, n: int) -> list[int]:
    """The released indices of `n` options in their shuffled order for question `question_id`: a fixed draw of the
    seed and the id (the same on every machine, process and resume)."""
    order = list(range(n))
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return order


def reorder_user_turn(content: str, options: Sequence[str], permutation: Sequence[int]) -> str:
    """The user turn `data.task.format_question` wrote for `options`, with its option lines in `permutation`'s order
    (re-lettered); the question and the instruction after the options are kept as they are."""
    lines = content.split("\n")
    first = [f"{OPTION_LETTERS[i]}. {option}" for i, option in enumerate(options)]
    for start in range(len(lines) - len(first) + 1):
        if lines[start : start + len(first)] == first and start and lines[start - 1] == "Options:":
            shown = [f"{OPTION_LETTERS[i]}. {options[p]}" for i, p in enumerate(permutation)]
            return "\n".join(lines[:start] + shown + lines[start + len(first) :])
    raise ValueError("the user turn does not list the row's options as data.task.format_question writes them")


def unit_row(row: dict[str, Any], unit: Unit, seed: int | None) -> dict[str, Any]:
    """The row as unit `unit` shows it: in the released order as read, or with its options in `option_permutation`'s
    order, the user turn re-lettered and the gold letter following its option (`option_order`: the released index of
    each shown option). A row without options is the same in both orders (`option_order` None)."""
    options = list(row["options"])
    if unit.order == RELEASED or seed is None or not options:
        return row | {"option_order": list(range(len(options))) if options else None}
    gold = parse_choice(row["answer"], options)
    permutation = option_permutation(seed, unit.question_id, len(options))
    prompt = [dict(message) for message in row["prompt"]]
    user = max(i for i, message in enumerate(prompt) if message["role"] == "user")
    prompt[user]["content"] = reorder_user_turn(prompt[user]["content"], options, permutation)
    answer = row["answer"] if gold is None else OPTION_LETTERS[permutation.index(gold)]
    return row | {
        "prompt": prompt,
        "options": [options[p] for p in permutation],
        "answer": answer,
        "option_order": permutation,
    }


# ---------------------------------------------------------------------------------------------------- figures
def headline(benchmark: str, items: Sequence[tuple[str, float]]) -> float | None:
    """The score a benchmark's publications report from (source, value) pairs: HR-Bench the mean of its `single` and
    `cross` accuracies, every other benchmark the mean."""
    if not items:
        return None
    if benchmark != "hrbench":
        return sum(value for _, value in items) / len(items)
    groups = defaultdict(list)
    for source, value in items:
        groups[source.rsplit("/", 1)[-1]].append(value)
    parts = [sum(groups[c]) / len(groups[c]) for c in ("single", "cross") if groups[c]]
    return sum(parts) / len(parts) if parts else None


def question_means(records: Sequence[dict]) -> dict[str, tuple[str, float]]:
    """Per question (`question_id`, else `id`): its source and the mean verdict over its samples."""
    groups: dict[str, list] = defaultdict(list)
    sources = {}
    for record in records:
        qid = record.get("question_id", record["id"])
        groups[qid].append(float(record["correct"]))
        sources[qid] = record["source"]
    return {qid: (sources[qid], sum(values) / len(values)) for qid, values in groups.items()}


def bootstrap_interval(
    benchmark: str, means: dict[str, tuple[str, float]], resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED, level: float = INTERVAL_LEVEL,
) -> tuple[float, float] | None:  # fmt: skip
    """The percentile bootstrap interval of the headline over questions: `resamples` draws of as many questions with
    replacement (a fixed seed), each scored by `headline`; None without questions."""
    items = [means[qid] for qid in sorted(means)]
    if not items:
        return None
    rng = random.Random(seed)
    scores = sorted(
        score
        for score in (headline(benchmark, rng.choices(items, k=len(items))) for _ in range(resamples))
        if score is not None
    )
    tail = (1 - level) / 2
    low = scores[max(0, int(tail * len(scores)))]
    high = scores[min(len(scores) - 1, int((1 - tail) * len(scores)))]
    return low, high


def avg_at_k(benchmark: str, records: Sequence[dict], samples: int, temperature: float) -> dict[str, Any]:
    """metrics.json's `avg_at_k`: k, the temperature, the headline over per-question means (Avg@k; with k = 1 the
    accuracy), its bootstrap interval, and each question's mean (`question_means`, only for k > 1)."""
    means = question_means(records)
    interval = bootstrap_interval(benchmark, means)
    figure = {
        "k": samples,
        "temperature": temperature,
        "score": headline(benchmark, list(means.values())),
        "interval": None if interval is None else list(interval),
        "interval_level": INTERVAL_LEVEL,
        "resamples": BOOTSTRAP_RESAMPLES,
        "n_questions": len(means),
    }
    if samples > 1:
        figure["question_means"] = {qid: mean for qid, (_, mean) in sorted(means.items())}
    return figure


def order_check(benchmark: str, records: Sequence[dict], seed: int) -> dict[str, Any]:
    """metrics.json's `answer_order`: the headline in each order, where the gold option sat in each (counts by
    letter), and the share of (question, sample) pairs whose verdict differs between the orders."""
    by_order = {order: [r for r in records if r.get("order", RELEASED) == order] for order in (SHUFFLED, RELEASED)}
    verdicts = {
        order: {(r.get("question_id", r["id"]), r.get("sample", 0)): r["correct"] for r in rows}
        for order, rows in by_order.items()
    }
    pairs = sorted(set(verdicts[SHUFFLED]) & set(verdicts[RELEASED]))
    flips = [verdicts[SHUFFLED][p] != verdicts[RELEASED][p] for p in pairs]
    return {
        "seed": seed,
        "shuffled": headline(benchmark, [(r["source"], float(r["correct"])) for r in by_order[SHUFFLED]]),
        "released": headline(benchmark, [(r["source"], float(r["correct"])) for r in by_order[RELEASED]]),
        "gold_letter": {order: _gold_letters(rows) for order, rows in by_order.items()},
        "pairs": len(pairs),
        "flip_rate": sum(flips) / len(flips) if flips else None,
        "right_only_released": sum(verdicts[RELEASED][p] and not verdicts[SHUFFLED][p] for p in pairs),
        "right_only_shuffled": sum(verdicts[SHUFFLED][p] and not verdicts[RELEASED][p] for p in pairs),
    }


def _gold_letters(records: Sequence[dict]) -> dict[str, int]:
    """How many questions (with options) have their right option under each letter (once each, whatever k)."""
    letters = {r.get("question_id", r["id"]): r["answer"] for r in records if r["options"]}
    counts: dict[str, int] = defaultdict(int)
    for letter in letters.values():
        counts[letter] += 1
    return dict(sorted(counts.items()))


def draw_seed(seed: int, first_unit: str) -> int:
    """The seed a sampled batch is drawn with: fixed by the run's seed and the id of the batch's first unit."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{first_unit}".encode()).digest()[:4], "big")
