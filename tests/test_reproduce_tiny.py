"""`make reproduce` through the Makefile: the dry run's memory estimate, and the tiny set run end to end on the
release-shaped data it writes itself (tiny/releases.py) (a second run skips every stage; a changed command is refused; a forced RL
interrupted after a checkpoint resumes from it on a rerun of the same command), ending with reproduce.md: the table,
the curves and the plan's time."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_reproduce import SPEC, stage_names

from evaluation.run import read_samples
from scripts import memory

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- through make
def make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    # -o: the installed stack and the kit count as built (the tiny_kit fixture keeps the kit fresh, under its lock)
    command = [
        "make",
        "--no-print-directory",
        "-o",
        ".venv/.installed",
        "-o",
        "outputs/tiny/.built",
        "reproduce",
        *args,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_the_dry_run_estimates_memory_per_gpu_with_the_repo_s_estimator(tmp_path):
    """The 3B LoRA set's two training stages, as recipes/README.md's table gives them (scripts.memory), the RL stage
    with the command line's flags over its recipe (here a smaller micro-batch), as the run will have them."""
    done = make("DRY=1", "RECIPE_SET=qwen2.5-vl-3b-lora", f"DATA_ROOT={tmp_path}",
                "ARGS=--rl_args '--per_device_train_batch_size 2'")  # fmt: skip
    assert done.returncode == 0, done.stderr
    sft, _ = memory.estimate_recipe(REPO / SPEC["sets"]["qwen2.5-vl-3b-lora"]["sft"], "single_gpu", 1)
    assert f"--accelerate single_gpu --num_gpus 1): training {sft['total']:.2f} GiB\n" in done.stdout
    recipe = SPEC["sets"]["qwen2.5-vl-3b-lora"]["rl"]
    flags = ["--per_device_train_batch_size", "2"]
    smaller, _ = memory.estimate_recipe(REPO / recipe, "single_gpu", 1, recipe_args=flags)
    full, _ = memory.estimate_recipe(REPO / recipe, "single_gpu", 1)
    assert smaller["total"] < full["total"]  # recipes/README.md's table holds the full one (tests/test_recipes.py)
    line = f"--recipe_args '--per_device_train_batch_size 2'): training {smaller['total']:.2f} GiB, generation "
    assert line in done.stdout


# 2 SFT steps, 3 RL steps saved after each, a short rollout budget and 2 rows of one benchmark: each evaluation is ~20 s
# of imports and model loads on two processes, whatever its rows (the readers' layouts: tests/test_benchmarks.py)
TINY_ARGS = ('--sft_args "--max_steps 2 --per_device_train_batch_size 2" --rl_args "--max_steps 3 '
             '--max_completion_length 96 --save_strategy steps --save_steps 1" --eval_args "--limit 2" '
             '--benchmarks vstar')  # fmt: skip
BENCHES = ["vstar"]


def make_process(*args: str) -> subprocess.Popen:
    """`make reproduce` started in a session of its own, so that a Ctrl-C can reach every process of the run."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "-o", "outputs/tiny/.built", "reproduce"]
    return subprocess.Popen([*command, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip


def interrupt_after_first_checkpoint(process: subprocess.Popen, rl: Path) -> tuple[str, str]:
    """Ctrl-C to the whole run once RL, started in a forced round (its .started names one), has a complete
    checkpoint-1 (trainer_state.json is written last); the run's output."""
    deadline = time.monotonic() + 900  # a hang becomes a failure; the run takes ~1 min to get there
    while process.poll() is None and time.monotonic() < deadline:
        try:
            forced = json.loads((rl / ".started").read_text()).get("round") is not None
        except (OSError, ValueError):  # not there, or being written
            forced = False
        if forced and (rl / "checkpoint-1" / "trainer_state.json").is_file():
            os.killpg(process.pid, signal.SIGINT)
            break
        time.sleep(0.2)
    return process.communicate(timeout=600)


