"""What the tool adds (issue 64, item 3): `--no_tools` withholds the tools, and `tool_effect` sets that run against a
run with them, question by question."""

from __future__ import annotations

import json

import pytest

from configs import EvalArguments
from data.prompt import (
    NO_TOOLS_SENTENCE,
    NO_TOOLS_USER_SUFFIX,
    PROMPT_HEAD,
    PROMPT_TAIL,
    USER_SUFFIX,
    build_prompt,
    format_question,
    without_tools,
)
from data.synthetic import build_synthetic
from evaluation import run as evaluation_run
from evaluation.reproduction import score_table
from evaluation.run import read_samples, run_evaluation
from evaluation.tool_effect import tool_effect
from scripts import reproduce
from tests.eval_releases import write_vstar_release
from tiny.scripted import answer_turn, force_tool_calls, tool_call_turn
from tools import ToolConfig
from utils.models import load_processor


def runs(with_tools: str, without_tools: str) -> tuple[list[dict], list[dict]]:
    """Two runs over the same ids q0, q1, ... from strings of verdicts: '1' right, '0' wrong, '-' not recorded."""

    def records(verdicts: str) -> list[dict]:
        return [{"id": f"q{i}", "correct": v == "1"} for i, v in enumerate(verdicts) if v != "-"]

    return records(with_tools), records(without_tools)


def test_the_effect_counts_each_kind_of_question_by_hand():
    # q0 right both, q1 turned right, q2 turned right, q3 turned wrong, q4 wrong both, q5 only in the tools run
    effect = tool_effect(*runs("111001", "10010-"))
    assert effect["samples"] == 5
    assert (effect["turned_right"], effect["turned_wrong"]) == (2, 1)
    assert (effect["both_right"], effect["both_wrong"]) == (1, 1)
    assert (effect["only_with_tools_run"], effect["only_without_tools_run"]) == (1, 0)
    assert effect["turned_right_ids"] == ["q1", "q2"] and effect["turned_wrong_ids"] == ["q3"]
    # with tools 3/5 right (q0, q1, q2), without 2/5 (q0, q3): +1/5 = (2 - 1) / 5
    assert effect["accuracy_with_tools"] == 3 / 5 and effect["accuracy_without_tools"] == 2 / 5
    assert effect["difference"] == 3 / 5 - 2 / 5


def test_runs_that_share_nothing_or_repeat_an_id_are_refused():
    with pytest.raises(ValueError, match="share no sample id"):
        tool_effect(*runs("11--", "--00"))
    with_tools, without_tools = runs("10", "10")
    with pytest.raises(ValueError, match="no-tools run: sample id 'q0' is recorded twice"):
        tool_effect(with_tools, without_tools + without_tools[:1])


def test_a_withheld_prompt_says_so_and_drops_the_tool_instruction():
    prompt = build_prompt("What colour is the cup?", ["red", "blue"], box_convention="relative_1000")
    system, user = without_tools(prompt)
    assert system["content"] == f"{PROMPT_HEAD} {NO_TOOLS_SENTENCE} {PROMPT_TAIL}"
    assert user["content"] == format_question("What colour is the cup?", ["red", "blue"]).replace(
        USER_SUFFIX, NO_TOOLS_USER_SUFFIX
    )
    assert "image_zoom_in_tool" not in system["content"] + user["content"]
    own = [{"role": "system", "content": "A dataset's own system turn."}, {"role": "user", "content": "Why?"}]
    assert without_tools(own) == own  # an author's turns are not ours to rewrite


def scripted(monkeypatch, first_turn=None) -> list[str]:
    """Every evaluation model in this test is the tiny policy with its turns scripted (`force_tool_calls`); returns
    the decoded inputs of each generation call."""
    original, seen = evaluation_run.load_model, []

    def load_model(name_or_path, **kwargs):
        model = original(name_or_path, **kwargs)
        tokenizer = load_processor(name_or_path).tokenizer
        force_tool_calls(model, tokenizer, first_turn=first_turn)
        forced = model.generate

        def generate(*args, **kw):
            seen.extend(tokenizer.batch_decode(kw["input_ids"]))
            return forced(*args, **kw)

        model.generate = generate
        return model

    monkeypatch.setattr(evaluation_run, "load_model", load_model)
    return seen


def eval_args(tiny_kit, data_path, output_dir, **overrides) -> tuple[EvalArguments, ToolConfig]:
    fields = dict(
        model_name_or_path=str(tiny_kit["policy"]), benchmark="synthetic", data_path=str(data_path),
        output_dir=str(output_dir), max_completion_length=320, max_tool_calling_iterations=2, batch_size=4,
        device="cpu", shuffle_options="off",
    )  # fmt: skip
    return EvalArguments(**(fields | overrides)), ToolConfig(clip_model=str(tiny_kit["clip"]))


