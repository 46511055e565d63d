"""Evaluation: scoring rules on hand-written answers, and whole runs on the tiny model (forced tool calls), including
resume and bad inputs. The agent against TRL's own rollout code: tests/test_evaluate_agent.py."""

import base64
import contextlib
import io
import json
import logging
import threading

import datasets
import pandas as pd
import pytest
import torch
from PIL import Image

import evaluate
from configs import EvalArguments
from data.rows import TASK_FEATURES
from data.synthetic import build_synthetic
from data.task import SYSTEM_PROMPTS
from evaluate import parse_args
from evaluation import run as evaluation_run
from evaluation.metrics import SCORING_RULES, compute_metrics
from evaluation.run import process_share, read_samples, run_evaluation, select_rows
from tests.fake_judge import DEEPEYES_LIKE_SOURCE, FakeJudge, prompt_fields
from tests.tolerance import FLOAT64, TINY_CLIP_FORWARD, approx
from tiny.scripted import DEFAULT_BOX, DEFAULT_LABELS, force_tool_calls
from tools import (
    PixelBudget,
    ToolConfig,
    crop_box,
    write_record,
)
from utils.models import load_processor

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------------------- metrics
# (the scoring rules themselves: tests/test_scoring.py, fast lane)
def record(source, correct, calls=(), failure=None, turns=1):
    return {"source": source, "correct": correct, "failure": failure, "num_turns": turns, "calls": list(calls)}


def call(z=None, z_full=None, box=(0, 0, 10, 10)):
    gap = None if z is None else z <= z_full
    return {"box": list(box) if box else None, "z": z, "z_full": z_full, "gap": gap}


def test_hrbench_reports_single_cross_and_their_mean():
    records = [
        record("hrbench_4k/single", True),
        record("hrbench_4k/single", True),
        record("hrbench_4k/single", False),
        record("hrbench_4k/single", True),
        record("hrbench_4k/cross", False),
        record("hrbench_4k/cross", True),
    ]
    metrics = compute_metrics(records, "hrbench")
    assert (metrics["single"], metrics["cross"], metrics["mean"]) == (0.75, 0.5, 0.625)
    assert metrics["accuracy"] == approx(4 / 6, FLOAT64, terms=1)


def test_mme_realworld_reports_per_task_and_overall():
    records = [
        record("mme_realworld/Perception/Monitoring/Vehicle/counting", True),
        record("mme_realworld/Perception/Monitoring/Person/counting", False),
        record("mme_realworld/Perception/Remote Sensing/color", True),
        record("mme_realworld/Reasoning/Diagram and Table/diagram", False),
    ]
    metrics = compute_metrics(records, "mme_realworld")
    assert metrics["accuracy"] == 0.5  # overall: over all questions, as the reference script
    assert metrics["accuracy_by_task"] == {"Perception": approx(2 / 3, FLOAT64, terms=1), "Reasoning": 0.0}
    assert metrics["accuracy_by_subtask"] == {
        "Perception/Monitoring": 0.5,
        "Perception/Remote Sensing": 1.0,
        "Reasoning/Diagram and Table": 0.0,
    }


def test_tool_use_metrics():
    records = [
        record("s", True, [call(0.5, 0.2), call(0.1, 0.3), call(box=None)], turns=3),  # one gap call, one error
        record("s", False, [], failure="no <answer>", turns=1),
    ]
    metrics = compute_metrics(records, "synthetic", skipped_rows=2)
    assert metrics | {"accuracy_by_source": None} == {
        "benchmark": "synthetic",
        "n": 2,
        "n_failed": 1,
        "skipped_rows": 2,
        "scoring": {"can_infer": SCORING_RULES["can_infer"]},
        "accuracy": 0.5,
        "accuracy_strict": None,  # records without `correct_strict`, `rule`: written before the published rules
        "decided_by": {"unrecorded": 2},
        "accuracy_by_source": None,
        "turns_per_sample": 2.0,
        "calls_per_sample": 1.5,
        "tool_call_rate": 0.5,
        "valid_call_rate": approx(2 / 3, FLOAT64, terms=1),
        "box_contains_target": None,  # no row has a target_bbox
        "box_touches_target": None,
        "mean_z": approx(0.3, FLOAT64, terms=3),  # (0.5 + 0.1) / 2
        "gap_rate": 0.5,
    }