@pytest.fixture(scope="module")
def tiny_run(tiny_kit, tmp_path_factory) -> SimpleNamespace:
    """`make reproduce RECIPE_SET=tiny` on the same folders: the run, a rerun that must skip it all, one whose SFT
    command changed, which must be refused before anything runs, then FORCE=rl DISCARD=rl interrupted after RL's first
    checkpoint; the run folder and the data moved to another disk and the same command again, which must resume RL
    from its checkpoint; moved once more, a plain rerun, which must skip every stage."""
    root = tmp_path_factory.mktemp("reproduce")  # DATA_ROOT root/data not there: the tiny set writes its own

    def at(folder: Path, *more: str) -> list[str]:
        return [
            "RECIPE_SET=tiny",
            f"DATA_ROOT={folder / 'data'}",
            f"RUN_DIR={folder / 'run'}",
            f"ARGS={TINY_ARGS}",
            *more,
        ]

    first = make(*at(root))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"--> wrote release-shaped data: {root / 'data' / 'vstar_bench'}" in first.stdout
    estimate = json.loads((root / "run" / "estimate.json").read_text())
    second = make(*at(root))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    page = (root / "run" / "reproduce.md").read_text()
    changed = make(*at(root)[:-1], f"ARGS={TINY_ARGS.replace('--max_steps 2 --per', '--max_steps 3 --per')}")
    interrupted = interrupt_after_first_checkpoint(
        make_process(*at(root, "FORCE=rl", "DISCARD=rl")), root / "run" / "rl"
    )
    bigger = root.with_name(f"{root.name}-bigger")  # a copy to a bigger disk, between the Ctrl-C and the rerun
    shutil.move(root, bigger)
    first_checkpoint = (bigger / "run" / "rl" / "checkpoint-1" / "trainer_state.json").stat()
    resumed = make(*at(bigger, "FORCE=rl", "DISCARD=rl"))
    again = root.with_name(f"{root.name}-again")
    shutil.move(bigger, again)
    moved = make(*at(again))
    return SimpleNamespace(first_run=root / "run", run=again / "run", first=first.stdout, second=second.stdout,
                           changed=changed, page=page, estimate=estimate, interrupted=interrupted,
                           first_checkpoint=first_checkpoint, resumed=resumed, moved=moved)  # fmt: skip


STAGES = stage_names(SPEC["sets"]["tiny"], BENCHES)


@pytest.mark.slow
def test_the_tiny_reproduction_runs_every_stage_and_marks_it_done(tiny_run):
    run, first = tiny_run.run, tiny_run.first
    assert [
        line.split(":")[0].removeprefix("==> ") for line in first.splitlines() if line.startswith("==> ")
    ] == STAGES
    ids = {}
    for stage in STAGES:
        if stage in ("rl", "eval_rl_vstar"):
            continue  # rerun by the forced round below
        record = json.loads((run / stage / ".done").read_text())
        assert record["command"][0].endswith(("python", "python3", "accelerate")) and record["seconds"] > 0
        assert record["inputs"] == {name: ids[name] for name in record["inputs"]}  # the run ids of what it read
        ids[stage] = record["id"]
    assert json.loads((run / "rl" / ".done").read_text())["inputs"] == {"sft": ids["sft"], "rl_probe": ids["rl_probe"]}
    assert (run / "sft" / "model.safetensors").is_file() and (run / "rl" / "trainer_state.json").is_file()
    assert (run / "convert" / "stats.json").is_file() and (run / "convert" / "preview" / "index.html").is_file()
    for model in ("base", "sft", "rl"):  # data-parallel on 2 processes: merged, whole, no part left
        metrics = json.loads((run / f"eval_{model}_vstar" / "metrics.json").read_text())
        assert metrics["n"] == 2 and len(read_samples(run / f"eval_{model}_vstar" / "samples.jsonl")) == 2
        assert not list((run / f"eval_{model}_vstar").glob("samples.rank*.jsonl"))
        settings = json.loads((run / f"eval_{model}_vstar" / "eval_args.json").read_text())
        assert settings["tool"]["max_pixels"] == 12544 and settings["max_completion_length"] == 96
        # one crop ceiling for the three rows: the base model's is the one the checkpoints record (it was 401,408)
        assert settings["tool"]["crop_max_pixels"] == 12544, model
    # the plan's time from the run's own figures: RL's step time from its progress.json, each evaluation's rows
    estimate = tiny_run.estimate
    assert estimate["backend"] == "transformers" and estimate["hours_left"] == 0 and not estimate["unknown"]
    assert json.loads((run / "rl" / "progress.json").read_text())["max_steps"] == 3
    for stage, units in (("rl", 3), ("sft", 2), ("eval_rl_vstar", 2)):
        measured = estimate["stages"][stage]["measured"]
        assert measured["units"] == units and measured["seconds"] > 0, stage
    probe = json.loads((run / "rl_probe" / "metrics.json").read_text())
    assert probe["n"] == 4 and set(probe["rewards"]) == {"gated_outcome"}  # the tiny set's probe: 4 of its 8 rows
    assert probe["rewards"]["gated_outcome"]["scored"] == 4


