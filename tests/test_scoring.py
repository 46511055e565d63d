"""Benchmark scoring (evaluation/metrics.py) held to transcriptions of the published pipelines' own code
(tests/peer_oracles.py) on adversarial answers: letters with punctuation, option text, two answer blocks, `\\boxed{}`,
think tags, empty answers, E options, refusals, long answers. Each rule either agrees with its peer's on every answer, or
disagrees on exactly the answers listed here, each with the reason (docs/evaluation.md, "Scoring")."""

import re

import pytest

from data.task import build_prompt
from evaluation.metrics import (
    DECIDING_RULES,
    SCORING_RULES,
    can_infer,
    compute_metrics,
    judge_gold,
    judge_question,
    judge_records,
    mme_choice,
    score_answer,
)
from rewards.judge import JudgeSettings
from tests.peer_oracles import (
    deepeyes_hrbench_acc,
    deepeyes_vstar_acc,
    lmms_eval_hrbench_can_infer,
    lmms_eval_mme_correct,
    lmms_eval_mme_extract,
    lmms_eval_vstar_letter,
    mme_official_extract,
)

LETTERS = "ABCD"
OPTIONS = ["red", "blue", "green", "dark green"]  # V* / HR-Bench: four options, one inside another
MME_OPTIONS = ["458", "457", "456", "455", "The image does not feature the data"]  # five, E the "none" option

# Adversarial final answers (the text inside <answer>), shared by every family below: 81 of them.
ANSWERS = [
    # letters with punctuation, markup and words around them
    "B", "B.", "(B)", "B)", "[B]", "**B**", "#B", "B!", "{B}", "B;", "'B'", '"B"', "B, blue", "Option B", "option (B)",
    "The answer is B.", "The answer is (B) blue", "The correct answer is B", "The best answer is B", "Answer: B",
    "answer: b", "B: blue", "B - blue", "B)blue", "B.blue", "blue (B)", "red (B)", "B. red", "the letter B",
    "I think it's B because the car is blue", "B\n\nExplanation: the second one is blue", "1. B",
    # lower-case letters
    "b", "(b)", "b. blue", "d. dark green",
    # option text
    "blue", "Blue.", "BLUE", "The car is blue.", "green", "dark green", "red or blue", "A car that is blue",
    # several letters
    "B or C", "A and B", "(B) (C)", "A B C D", "ABCD", "C: B",
    # \boxed{}
    "\\boxed{B}", "$\\boxed{B}$", "\\boxed{blue}", "\\boxed{b}", "\\boxed{B} or \\boxed{C}", "\\boxed{E}",
    # think tags and answer blocks inside the answer
    "<think>it is B</think>B", "<think>maybe A</think> C", "<answer>B", "A</answer><answer>B", "<think></think>",
    # E options, refusals, nothing
    "E", "(E)", "E. The image does not feature the data", "(E) none of these", "e", "Z", "Z. The car is blue",
    "None of the options",
    "Cannot determine the answer", "Cannot determine the answer, but B", "", "   ",
    # MME-RealWorld's prefixes and numbers
    "Best answer: C", "The best option is C", "Best option: (C)", "The answer is 457", "457", "Definitely (E)",
    "it could be any of the numbers shown there, hard to say really", "the image does not feature the data",
    # long answers
    "x" * 1000 + " B", "B. " + "blue " * 200,
]  # fmt: skip


def test_the_answer_set_is_big_enough_and_has_no_repeats():
    assert len(ANSWERS) >= 60 and len(set(ANSWERS)) == len(ANSWERS)


def read_by(verdict_of, golds: str) -> str | None:
    """The letter a rule read, from its verdicts against every possible gold letter (None: it read none)."""
    right = [gold for gold in golds if verdict_of(gold)]
    assert len(right) <= 1
    return right[0] if right else None


# ------------------------------------------------------------------------------------- V* and HR-Bench: can_infer
def vlmevalkit_letter(answer: str) -> str | None:
    """The option letter lmms-eval's copy of VLMEvalKit's can_infer reads in `answer`: its 'Z' and False are none."""
    read = lmms_eval_hrbench_can_infer(answer, dict(zip(LETTERS, OPTIONS)))
    return read if read in tuple(LETTERS) else None