def test_target_hit_metrics_by_hand():
    target = [20, 20, 30, 30]
    records = [
        record("s", True, [call(box=(0, 0, 40, 40)), call(box=(25, 25, 60, 60)), call(box=None)])
        | {"target_bbox": target},
        record("s", False, [call(box=(50, 50, 90, 90))]) | {"target_bbox": target},
        record("s", False, [call(box=(0, 0, 100, 100))]),  # no target_bbox: not counted
    ]
    metrics = compute_metrics(records, "synthetic")
    # Valid calls of rows with a target: 3. Contained in 1 (the first), touched by 2 (the first two).
    assert metrics["box_contains_target"] == approx(1 / 3, FLOAT64, terms=1)
    assert metrics["box_touches_target"] == approx(2 / 3, FLOAT64, terms=1)


# ------------------------------------------------------------------------------------------------------ full runs
LOAD_LOCK = threading.Lock()  # scripted_model's loads, one at a time (conftest.LOADER_SWAPPED says why)


def eval_args(tiny_kit, data_path, output_dir, **overrides):
    fields = dict(
        model_name_or_path=str(tiny_kit["policy"]),
        benchmark="synthetic",
        data_path=str(data_path),
        output_dir=str(output_dir),
        max_completion_length=320,  # the tiny recipes' rollout budget
        max_tool_calling_iterations=2,
        batch_size=4,
        device="cpu",
    )
    return EvalArguments(**(fields | overrides)), ToolConfig(clip_model=str(tiny_kit["clip"]))


@contextlib.contextmanager
def scripted_model(first_turn=None):
    """Make `evaluate` load models whose turns are scripted (scripted.py); yields each loaded model's scripts."""
    scripts, original = [], evaluation_run.load_model

    def load_model(name_or_path, **kwargs):
        with LOAD_LOCK:  # two ranks run as threads of one process here; transformers' loaders are not thread-safe
            model = original(name_or_path, **kwargs)
        scripts.append(force_tool_calls(model, load_processor(name_or_path).tokenizer, first_turn=first_turn))
        return model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation_run, "load_model", load_model)
        yield scripts


def judge_reply(body: dict) -> str:
    """The fake judge of the shared runs: it accepts only the answer to the colour question."""
    return "Judgement: 1" if prompt_fields(body["messages"][-1]["content"])["standard"] == "orange" else "Judgement: 0"


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A fake judge on localhost and the `judge_*` keys of an evaluation that asks it, its prompt read from a stand-in
    of DeepEyes' eval/judge_result.py (fake_judge.py)."""
    source = tmp_path_factory.mktemp("deepeyes") / "judge_result.py"
    source.write_text(DEEPEYES_LIKE_SOURCE)
    server = FakeJudge(judge_reply).start()
    yield server, dict(judge=True, judge_base_url=server.base_url, judge_model="fake", judge_prompt=str(source))
    server.stop()


@pytest.fixture(scope="module")
def whole_run(tiny_kit, synthetic_dir, tmp_path_factory, judge):
    """One uninterrupted run on the four synthetic rows: a tool call, then an answer, for every sample; with the LLM
    judge asked (`--judge`) on the answers the rules leave open."""
    output_dir = tmp_path_factory.mktemp("whole")
    with scripted_model():
        metrics = run_evaluation(*eval_args(tiny_kit, synthetic_dir, output_dir, **judge[1]))
    return metrics, output_dir


