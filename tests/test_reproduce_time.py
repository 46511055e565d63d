"""`make reproduce`'s time (evaluation/reproduce_time.py, utils/progress.py): each stage's work at the assumed rate,
replaced by what the run measures as it runs (a training stage's progress.json, an evaluation's recorded samples),
the remaining time written to RUN_DIR/estimate.json and reproduce.md; a stage failing under vLLM names the fallback.
Hand-worked numbers; the tiny run's own estimate is checked in tests/test_reproduce.py."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
from tolerance import FLOAT64, approx

from evaluation.reproduce_state import Stage
from evaluation.reproduce_time import Clock, Measured, RowMeter, Work, remaining, total_line, training_measure
from evaluation.reproduction import time_lines
from scripts import reproduce
from utils.progress import PROGRESS_FILE, StepTimes, write_progress

NO_EXTRA = {"sft": [], "rl": [], "eval": []}


def test_the_remaining_time_takes_each_measured_rate_where_there_is_one():
    """An evaluation measured at 3.6 s a row (20 of 100 done): 80 rows left, 0.08 h; the evaluation after it, not yet
    run, at the same rate: 50 rows, 0.05 h; training, unmeasured, at its plan: 10 steps of 360 s, 1 h; a stage with
    no estimate stays unknown."""
    plan = {"a": ("eval", Work(100, 2.0)), "b": ("train", Work(10, 360.0)), "c": ("eval", Work(50, 2.0)),
            "d": (None, None)}  # fmt: skip
    left = remaining(plan, ["a", "b", "c", "d"], {"a": Measured(20, 100, 3.6)})
    assert left == {"a": approx(0.08, FLOAT64, terms=3), "b": approx(1.0, FLOAT64, terms=3),
                    "c": approx(0.05, FLOAT64, terms=3), "d": None}  # fmt: skip
    # measured training: its own steps left at its own rate (7 steps of 5 s)
    left = remaining(plan, ["b"], {"b": Measured(3, 10, 5.0)})
    assert left["b"] == approx(35 / 3600, FLOAT64, terms=3)


def test_a_training_stage_is_measured_from_its_progress_file_first_step_left_out(tmp_path):
    assert training_measure(tmp_path) is None  # not written yet
    write_progress(tmp_path, 3, 10, [10.0, 4.0, 6.0])  # the first step also warmed up: 4 and 6 s, mean 5
    assert training_measure(tmp_path) == Measured(3, 10, approx(5.0, FLOAT64, terms=2))
    write_progress(tmp_path, 1, 10, [9.0])  # one step: all there is
    assert training_measure(tmp_path).seconds == 9.0
    (tmp_path / PROGRESS_FILE).write_text("{half")  # never a crash on a file being replaced
    assert training_measure(tmp_path) is None


def test_the_step_times_callback_writes_progress_on_the_main_process(tmp_path, monkeypatch):
    clock = iter([100.0, 107.0, 110.5, 111.0])
    monkeypatch.setattr("utils.progress.time.monotonic", lambda: next(clock))
    args = SimpleNamespace(output_dir=str(tmp_path))
    callback = StepTimes()
    callback.on_train_begin(args, None, None)
    for step in (1, 2):
        callback.on_step_end(args, SimpleNamespace(global_step=step, max_steps=8, is_world_process_zero=True), None)
    progress = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert progress == {"step": 2, "max_steps": 8, "step_seconds": [7.0, 3.5]}
    other = tmp_path / "rank1"
    callback.on_step_end(SimpleNamespace(output_dir=str(other)), SimpleNamespace(global_step=3, max_steps=8,
                         is_world_process_zero=False), None)  # fmt: skip
    assert not other.exists()


def test_an_evaluation_is_measured_by_its_samples_growth_after_the_first_look(tmp_path):
    """2 rows at the first look (the load before them not counted), 7 across samples.jsonl and a rank's part 10 s
    later: 2 s a row; a partial last line is not a row."""
    meter = RowMeter(tmp_path, 40)
    assert meter.look(0.0) is None  # nothing yet
    (tmp_path / "samples.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    assert meter.look(5.0) is None  # the first rows: the origin
    (tmp_path / "samples.rank1.jsonl").write_text('{"id": 3}\n' * 5 + '{"id": 9')
    assert meter.look(15.0) == Measured(7, 40, approx(2.0, FLOAT64, terms=2))


def test_the_clock_writes_the_estimate_and_reproduce_md_reads_it(tmp_path):
    firsts = []
    plan = {"eval_base_vstar": ("eval", Work(100, 2.0)), "rl": ("train", Work(10, 360.0))}
    clock = Clock(tmp_path, plan, list(plan), "vllm", lambda name, m: firsts.append(name))
    clock.write()
    record = json.loads((tmp_path / "estimate.json").read_text())
    assert record["hours_left"] == approx(100 * 2 / 3600 + 1.0, FLOAT64, terms=3) and record["backend"] == "vllm"
    clock.look("eval_base_vstar", Measured(10, 100, 3.6))
    clock.look("eval_base_vstar", Measured(20, 100, 3.6))
    assert firsts == ["eval_base_vstar"]  # said once, when first measured
    clock.finish("eval_base_vstar", Measured(20, 100, 3.6))
    (tmp_path / "eval_base_vstar").mkdir()
    (tmp_path / "eval_base_vstar" / ".done").write_text(json.dumps({"seconds": 372.0}))
    record = json.loads((tmp_path / "estimate.json").read_text())
    assert record["stages"]["eval_base_vstar"]["hours_left"] == 0 and record["hours_left"] == approx(1.0, FLOAT64)
    lines = "\n".join(time_lines(tmp_path, list(plan)))
    assert "generation on vllm: ~1.0 h left, against a week of 168 h." in lines
    assert "| eval_base_vstar | 0.1 | 3.60 | 100 of 100 | 372.0 | 0.0 |" in lines
    assert "| rl | 1.0 | — | — | — | 1.0 |" in lines
    again = Clock(tmp_path, plan, ["rl"], "vllm")  # a restarted plan keeps what the run measured
    assert again.measured == {"eval_base_vstar": Measured(100, 100, 3.6)}


def test_the_total_says_when_a_plan_overruns_the_week():
    assert "OVER A WEEK" not in total_line(167.0, "vllm", "x")
    over = total_line(195.0, "transformers", "assumed")
    assert over.startswith("~195 h (8.1 days) with RL's rollouts and the evaluations on transformers (assumed)")
    assert "OVER A WEEK (168 h): RL_BACKEND=vllm (colocated) or fewer RL steps" in over


class _Process:
    def __init__(self, timeouts: int, code: int):
        self.timeouts, self.code = timeouts, code

    def wait(self, timeout=None):
        if self.timeouts:
            self.timeouts -= 1
            raise subprocess.TimeoutExpired("stage", timeout)
        return self.code


def test_a_running_stage_is_looked_at_until_it_ends():
    looks = []
    assert reproduce.watch(_Process(2, 3), lambda: looks.append(1), every=0.01) == 3 and len(looks) == 2


@pytest.mark.process
def test_a_stage_failing_under_vllm_names_the_fallback(tmp_path):
    failing = ["python", "-c", "raise SystemExit(3)", "evaluate.py"]
    stage = Stage("eval_base_vstar", failing, tmp_path / "eval_base_vstar", kind="eval", work=Work(2, None))
    clock = Clock(tmp_path, {stage.name: (stage.kind, stage.work)}, [stage.name], "vllm")
    for backend, named in (("vllm", True), ("transformers", False)):
        with pytest.raises(SystemExit) as failed:
            reproduce.run_stage(stage, [stage], "to run", None, clock, backend)
        assert str(failed.value).startswith("stage eval_base_vstar failed (exit 3)")
        assert ("RL_BACKEND=transformers runs RL's rollouts and every evaluation" in str(failed.value)) is named
    assert not (tmp_path / "eval_base_vstar" / ".done").exists()


def test_a_finished_short_evaluation_counts_its_whole_time(tmp_path, monkeypatch):
    """Too short to be looked at twice: its rate is its whole time over its rows (a model load included)."""
    stage = Stage("eval_x", ["python", "-c", "pass"], tmp_path / "eval_x", kind="eval", work=Work(4, None))
    clock = Clock(tmp_path, {stage.name: (stage.kind, stage.work)}, [stage.name], "transformers")
    monkeypatch.setattr(reproduce.subprocess, "Popen", lambda *a, **k: _Process(0, 0))
    times = iter([10.0, 30.0, 31.0])  # the start, the end, the meter's last look
    monkeypatch.setattr(reproduce.time, "monotonic", lambda: next(times))
    reproduce.run_stage(stage, [stage], "to run", None, clock, "transformers")
    assert clock.measured["eval_x"] == Measured(4, 4, 5.0)
    assert json.loads((tmp_path / "eval_x" / ".done").read_text())["seconds"] == 20.0


# ---------------------------------------------------------------------------------------------- checkpoints by time
def test_training_stages_save_at_least_every_two_estimated_hours(tmp_path):
    """7B RL on vLLM: 8 x 4 x 8 = 256 rollouts of 2,500 tokens, 640,000 tokens a step, generated at 1,500 and trained
    at 2,500 tokens/s on each of 8 GPUs: 53.3 + 32 = 85.3 s a step, 7,200 s / 85.3 = 84.4: every 84 steps, not the
    recipe's 100 (its save_total_limit kept). On transformers (130 tokens/s): 615.4 + 32 = 647.4 s, every 11 steps.
    SFT: 2 x 2 x 8 = 32 rows of 6,000 tokens at 2,500 tokens/s on 8 GPUs, 9.6 s a step, 750 in 2 h: its recipe's 200
    already saves more often. A --save_steps of the command line is left as given."""
    chosen, spec = reproduce.load_set("qwen2.5-vl-7b")
    chosen = {**chosen, "name": "qwen2.5-vl-7b"}

    def commands(backend: str, extra: dict = NO_EXTRA) -> dict[str, list[str]]:
        return {s.name: s.argv for s in reproduce.plan(chosen, spec, tmp_path, tmp_path, extra, rl_backend=backend)}

    for backend, every in (("vllm", "84"), ("transformers", "11")):
        argv = commands(backend)
        assert argv["rl"][argv["rl"].index("--save_steps") + 1] == every, backend
        assert "--save_strategy" not in argv["rl"] and "--save_total_limit" not in argv["rl"]
        assert "--save_steps" not in argv["sft"]
    argv = commands("vllm", {**NO_EXTRA, "rl": ["--save_steps", "500"]})["rl"]
    assert argv.count("--save_steps") == 1 and argv[argv.index("--save_steps") + 1] == "500"


def test_a_tiny_set_with_its_own_throughput_saves_by_time_too(tmp_path):
    """The tiny RL recipe saves nothing (save_strategy "no"). Given a set's own figures (4 rollouts of 100 tokens,
    generated at 40 and trained at 400 tokens/s: 10 + 1 = 11 s a step) and checkpoints every 0.01 h (36 s), the plan
    saves every 3 steps, keeping 2 checkpoints; without figures a CPU set is not estimated, and nothing is added."""
    chosen, spec = reproduce.load_set("tiny")
    figures = {"rl_rollout_tokens": 100, "generate_tokens_per_s": {"transformers": 40}, "train_tokens_per_s": 400}
    own = {**chosen, "name": "tiny", "throughput": figures}
    stages = {s.name: s for s in reproduce.plan(own, {**spec, "checkpoint_hours": 0.01}, tmp_path, tmp_path, NO_EXTRA)}
    assert stages["rl"].work == Work(8, approx(11.0, FLOAT64, terms=3))  # the recipe's max_steps 8
    assert stages["rl"].argv[-6:] == ["--save_strategy", "steps", "--save_steps", "3", "--save_total_limit", "2"]
    plain = reproduce.plan({**chosen, "name": "tiny"}, spec, tmp_path, tmp_path, NO_EXTRA)
    assert not any("--save_steps" in s.argv for s in plain)