@pytest.mark.parametrize("answer", ANSWERS)
def test_can_infer_is_vlmevalkits(answer):
    """Our `can_infer` reads what lmms-eval's HR-Bench copy of VLMEvalKit's reads, on every answer (its 'Z', a refusal
    or a lone Z token, and False both read as no option)."""
    theirs = vlmevalkit_letter(answer)
    ours, step = can_infer(answer, OPTIONS)
    assert (None if ours is None else LETTERS[ours]) == theirs
    assert step == ("none" if ours is None else step) and step in DECIDING_RULES


# Where training's rule (tried first) reads an option can_infer does not: lower-case letters, an option text that
# contains another (can_infer finds both), and the last of two \boxed{} (can_infer sees two letters).
# Where training's rule, tried first, reads an option that can_infer does not: lower-case letters; an option's text
# that holds another's ("dark green" holds "green": can_infer finds two); a leading letter, whatever follows it; the
# last of two \\boxed{} (can_infer finds two letters).
STRICT_OVER_CAN_INFER = {
    "b": "B", "(b)": "B", "d. dark green": "D", "dark green": "D", "(B) (C)": "B", "C: B": "C", "\\boxed{b}": "B",
    "\\boxed{B} or \\boxed{C}": "C",
}  # fmt: skip


@pytest.mark.parametrize("benchmark", ["vstar", "hrbench"])
def test_vstar_and_hrbench_read_what_vlmevalkit_reads_but_where_the_strict_rule_reads_more(benchmark):
    disagree = {}
    for answer in ANSWERS:
        theirs = vlmevalkit_letter(answer)
        ours = read_by(lambda gold, answer=answer: score_answer(benchmark, answer, gold, OPTIONS).correct, LETTERS)
        if ours != theirs:
            disagree[answer] = ours
            assert score_answer(benchmark, answer, ours, OPTIONS).rule in ("strict", "boxed"), answer
    assert disagree == STRICT_OVER_CAN_INFER


@pytest.mark.parametrize(
    ("answer", "rule", "failure"),
    [
        ("B", "strict", None),
        ("B. blue", "strict", None),
        ("blue", "strict", None),
        ("\\boxed{B}", "boxed", None),
        ("The answer is B.", "letter", None),
        ("**B**", "letter", None),
        ("The car is blue.", "option_text", None),
        ("red or blue", "none", "answer outside the options: 'red or blue'"),
        ("", "empty", "empty <answer>"),
        (None, "no_answer", None),
    ],
)
def test_which_rule_decided_is_recorded(answer, rule, failure):
    verdict = score_answer("vstar", answer, "B", OPTIONS)
    assert (verdict.rule, verdict.failure) == (rule, failure)


def test_the_strict_verdict_stays_beside_the_published_one():
    loose = score_answer("hrbench", "The answer is B.", "B", OPTIONS)
    assert (loose.correct, loose.correct_strict) == (True, False)
    long = score_answer("vstar", "x" * 1000 + " B", "B", OPTIONS)  # training refuses 1,000+ characters, VLMEvalKit not
    assert (long.correct, long.correct_strict, long.rule) == (True, False, "letter")
    assert score_answer("vstar", "B", "B", OPTIONS).correct_strict


def test_open_answers_use_training_rule():
    verdict = score_answer("synthetic", "The Orange.", "orange", [])
    assert (verdict.correct, verdict.correct_strict, verdict.rule) == (True, True, "strict")
    assert not score_answer("deepeyes", "three", "3", []).correct


# lmms-eval's own V* rule, which our table cites: its first pattern reads a letter starting any word.
@pytest.mark.parametrize(
    ("answer", "letter"),
    [("Blue", "B"), ("Definitely C", "D"), ("A car that is blue", "A"), ("The answer is B.", "B"), ("green", None)],
)
def test_lmms_eval_vstar_reads_the_first_letter_of_a_word(answer, letter):
    assert lmms_eval_vstar_letter(answer) == letter


# ---------------------------------------------------------------------------- DeepEyes' evaluation: rule + judge
def fake_judge(prediction: str, standard: str, question: str) -> str:
    """A deterministic stand-in for DeepEyes' Qwen2.5-72B judge, the same on both sides: an answer naming option
    letters is right when it names the standard answer's letter alone; one naming none, when it holds the standard
    answer's option text as words."""
    letter, _, text = standard.partition(". ")
    named = set(re.findall(r"\b[A-D]\b", prediction))
    if named:
        right = named == {letter}
    else:
        right = bool(text) and f" {text.lower()} " in f" {re.sub(r'[^a-z ]', ' ', prediction.lower())} "
    return f"Judgement: {int(right)}"