def test_run_records_trajectories_and_metrics(synthetic_dir, whole_run):
    metrics, output_dir = whole_run
    records = read_samples(output_dir / "samples.jsonl")
    rows = datasets.load_from_disk(synthetic_dir)
    assert [r["id"] for r in records] == rows["id"]
    for i, (r, row) in enumerate(zip(records, rows)):
        assert (r["prediction"], r["failure"], r["num_turns"]) == ("A", None, 2)  # call, then answer
        assert r["correct_strict"] == (row["answer"] == "A" and bool(row["options"]))
        # "A" is read by training's rule on the one multiple-choice row; the open answers it calls wrong go to the
        # judge, which accepts only the colour question's
        assert r["rule"] == ("strict" if row["options"] else "judge")
        assert r["correct"] == (r["correct_strict"] if row["options"] else row["answer"] == "orange")
        (c,) = r["calls"]
        assert c["label"] == DEFAULT_LABELS[i % 2] and c["arguments"]["bbox_2d"] == [8, 8, 80, 80]
        assert (c["t"], c["turn"]) == (1, 1)
        assert c["error"] is None and len(c["box"]) == 4 and c["box"][2] > c["box"][0]  # original pixels
        assert isinstance(c["z"], float) and isinstance(c["z_full"], float) and c["gap"] == (c["z"] <= c["z_full"])
        assert [m["role"] for m in r["messages"]] == ["assistant", "tool", "assistant"]
        assert r["messages"][0]["reasoning"] == "look closer"  # TRL's parser moved <think> out of the content
    zs = [r["calls"][0]["z"] for r in records]
    assert metrics["n"] == 4 and metrics["n_failed"] == 0 and metrics["skipped_rows"] == 0
    assert metrics["accuracy"] == approx(sum(r["correct"] for r in records) / 4, FLOAT64, terms=1)
    assert metrics["accuracy_strict"] == approx(sum(r["correct_strict"] for r in records) / 4, FLOAT64, terms=1)
    assert list(metrics["scoring"]) == ["can_infer"] and metrics["decided_by"] == {"judge": 3, "strict": 1}
    assert metrics["accuracy"] == 0.25 and metrics["accuracy_strict"] == 0.0  # the judge's one acceptance
    assert (metrics["turns_per_sample"], metrics["calls_per_sample"]) == (2.0, 1.0)
    assert (metrics["tool_call_rate"], metrics["valid_call_rate"]) == (1.0, 1.0)
    assert metrics["mean_z"] == approx(sum(zs) / 4, FLOAT64, terms=8, scale=1.0)  # two float64 sums of 4
    assert metrics["gap_rate"] == approx(sum(r["calls"][0]["gap"] for r in records) / 4, FLOAT64, terms=1)
    assert json.loads((output_dir / "metrics.json").read_text()) == metrics
    report = (output_dir / "report.html").read_text()
    assert "<h2>budgets</h2>" in report and "<td>max_completion_length</td><td>320</td>" in report


def test_the_judge_was_asked_deepeyes_evaluation_prompt_and_settings(judge, whole_run):
    """Three requests of the shared run (the open answers): DeepEyes' evaluation mode (its system message, temperature
    0, no token limit), the prompt its get_prompt builds (read from the stand-in file, whose module code did not run),
    the bare question, the row's answer as the standard answer, the prediction."""
    server, _ = judge
    first = [b for b in server.bodies[:3] if prompt_fields(b["messages"][-1]["content"])["standard"] == "orange"]
    assert len(server.bodies) >= 3 and len(first) == 1
    body = first[0]
    assert body["model"] == "fake" and body["temperature"] == 0.0 and "max_tokens" not in body
    assert body["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    prompt = body["messages"][-1]["content"]
    assert prompt.startswith("Say whether the two answers agree") and "[Model_answer] : apple" in prompt
    fields = prompt_fields(prompt)
    assert fields["standard"] == "orange" and fields["prediction"] == "A"
    assert (
        fields["question"].endswith("?") and "Options" not in fields["question"] and "Think" not in fields["question"]
    )


def test_a_budget_a_zoom_cannot_fit_warns_with_the_numbers(tiny_kit, synthetic_dir, tmp_path):
    """RL's start-up check of the rollout's worst case runs before evaluation too: a zoom response that would
    overflow max_completion_length is dropped, and the samples lost to it would read as the model's failures."""
    with scripted_model(), pytest.warns(UserWarning, match=r"over max_completion_length=60: its later tool"):
        run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path, max_completion_length=60, limit=1))