@pytest.mark.slow
def test_a_second_run_skips_every_finished_stage(tiny_run):
    assert [line for line in tiny_run.second.splitlines() if line.startswith("==> ")] == [
        f"==> {stage}: done, skipped ({tiny_run.first_run / stage / '.done'})" for stage in STAGES
    ]


@pytest.mark.slow
def test_a_run_folder_moved_with_its_data_skips_every_finished_stage(tiny_run):
    """Its records keep $RUN_DIR and $DATA_ROOT, not where they were: the moved run is the same plan."""
    moved = tiny_run.moved
    assert moved.returncode == 0, moved.stdout[-3000:] + moved.stderr[-3000:]
    assert [line for line in moved.stdout.splitlines() if line.startswith("==> ")] == [
        f"==> {stage}: done, skipped ({tiny_run.run / stage / '.done'})" for stage in STAGES
    ]
    record = json.loads((tiny_run.run / "sft" / ".done").read_text())
    assert "$RUN_DIR/sft" in record["command"] and record["recipe"]["max_steps"] == 2


@pytest.mark.slow
def test_a_changed_command_for_a_done_stage_is_refused_through_make(tiny_run):
    changed = tiny_run.changed
    assert changed.returncode != 0 and "==> " not in changed.stdout
    assert "sft is done with another command or recipe than the plan's:" in changed.stderr
    # SFT's folder and RL's (which reads it) hold weights: the advice names both in DISCARD, which deletes them
    assert "--max_steps 3" in changed.stderr and "DISCARD=sft,rl reruns them from an empty folder" in changed.stderr


@pytest.mark.slow
def test_a_forced_rl_interrupted_after_a_checkpoint_resumes_from_it(tiny_run):
    """FORCE=rl DISCARD=rl, Ctrl-C after RL's first checkpoint: the advice is to rerun the same command; that command,
    after the run folder and its data moved, resumes RL from its last complete checkpoint (the first one still there,
    untouched), reruns RL's evaluation (forced in the round, not refused as stale), and ends the round."""
    run, (_, err), resumed = tiny_run.run, tiny_run.interrupted, tiny_run.resumed
    assert "stage rl interrupted" in err and "Rerun the same command to resume: rl goes on from checkpoint-" in err
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert re.search(r"^\d+\. rl: resume from checkpoint-\d+$", resumed.stdout, re.M), resumed.stdout
    assert "==> eval_rl_vstar: " in resumed.stdout and "==> eval_rl_vstar: done" not in resumed.stdout
    record = json.loads((run / "rl" / ".done").read_text())
    assert record["ran"][-2:] == ["--resume_from_checkpoint", "true"] and record["round"] is not None
    kept = (run / "rl" / "checkpoint-1" / "trainer_state.json").stat()
    assert (kept.st_ino, kept.st_mtime_ns) == (tiny_run.first_checkpoint.st_ino, tiny_run.first_checkpoint.st_mtime_ns)
    assert json.loads((run / "rl" / "trainer_state.json").read_text())["global_step"] == 3
    assert not (run / ".forced").exists()


@pytest.mark.slow
def test_the_run_ends_with_reproduce_md_the_table_and_the_curves(tiny_run):
    run, page = tiny_run.first_run, tiny_run.page
    assert f"report: {run / 'reproduce.md'}" in tiny_run.second
    assert "| system | V* Bench | protocol |" in page
    for title in ("base model", "SFT", "MAPO (RL)"):  # our three rows, each evaluated, each with its protocol
        # the score, then its bootstrap interval over questions (issue 64)
        cell = r"\d+\.\d \[\d+\.\d, \d+\.\d\]"
        assert re.search(rf"^\| ours: {re.escape(title)} \| {cell} \| greedy, 1 sample", page, re.M), title
    assert (
        "rules can_infer, no judge" in page and "| DeepEyes-7B [2] | 90.1 |" in page and "`max_steps`: " not in page
    )  # paper sets no max_steps
    assert "set by the run, not by the paper's recipe: " in page and "`max_steps: 3`" in page
    assert "- gated_outcome: paid " in page  # the probe
    for stem in ("reward", "r_sem", "zoom_calls"):
        assert f"](curves/{stem}.png)" in page and (tiny_run.run / "curves" / f"{stem}.png").stat().st_size > 1000
    assert "mean z_t per call" in page  # drawn, or said not logged (no valid call in one tiny step)
    assert "## Time: the plan's estimate and the run's own figures" in page
    assert re.search(r"^\| rl \| — \| \d+\.\d\d \| 3 of 3 \| [\d.]+ \| 0\.0 \|$", page, re.M), page