def ours_with_judge(benchmark: str, answer: str, gold: str, monkeypatch) -> float:
    verdict = score_answer(benchmark, answer, gold, OPTIONS)
    user = build_prompt("Which colour is the car?", OPTIONS)[-1]["content"]
    record = {"source": f"{benchmark}/x", "question": user, "options": OPTIONS, "answer": gold, "prediction": answer,
              "correct": verdict.correct, "rule": verdict.rule, "failure": verdict.failure}  # fmt: skip
    settings = JudgeSettings("http://judge.invalid/v1", "j", None, 1.0, 2, "{question}\n{answer}\n{prediction}")

    def ask(settings, prompt):
        question, standard, prediction = prompt.split("\n", 2)
        assert question == "Which colour is the car?"  # the bare question, as DeepEyes shows it
        return (1.0 if fake_judge(prediction, standard, question).endswith("1") else 0.0), None

    monkeypatch.setattr("evaluation.metrics.ask_judge", ask)
    (judged,) = judge_records([record], benchmark, settings)
    return float(judged["correct"])


# Where our protocol and DeepEyes' differ on the same judge: DeepEyes compares case-sensitively and asks the judge for
# lower-case letters; its "X. text" substring accepts an answer naming two options; it reads the first \boxed{} only;
# we read option letters and texts the judge then never sees (and the judge calls a letter alone wrong). None counts
# as a rule difference to hide: each is documented in docs/evaluation.md.
# Where DeepEyes' V* protocol and ours differ on the same judge: DeepEyes compares letters case-sensitively ("b" is
# wrong without a judge, "(b)" goes to it); ours reads "dark green" as D, where DeepEyes asks the judge (which here
# accepts the word "green" for C); training's rule reads a leading letter whatever follows ("(B) (C)", "C: B"), where
# the judge sees two letters; DeepEyes unwraps the first \\boxed{}, ours the last; can_infer reads "C" in
# "<think>maybe A</think> C" (the tag glues "A" into a longer token), the judge sees two letters.
DEEPEYES_VSTAR_DIFFERS = {
    "b", "(b)", "\\boxed{b}", "d. dark green", "dark green", "(B) (C)", "C: B", "\\boxed{B} or \\boxed{C}",
    "<think>maybe A</think> C",
}  # fmt: skip


# HR-Bench (eval/judge_result_hrbench.py) differs further: any option text anywhere in the answer counts, case-
# sensitively, so "red (B)" and "B. red" are right for A, "red or blue" for A and B, "A car that is blue" and
# "Z. The car is blue" (VLMEvalKit's "no option") for B, while "Blue." goes to a judge shown only the letter.
DEEPEYES_HRBENCH_DIFFERS = DEEPEYES_VSTAR_DIFFERS | {
    "red (B)", "B. red", "red or blue", "A car that is blue", "Z. The car is blue", "Blue.", "BLUE",
}  # fmt: skip


@pytest.mark.parametrize(
    ("benchmark", "deepeyes", "expected"),
    [
        ("vstar", deepeyes_vstar_acc, DEEPEYES_VSTAR_DIFFERS),
        ("hrbench", deepeyes_hrbench_acc, DEEPEYES_HRBENCH_DIFFERS),
    ],
)
def test_deepeyes_protocol_on_one_judge(benchmark, deepeyes, expected, monkeypatch):
    """DeepEyes' scoring (`eval/judge_result*.py`) and ours with `--judge`, both asking `fake_judge`: the answers on
    which their verdicts differ, for any gold letter, are exactly the listed ones."""
    differ = set()
    for answer in ANSWERS:
        for gold in LETTERS:
            text = OPTIONS[LETTERS.index(gold)]
            theirs = deepeyes(answer, gold, text, "Which colour is the car?", fake_judge)
            if ours_with_judge(benchmark, answer, gold, monkeypatch) != theirs:
                differ.add(answer)
    assert differ == expected