def test_an_evaluation_with_no_valid_call_says_so(tiny_kit, synthetic_dir, tmp_path, caplog):
    """Issue 41: the tiny policy without SFT (not scripted) makes no valid call; the run warns that it cannot say
    anything of the tool, naming the likely causes and fields."""
    with caplog.at_level(logging.WARNING, logger="evaluation.run"):
        metrics = run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path, limit=2, max_completion_length=40))
    assert metrics["valid_call_rate"] in (None, 0.0) and metrics["mean_z"] is None
    (message,) = [r.getMessage() for r in caplog.records if r.name == "evaluation.run"]
    assert message.startswith("No valid zoom-in call: ") and ("SFT cold start" in message or "rejected" in message)


def test_resumed_run_gives_the_same_metrics(tiny_kit, synthetic_dir, tmp_path, whole_run, judge):
    with scripted_model():  # "interrupted" after two samples
        run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path, limit=2, **judge[1]))
    with (tmp_path / "samples.jsonl").open("a") as sink:
        sink.write('{"id": "test-0000')  # and killed mid-write
    with scripted_model() as scripts:
        resumed = run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path, batch_size=3, **judge[1]))
    assert_metrics_equal(resumed, whole_run[0])
    records = read_samples(tmp_path / "samples.jsonl")
    assert len(records) == len({r["id"] for r in records}) == 4
    assert len(scripts[0]) == 4  # the resumed run generated only the two missing samples, two turns each
    with pytest.raises(ValueError, match="other settings"):  # a resume must not mix runs made differently
        run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path, max_tool_calling_iterations=3, **judge[1]))
    with pytest.raises(ValueError, match="'judge': \\(True, False\\)"):  # nor samples judged and not judged
        run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path))


def test_a_data_parallel_run_records_every_row_once_as_one_process_does(
    tiny_kit, synthetic_dir, tmp_path, whole_run, judge, monkeypatch
):
    """Two processes' shares (here two threads, each the rank `accelerate launch` would give it): each generates
    only its own rows into its part, the first waits for the other's, merges them into samples.jsonl and scores
    the whole, as the one-process run did; no part is left."""
    monkeypatch.setattr(evaluation_run, "MERGE_POLL_SECONDS", 0.05)
    results, errors = {}, []

    def rank(r: int) -> None:
        try:
            results[r] = run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path, **judge[1]), shard=(r, 2, 0))
        except Exception as err:  # noqa: BLE001 (a thread's failure is the test's)
            errors.append(err)

    with scripted_model() as scripts:
        threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    assert not errors and results[1] is None
    assert_metrics_equal(results[0], whole_run[0])
    records = read_samples(tmp_path / "samples.jsonl")
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in read_samples(whole_run[1] / "samples.jsonl"))
    assert [len(script) for script in scripts] == [4, 4]  # 2 rows each, two turns each: no row generated twice
    assert not list(tmp_path.glob("samples.rank*.jsonl"))


def test_every_row_falls_to_one_process_whenever_each_looks():
    """Rank 0 has recorded row "1" before rank 1 reads what is done, not before rank 0 read it: shares of what each saw
    left (rank 0: 0, 2; rank 1: the 2nd of [0, 2, 3], 2) would leave row 3 to no one and rank 0 waiting for it."""
    ids, selected = ["0", "1", "2", "3"], [0, 1, 2, 3]
    first, second = process_share(selected, ids, set(), 0, 2), process_share(selected, ids, {"1"}, 1, 2)
    assert first == [0, 2] and second == [3]
    assert process_share(selected, ids, {"0", "1"}, 0, 2) == [2]  # a resume skips what any process recorded


