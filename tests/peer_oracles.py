"""Test-only oracles: transcriptions of the published pipelines' scoring code, statement for statement, that the repo's
own rules (evaluation/metrics.py, rewards/deepeyes.py) are held to. Nothing in production imports this module.

Each function names the repository, file and commit it was transcribed from. What was left out is said where it is
left out: network clients (a `judge` callable from prompt to reply stands in for DeepEyes' OpenAI client), logging,
and aggregation, which the tests do not compare. Reading a file anew, check the commit first: code moves.
"""

from __future__ import annotations

import copy as cp
import re
import string
from collections.abc import Callable


# ---------------------------------------------------------------------------------------- VLMEvalKit's can_infer
def lmms_eval_hrbench_can_infer(answer, choices):
    """EvolvingLMMs-Lab/lmms-eval `lmms_eval/tasks/hrbench/hrbench_evals.py` (commit 75571cf), `HRBenchEval.can_infer`
    with `can_infer_option` and `can_infer_text`: VLMEvalKit's `can_infer` as lmms-eval's HR-Bench task copies it.
    `choices` is {letter: option text}. The VERBOSE branch (off unless the environment sets VERBOSE) is left out."""

    def can_infer_option(answer, choices):
        if "Failed to obtain answer via API" in answer:
            return False

        reject_to_answer = [
            "Sorry, I can't help with images of people yet.",
            "I can't process this file.",
            "I'm sorry, but without the image provided",
            "Cannot determine the answer",
        ]
        for err in reject_to_answer:
            if err in answer:
                return "Z"

        def count_choice(splits, choices, prefix="", suffix=""):
            cnt = 0
            for c in choices:
                if prefix + c + suffix in splits:
                    cnt += 1
            return cnt

        answer_mod = cp.copy(answer)
        chars = ".()[],:;!*#{}"
        for c in chars:
            answer_mod = answer_mod.replace(c, " ")

        splits = [x.strip() for x in answer_mod.split()]
        count = count_choice(splits, choices)

        if count == 1:
            for ch in choices:
                if ch in splits:
                    return ch
        elif count == 0 and count_choice(splits, {"Z", ""}) == 1:
            return "Z"
        return False

    def can_infer_text(answer, choices):
        answer = answer.lower()
        assert isinstance(choices, dict)
        for k in choices:
            assert k in string.ascii_uppercase
            choices[k] = str(choices[k]).lower()
        cands = []
        for k in choices:
            if choices[k] in answer:
                cands.append(k)
        if len(cands) == 1:
            return cands[0]
        return False

    answer = str(answer)
    copt = can_infer_option(answer, choices)
    return copt if copt else can_infer_text(answer, dict(choices))


# ------------------------------------------------------------------------------------------------ DeepEyes' eval
def deepeyes_eval_pred_ans(response_message):
    """Visual-Agent/DeepEyes `eval/eval_vstar.py` and `eval/eval_hrbench.py` (commit cc3ff4d), end of `process`: the
    text of the *first* `<answer>` block when the last turn has both tags, else the whole last turn."""
    if "</answer>" in response_message and "<answer>" in response_message:
        output_text = response_message.split("<answer>")[1].split("</answer>")[0].strip()
    else:
        output_text = response_message
    return output_text


def _deepeyes_read_judgement(response):
    """The reply reading shared by DeepEyes' judge scripts and `vl_agent.py` (`print` of warnings left out)."""
    if "Judgement:" in response:
        response = response.split("Judgement:")[-1].strip()
        if "1" in response:
            acc_reward = 1.0
        elif "0" in response:
            acc_reward = 0.0
        else:
            acc_reward = 0.0
    else:
        if response == "1":
            acc_reward = 1.0
        elif response == "0":
            acc_reward = 0.0
        else:
            acc_reward = 0.0
    return acc_reward


def deepeyes_vstar_acc(pred_ans, choice, answer, question, judge: Callable[[str, str, str], str]):
    """Visual-Agent/DeepEyes `eval/judge_result.py` (commit cc3ff4d), `process`: `choice` is the correct option's
    letter (`answer_choice`), `answer` its text. `judge(pred_ans, standard_answer, question)` stands in for the chat
    request with `get_prompt` (system "You are a helpful assistant.", temperature 0); the ERROR counter is left out."""
    answer = f"{choice}. {answer}"

    if "\\boxed" in pred_ans:
        pred_ans = pred_ans.split("\\boxed{")[1].split("}")[0]

    # rule base check
    acc_reward = 0.0
    if len(pred_ans) == 1:
        if pred_ans == choice:  #'A':
            acc_reward = 1.0
        else:
            acc_reward = 0.0
    elif len(pred_ans) == 2 and "." in pred_ans:
        if choice in pred_ans:  #'A' in pred_ans:
            acc_reward = 1.0
        else:
            acc_reward = 0.0
    elif answer in pred_ans:
        acc_reward = 1.0
    else:
        response = judge(pred_ans, answer, question).strip()
        acc_reward = _deepeyes_read_judgement(response)
    return acc_reward


def deepeyes_hrbench_acc(pred_ans, answer, answer_str, question, judge: Callable[[str, str, str], str]):
    """Visual-Agent/DeepEyes `eval/judge_result_hrbench.py` (commit cc3ff4d), `process`: `answer` is the letter,
    `answer_str` the option's text; the judge is shown the letter alone as the standard answer."""
    if "\\boxed" in pred_ans:
        pred_ans = pred_ans.split("\\boxed{")[1].split("}")[0]

    # rule base check
    acc_reward = 0.0
    if len(pred_ans) == 1:
        if pred_ans == answer:
            acc_reward = 1.0
        else:
            acc_reward = 0.0
    elif len(pred_ans) == 2 and "." in pred_ans:
        if answer in pred_ans:
            acc_reward = 1.0
        else:
            acc_reward = 0.0
    elif answer_str in pred_ans:
        acc_reward = 1.0
    else:
        response = judge(pred_ans, answer, question).strip()
        acc_reward = _deepeyes_read_judgement(response)
    return acc_reward