def test_judge_question_and_gold_are_deepeyes():
    user = build_prompt("Which colour is the car?", OPTIONS)[-1]["content"]
    assert judge_question(user) == "Which colour is the car?"
    assert judge_question(build_prompt("Name the street.")[-1]["content"]) == "Name the street."
    assert judge_gold("vstar", "B", OPTIONS) == "B. blue"  # eval/judge_result.py: f"{choice}. {answer}"
    assert judge_gold("hrbench", "B", OPTIONS) == "B"  # eval/judge_result_hrbench.py passes the letter
    assert judge_gold("deepeyes", "a street", []) == "a street"


def test_deepeyes_hrbench_rule_reads_option_text_as_a_substring():
    """DeepEyes' HR-Bench rule (`eval/judge_result_hrbench.py`): the option text anywhere counts, "25" in "125"."""
    assert deepeyes_hrbench_acc("125", "B", "25", "How many?", fake_judge) == 1.0
    assert not score_answer("hrbench", "125", "B", ["12", "25", "5", "1"]).correct  # can_infer: "12", "25", "5", "1"


# ----------------------------------------------------------------------------------------------- MME-RealWorld
@pytest.mark.parametrize("answer", ANSWERS)
def test_mme_realworld_full_is_the_official_script(answer):
    choices = [f"({letter}) {option}" for letter, option in zip("ABCDE", MME_OPTIONS)]
    theirs = mme_official_extract(answer, choices)
    letter, rule = mme_choice(answer, MME_OPTIONS)
    assert letter == theirs and rule in DECIDING_RULES
    for gold in "ABCDE":
        verdict = score_answer("mme_realworld", answer, gold, MME_OPTIONS, source="mme_realworld/Perception/x/y")
        assert verdict.correct == (gold == theirs), gold


@pytest.mark.parametrize("answer", ANSWERS)
def test_mme_realworld_lite_is_lmms_evals(answer):
    theirs = lmms_eval_mme_extract(answer)
    letter, rule = mme_choice(answer, MME_OPTIONS, lite=True)
    assert letter == theirs and rule in DECIDING_RULES
    for gold in "ABCDE":
        verdict = score_answer("mme_realworld", answer, gold, MME_OPTIONS, source="mme_realworld_lite/Perception/x/y")
        assert verdict.correct == lmms_eval_mme_correct(theirs, gold), gold


@pytest.mark.parametrize(
    ("answer", "official", "lite", "rule"),
    [
        ("Best answer: C", "B", "C", "letter"),  # the official list glues "Best answer:" to "Best option:"
        ("The best option is C", "C", "C", "letter"),
        ("", "A", "A", "empty_read_as_A"),  # "" is in every choice
        ("457", "B", "", "option_text"),  # Lite matches "(A)"-"(E)" only
        ("(c)", "C", "C", "option_text"),
        ("Definitely (E)", "D", "D", "letter"),
        ("it could be any of the numbers shown there, hard to say really", "", "", "none"),
    ],
)
def test_mme_quirks(answer, official, lite, rule):
    assert mme_choice(answer, MME_OPTIONS) == (official, rule if official else "none")
    assert mme_choice(answer, MME_OPTIONS, lite=True)[0] == lite


# ------------------------------------------------------------------------------------------------ metrics.json
def test_metrics_count_the_deciding_rules_and_both_accuracies():
    def record(source, correct, strict, rule):
        return {"source": source, "correct": correct, "correct_strict": strict, "rule": rule, "failure": None,
                "num_turns": 1, "calls": []}  # fmt: skip

    records = [
        record("vstar/direct_attributes", True, True, "strict"),
        record("vstar/direct_attributes", True, False, "letter"),
        record("vstar/relative_position", False, False, "none"),
        record("vstar/relative_position", True, False, "letter"),
    ]
    metrics = compute_metrics(records, "vstar")
    assert (metrics["accuracy"], metrics["accuracy_strict"]) == (0.75, 0.25)
    assert metrics["decided_by"] == {"letter": 2, "none": 1, "strict": 1}
    assert metrics["scoring"] == {"can_infer": SCORING_RULES["can_infer"]}
    lite = compute_metrics([record("mme_realworld_lite/Perception/a/b", True, True, "letter")], "mme_realworld")
    assert list(lite["scoring"]) == ["mme_realworld_lite"]
    old = compute_metrics([{k: v for k, v in records[0].items() if k not in ("rule", "correct_strict")}], "vstar")
    assert (old["accuracy_strict"], old["decided_by"]) == (None, {"unrecorded": 1})  # a run from before the rules