def test_rows_are_a_seeded_sample_the_same_on_every_process():
    assert select_rows(5, None, None) == [0, 1, 2, 3, 4] and select_rows(5, 2, None) == [0, 1]
    sampled = select_rows(100, 3, 7)
    assert sampled == select_rows(100, 3, 7) and sampled != [0, 1, 2] and len(set(sampled)) == 3
    assert set(select_rows(100, None, 7)) == set(range(100))


def test_rl_rewards_score_each_rollout_as_training_would(tiny_kit, synthetic_dir, tmp_path):
    """The reproduction's probe: every rollout scored by the named RL rewards (the scripted answer is "A"), recorded
    per sample; metrics.json says how many each scored and paid."""
    with scripted_model():
        metrics = run_evaluation(
            *eval_args(tiny_kit, synthetic_dir, tmp_path, limit=3, sample_seed=1, reward_funcs=["outcome", "format"])
        )
    records = read_samples(tmp_path / "samples.jsonl")
    ids = datasets.load_from_disk(synthetic_dir)["id"]
    assert [r["id"] for r in records] == [ids[i] for i in select_rows(4, 3, 1)]
    for record in records:
        assert record["rewards"]["outcome"] == float(record["correct"])  # the same rule, on the same answer
        assert record["rewards"]["format"] in (0.0, 1.0)
    paid = sum(r["rewards"]["outcome"] > 0 for r in records)
    assert metrics["rewards"]["outcome"] == {"mean": paid / 3, "scored": 3, "paid": paid}
    assert metrics["rewards"]["format"]["scored"] == 3


def assert_metrics_equal(a, b):
    """Metrics equal up to float rounding, nested dicts included. The resumed run scores its crops with CLIP in
    batches of another size, and batched float32 kernels round differently in the last bits (1.07e-6 relative was
    seen on one CPU, and more on others): the bound is a tiny CLIP forward's (`TINY_CLIP_FORWARD`), at the size of
    a cosine (1), far below any difference a metric is read for."""
    assert a.keys() == b.keys()
    for key, value in b.items():
        numbers = isinstance(value, float) or (
            isinstance(value, dict) and all(isinstance(v, float) for v in value.values())
        )
        expected = approx(value, terms=TINY_CLIP_FORWARD, scale=1.0) if numbers else value
        assert a[key] == expected, key


def test_bad_inputs_are_scored_failures(tiny_kit, tmp_path):
    """A wrong tool call, a call that does not parse, an answer outside the options and an image that does not
    decode: each is one sample's recorded failure (or error observation); the run completes."""
    rows = build_synthetic(4, seed=3, split="test", min_size=448, max_size=640, mc_fraction=1.0)
    rows = rows.cast_column("image", datasets.Image(decode=False)).to_list()
    png = rows[3]["image"]["bytes"]
    Image.open(io.BytesIO(png[:300]))  # the header still parses: the loader would accept it...
    rows[3]["image"] = {"bytes": png[:300], "path": None}  # ...but the pixels are cut off
    datasets.Dataset.from_list(rows, features=TASK_FEATURES).save_to_disk(tmp_path / "data")

    def first_turn(i, label):
        return [
            '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"box": [1, 2, 30, 40]}}\n</tool_call><|im_end|>',
            '<think>zoom</think><tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1,\n</tool_call>'
            "<|im_end|>",
            "<think>easy</think><answer>Z</answer><|im_end|>",
        ][i]

    with scripted_model(first_turn):
        metrics = run_evaluation(*eval_args(tiny_kit, tmp_path / "data", tmp_path / "run"))
    wrong_args, unparsed, outside, broken = read_samples(tmp_path / "run" / "samples.jsonl")

    (call,) = wrong_args["calls"]  # a TypeError in the tool becomes an error observation, as in TRL
    assert "unexpected keyword argument 'box'" in call["error"] and call["box"] is None and call["z"] is None
    assert "'error'" in wrong_args["messages"][1]["content"] and wrong_args["num_turns"] == 2
    assert wrong_args["prediction"] == "A" and wrong_args["failure"] is None
    # a call whose JSON does not parse is no call to TRL either: the rollout ends, and the sample says why
    assert unparsed["calls"] == [] and unparsed["failure"] == "no <answer>: a <tool_call> that did not parse"
    assert outside["failure"] == "answer outside the options: 'Z'" and not outside["correct"]
    assert (outside["rule"], wrong_args["rule"], unparsed["rule"]) == ("none", "strict", "no_answer")
    assert broken["failure"].startswith("image could not be processed") and broken["num_turns"] == 0
    assert (metrics["n"], metrics["n_failed"], metrics["valid_call_rate"], metrics["mean_z"]) == (4, 3, 0.0, None)