# ------------------------------------------------------------------------------------------------- MME-RealWorld
def mme_official_extract(s, choices):
    """yfzhang114/MME-RealWorld `evaluation/eval_your_results.py` (commit 87096fc), `extract_characters_regex`, as
    written: the list lacks two commas, so Python joins four of its prefixes into two. `choices` is the question's
    `Answer choices` ("(A) text", ...); the script scores `ground_truth == text`."""
    s = s.strip()
    answer_prefixes = [
        "The best answer is",
        "The correct answer is",
        "The answer is",
        "The answer",
        "The best option isThe correct option is",  # noqa: ISC001 (the upstream list's missing comma)
        "Best answer:Best option:",  # noqa: ISC001 (likewise)
    ]
    for answer_prefix in answer_prefixes:
        s = s.replace(answer_prefix, "")

    if len(s.split()) > 10 and not re.search("[ABCDE]", s):
        return ""
    matches = re.search(r"[ABCDE]", s)
    if matches is None:
        for choice in choices:
            if s.lower() in choice.lower():
                return choice[1]
        return ""
    return matches[0]


def lmms_eval_mme_extract(s, choices=["(A)", "(B)", "(C)", "(D)", "(E)"]):  # noqa: B006 (upstream's signature)
    """EvolvingLMMs-Lab/lmms-eval `lmms_eval/tasks/mme_realworld/utils.py` (commit 75571cf),
    `extract_characters_regex`, called by `mme_realworld_process_results` with the default `choices`."""
    if type(s) is dict:
        s = ""
    s = s.strip()
    answer_prefixes = [
        "The best answer is",
        "The correct answer is",
        "The answer is",
        "The answer",
        "The best option is",
        "The correct option is",
        "Best answer:",
        "Best option:",
    ]
    for answer_prefix in answer_prefixes:
        s = s.replace(answer_prefix, "")

    if len(s.split()) > 10 and not re.search("[ABCDE]", s):
        return ""
    matches = re.search(r"[ABCDE]", s)
    if matches is None:
        for choice in choices:
            if s.lower() in choice.lower():
                return choice[1]
        return ""
    return matches[0]


def lmms_eval_mme_correct(pred_answer, answer):
    """lmms-eval's same file, `mme_realworld_aggregate_results`: a sample's `cnt`."""
    return pred_answer.lower() == answer.lower() or answer.lower() in pred_answer.lower()


# --------------------------------------------------------------------------------------------------- lmms-eval V*
def lmms_eval_vstar_letter(response):
    """EvolvingLMMs-Lab/lmms-eval `lmms_eval/tasks/vstar_bench/utils.py` (commit 75571cf), `extract_answer_letter`."""
    response = response.strip().upper()

    patterns = [
        r"^([A-D])\s*[\.)\]]*",  # Starts with letter
        r"(?:THE\s+)?(?:ANSWER|CHOICE|OPTION)(?:\s+IS)?[\s:]+([A-D])",  # Answer: A or The answer is A format
        r"\(([A-D])\)",  # (A) format
        r"([A-D])\s*(?:\.|\)|])",  # A. or A) or A] format
        r"(?:^|\s)([A-D])(?:\s|$)",  # Standalone letter
    ]

    for pattern in patterns:
        match = re.search(pattern, response, re.IGNORECASE)
        if match:
            return match.group(1).upper()

    letters = re.findall(r"[A-D]", response)
    if len(letters) == 1:
        return letters[0]

    if response and response[0] in "ABCD":
        return response[0]

    return None


# ----------------------------------------------------------------------------------------- DeepEyes' RL reward
def deepeyes_compute_score(predict_str, ground_truth, extra_info, judge: Callable[[str], str]):
    """Visual-Agent/DeepEyes `verl/utils/reward_score/vl_agent.py` (commit 6c5e796), `compute_score`: `judge(prompt)`
    stands in for the chat request (its client, model choice and seed left out) and gets the prompt `get_prompt`
    builds, here passed in as `extra_info["get_prompt"]` (a stand-in template: their text is not copied)."""
    is_format_error = False
    # predict_str = "<think>" + predict_str
    count_think_1 = predict_str.count("<think>")
    count_think_2 = predict_str.count("</think>")
    if count_think_1 != count_think_2:
        is_format_error = True

    count_vision_1 = predict_str.count("<|vision_start|><|image_pad|>")
    count_vision_2 = predict_str.count("<|image_pad|><|vision_end|>")
    if count_vision_1 != count_vision_2:
        is_format_error = True

    predict_no_think = predict_str.split("</think>")[-1].strip()
    count_answer_1 = predict_no_think.count("<answer>")
    count_answer_2 = predict_no_think.count("</answer>")
    if count_answer_1 != count_answer_2:
        is_format_error = True

    answer_text = predict_str.split("<answer>")[-1].split("</answer>")[0].strip()

    question_text = extra_info["question"]
    full_prompt = extra_info["get_prompt"](answer_text, ground_truth, question_text)

    response = judge(full_prompt).strip()
    acc_reward = _deepeyes_read_judgement(response)

    # Penalize for model trying to predict longer answer to hack llm-as-judge
    if len(answer_text) >= 1000:
        acc_reward = 0.0
        is_format_error = True

    tool_reward = 1.0 if count_vision_1 > 0 and acc_reward > 0.5 else 0.0
    format_reward = -1.0 if is_format_error else 0.0
    # reward 2
    return 0.8 * acc_reward + 0.2 * format_reward + 1.2 * tool_reward