@pytest.mark.slow
def test_no_tools_against_a_run_with_them(tiny_kit, tmp_path, monkeypatch):
    """One run with the tool (a zoom, then "A" everywhere), one without on the same rows (even rows answer "A" at
    once, odd rows call the tool anyway): the withheld call never runs, and tool_effect recounts by hand."""
    data = tmp_path / "synthetic"
    build_synthetic(4, seed=0, split="test", min_size=448, max_size=640).save_to_disk(data)
    seen_with = scripted(monkeypatch)
    run_evaluation(*eval_args(tiny_kit, data, tmp_path / "with"))
    assert all("image_zoom_in_tool" in text for text in seen_with[:4])

    def first_turn(i, label):
        return answer_turn(i) if i % 2 == 0 else tool_call_turn(label)

    seen_without = scripted(monkeypatch, first_turn)
    metrics = run_evaluation(
        *eval_args(tiny_kit, data, tmp_path / "without", no_tools=True, with_tools_run=str(tmp_path / "with"))
    )
    assert len(seen_without) == 4  # one turn per row: nothing came back to continue from
    assert all(NO_TOOLS_SENTENCE in t and "image_zoom_in_tool" not in t for t in seen_without)
    assert metrics["tools_withheld"] is True
    with_tools = read_samples(tmp_path / "with" / "samples.jsonl")
    without = {r["id"]: r for r in read_samples(tmp_path / "without" / "samples.jsonl")}
    assert all(r["calls"] == [] for r in without.values())
    ids = [r["id"] for r in with_tools]
    for i, row_id in enumerate(ids):
        if i % 2:
            assert without[row_id]["failure"] == "no <answer>: called a tool, withheld (--no_tools)"
            assert without[row_id]["correct"] is False
        else:
            assert without[row_id]["prediction"] == "A"
    effect = metrics["tool_effect"]
    right = sorted(r["id"] for r in with_tools if r["correct"] and not without[r["id"]]["correct"])
    assert effect["turned_right_ids"] == right and effect["turned_wrong"] == 0
    assert effect["samples"] == 4 and effect["accuracy_without_tools"] == metrics["accuracy"]
    with pytest.raises(ValueError, match="no_tools"):  # a resume must not mix runs with and without the tools
        run_evaluation(*eval_args(tiny_kit, data, tmp_path / "without"))


def test_with_tools_run_needs_no_tools_and_a_run(tmp_path):
    with pytest.raises(ValueError, match="set --no_tools too"):
        EvalArguments(model_name_or_path="m", with_tools_run=str(tmp_path))
    with pytest.raises(ValueError, match="has no samples.jsonl"):
        EvalArguments(model_name_or_path="m", no_tools=True, with_tools_run=str(tmp_path))


def test_the_no_tool_row_is_planned_only_when_asked_after_the_run_it_is_set_against(tmp_path):
    chosen, spec = reproduce.load_set("qwen2.5-vl-7b")
    chosen = {**chosen, "name": "qwen2.5-vl-7b"}
    extra = {"sft": [], "rl": [], "eval": []}
    plain = reproduce.plan(chosen, spec, tmp_path / "data", tmp_path / "run", extra)
    asked = reproduce.plan(chosen, spec, tmp_path / "data", tmp_path / "run", extra, no_tools_row=True)
    assert not any("no_tools" in s.name for s in plain)
    extra_stages = asked[len(plain) :]
    assert [s.name for s in asked[: len(plain)]] == [s.name for s in plain]
    assert [s.name for s in extra_stages] == [f"eval_rl_no_tools_{bench}" for bench in spec["benchmarks"]]
    for stage, bench in zip(extra_stages, spec["benchmarks"]):
        at = stage.argv.index("--with_tools_run")
        assert "--no_tools" in stage.argv and stage.argv[at + 1] == str(tmp_path / "run" / f"eval_rl_{bench}")
        assert f"eval_rl_{bench}" in stage.reads


def test_the_report_shows_the_no_tool_row_where_it_ran_with_what_the_tools_turned(tmp_path):
    spec = reproduce.load_set("tiny")[1]
    run = tmp_path / "run"
    assert not any("tools withheld" in line for line in score_table(run, spec))  # not asked: no row
    folder = run / "eval_rl_no_tools_vstar"
    folder.mkdir(parents=True)
    effect = {"turned_right": 3, "turned_wrong": 1}
    (folder / "metrics.json").write_text(json.dumps({"accuracy": 0.25, "tool_effect": effect}))
    (folder / "eval_args.json").write_text(json.dumps({"temperature": 0.0, "no_tools": True}))
    row = next(line for line in score_table(run, spec) if "tools withheld |" in line)
    assert row.startswith("| ours: MAPO (RL), tools withheld | 25.0; the tools turned 3 right, 1 wrong |")
    assert row.endswith("| greedy, 1 sample; tools withheld; rules unrecorded |")


@pytest.mark.slow
def test_no_tools_on_vstars_release_layout_pairs_every_order(tiny_kit, tmp_path, monkeypatch):
    """V*'s release layout, its options shuffled as `auto` decides (both orders evaluated): "A" answered after a zoom
    and "A" answered at once agree on every question and order, so the tools turned nothing, and every sample pairs."""
    root = write_vstar_release(tmp_path / "vstar_bench", questions=4, size=(448, 336))
    overrides = dict(benchmark="vstar", shuffle_options="auto")
    scripted(monkeypatch)
    with_tools = run_evaluation(*eval_args(tiny_kit, root, tmp_path / "with", **overrides))
    seen = scripted(monkeypatch, first_turn=lambda i, label: answer_turn(i))
    metrics = run_evaluation(
        *eval_args(
            tiny_kit, root, tmp_path / "without", no_tools=True, with_tools_run=str(tmp_path / "with"), **overrides
        )
    )
    assert len(seen) == 8 and all(NO_TOOLS_SENTENCE in text for text in seen)  # 4 questions x 2 orders, one turn
    effect = metrics["tool_effect"]
    assert effect["samples"] == 8 and effect["only_with_tools_run"] == effect["only_without_tools_run"] == 0
    assert (effect["turned_right"], effect["turned_wrong"]) == (0, 0)
    assert effect["both_right"] + effect["both_wrong"] == 8
    assert metrics["accuracy"] == with_tools["accuracy"] and metrics["answer_order"]["seed"] == 0