def test_hrbench_run_reports_categories_and_skipped_rows(tiny_kit, tmp_path):
    """A benchmark file end to end: HR-Bench's TSV with one unreadable image, skipped and counted."""
    images = build_synthetic(3, seed=5, split="test", min_size=448, max_size=640)
    images = images.cast_column("image", datasets.Image(decode=False))["image"]
    rows = [
        {"index": i, "question": "Which word is on the sign?", "answer": "AB"[i % 2], "A": "CAT", "B": "DOG",
         "C": "SUN", "D": "MAP", "category": ("single", "cross")[i % 2], "cycle_category": "cycle_0",
         "image": base64.b64encode(image["bytes"] if i < 2 else b"not an image").decode()}
        for i, image in enumerate(images)
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "hr_bench_4k.tsv", sep="\t", index=False)
    args = eval_args(tiny_kit, tmp_path / "hr_bench_4k.tsv", tmp_path / "run", benchmark="hrbench", skip_bad_rows=True)
    with scripted_model():  # every sample zooms once, then answers "A"
        metrics = run_evaluation(*args)
    assert (metrics["n"], metrics["skipped_rows"], metrics["n_failed"]) == (2, 1, 0)
    assert (metrics["single"], metrics["cross"], metrics["mean"]) == (1.0, 0.0, 0.5)
    assert metrics["accuracy_by_source"] == {"hrbench_4k/cross": 0.0, "hrbench_4k/single": 1.0}


def test_evaluate_runs_the_tiny_qwen3_vl_in_its_own_box_convention(tiny_kit, synthetic_dir, tmp_path):
    """evaluate.py on the tiny Qwen3-VL (turns scripted), its tool in Qwen3-VL's 0-1000 frame: the model is prompted
    in that frame (system turn and tool description), each scripted box is cropped where the grid puts it, and the
    samples record the frame."""
    prompts, original = [], evaluation_run.load_model

    def load_model(name_or_path, **kwargs):
        model = original(name_or_path, **kwargs)
        tokenizer = load_processor(name_or_path).tokenizer
        force_tool_calls(model, tokenizer)
        scripted = model.generate

        def generate(*args, **kw):
            prompts.append(tokenizer.decode(kw["input_ids"][0]))
            return scripted(*args, **kw)

        model.generate = generate
        return model

    out = tmp_path / "qwen3"
    argv = ["--model_name_or_path", str(tiny_kit["qwen3_vl"]), "--benchmark", "synthetic"]
    argv += ["--data_path", str(synthetic_dir), "--output_dir", str(out), "--clip_model", str(tiny_kit["clip"])]
    argv += [
        "--box_convention",
        "relative_1000",
        "--max_pixels",
        str(32 * 32 * 16),
        "--crop_max_pixels",
        str(32 * 32 * 4),
        "--crop_min_pixels",
        str(32 * 32 * 4),
    ]
    argv += ["--max_completion_length", "320", "--max_tool_calling_iterations", "2", "--limit", "2", "--device", "cpu"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation_run, "load_model", load_model)
        evaluate.main(argv)
    assert SYSTEM_PROMPTS["relative_1000"] in prompts[0] and "on a 0-1000 grid over the image you see" in prompts[0]
    records = read_samples(out / "samples.jsonl")
    assert len(records) == 2
    for record in records:
        assert record["box_frame"] == [1000, 1000] and record["failure"] is None
        (call,) = record["calls"]
        assert call["arguments"]["bbox_2d"] == list(DEFAULT_BOX)
        box = crop_box(
            tuple(record["image_size"]), list(DEFAULT_BOX), seen_size=(1000, 1000), min_side=28, max_aspect=100
        )
        assert call["box"] == list(box)
    assert json.loads((out / "eval_args.json").read_text())["tool"]["box_convention"] == "relative_1000"


def test_cli_reads_flags_and_yaml_config(tmp_path, caplog):
    """A model with no training record (the tiny kit's, like a hub model) is evaluated under the real RL recipes'
    budgets (`recipes/mapo_paper.yaml`, logged), not its processor's own and a 2048-token default."""
    config = tmp_path / "eval.yaml"
    config.write_text("model_name_or_path: outputs/tiny/qwen2_5_vl\nbenchmark: vstar\ndata_path: /data/vstar_bench\n")
    args, tool = parse_args(["--config", str(config), "--limit", "5"])
    assert (args.benchmark, args.limit, args.max_completion_length, args.max_tool_calling_iterations) == (
        "vstar",
        5,
        8192,
        5,
    )
    assert (tool.min_pixels, tool.max_pixels, tool.crop_max_pixels, tool.crop_min_pixels) == (
        None,
        1003520,
        401408,
        40000,
    )
    assert "no training record of max_pixels" in caplog.text and "mapo_paper.yaml" in caplog.text
    assert args.output_dir == "outputs/eval/qwen2_5_vl-vstar-vstar_bench"
    args, tool = parse_args(["--config", str(config), "--max_completion_length", "4096", "--max_pixels", "50176"])
    assert (args.max_completion_length, tool.max_pixels, tool.crop_max_pixels) == (4096, 50176, 401408)


def test_a_checkpoint_without_a_rollout_record_takes_the_recipes_rollout_budget(tiny_kit, tmp_path):
    """An SFT checkpoint records its tool settings but no rollout budget: those come from the record, the rollout
    budget from the real RL recipes."""
    checkpoint = tmp_path / "sft"
    checkpoint.mkdir()
    trained = ToolConfig(max_pixels=50176, crop_max_pixels=25088).resolved(PixelBudget(3136, 50176, 28))
    write_record(checkpoint, trained.as_record(verifier=False))
    args, tool = parse_args(["--model_name_or_path", str(checkpoint), "--benchmark", "vstar"])
    assert (tool.max_pixels, tool.crop_max_pixels, tool.crop_min_pixels) == (50176, 25088, 3136)  # not the recipes'
    assert (args.max_completion_length, args.max_tool_calling_iterations) == (8192, 5)


@pytest.mark.gpu
def test_vllm_backend_sees_the_processors_frame(tiny_kit, synthetic_dir, tmp_path):
    """vLLM gets text prompts with one pad per image and must expand them exactly as the processor does (the
    backend raises otherwise), across turns with crops; the random tiny policy rarely calls, so the second turn
    runs only if it does."""
    pytest.importorskip("vllm")
    assert torch.cuda.is_available()
    metrics = run_evaluation(*eval_args(tiny_kit, synthetic_dir, tmp_path / "vllm", backend="vllm", device="cuda"))
    assert metrics["n"] == 4
