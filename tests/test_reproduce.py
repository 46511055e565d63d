"""`make reproduce` (scripts/reproduce.py, recipes/reproduce.yaml): every set's plan names files that exist, the plan
reads the run folder's markers and checkpoints, missing data is refused before any stage naming the path, and the
tiny set runs end to end through the Makefile target on release-shaped data written here (a second run skips every
stage), ending with reproduce.md: the table and the curves."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from release_fixtures import mini_o3_row, write_mini_o3
from test_benchmarks import VSTAR_SUFFIX, b64, hrbench_rows, image_bytes, mme_items

from data.benchmarks import BENCHMARKS
from data.converters import FORMATS
from evaluation.reproduction import PAPER_RECIPE, write_report
from scripts import reproduce
from utils.recipes import load_recipe

REPO = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load(reproduce.SETS_FILE.read_text(encoding="utf-8"))
SETS = sorted(SPEC["sets"])


def dry_run(capsys, *argv: str) -> tuple[list[reproduce.Stage], str]:
    stages = reproduce.main([*argv, "--dry_run", "--no_memory"])
    return stages, capsys.readouterr().out


def named_files(argv: list[str]) -> list[Path]:
    """The repo files a command runs or reads: the entry script or module, `--config`, `--config_file`."""
    files = []
    if argv[:2] == ["python", "-m"]:
        files.append(REPO / (argv[2].replace(".", "/") + ".py"))
    elif argv[0] == "python":
        files.append(REPO / argv[1])
    else:
        assert argv[:2] == ["accelerate", "launch"], argv
        files.append(REPO / next(a for a in argv if a.endswith(".py")))
    files += [REPO / argv[i + 1] for i, a in enumerate(argv) if a in ("--config", "--config_file")]
    return files


# ------------------------------------------------------------------------------------------------- the plans
@pytest.mark.parametrize("name", SETS)
def test_every_set_plans_commands_whose_files_exist(name, tmp_path, capsys):
    stages, out = dry_run(capsys, "--recipe_set", name, "--data_root", str(tmp_path / "data"))
    chosen = SPEC["sets"][name]
    merges = ["sft_merge", "rl_merge"] if chosen.get("lora") else []
    expected = ["convert", "sft", *merges[:1], "rl", *merges[1:], *(f"eval_{b}" for b in SPEC["benchmarks"])]
    assert [s.name for s in stages] == expected
    for s in stages:
        assert " ".join(s.argv) in out.replace("'", "")  # printed as run (shlex quotes nothing here)
        for file in named_files(s.argv):
            assert file.is_file(), f"{name}, {s.name}: {file} does not exist"
        if "--format" in s.argv:
            assert s.argv[s.argv.index("--format") + 1] in FORMATS
        if "--benchmark" in s.argv:
            assert s.argv[s.argv.index("--benchmark") + 1] in BENCHMARKS
    # each stage reads what the one before it wrote
    assert stages[1].argv[stages[1].argv.index("--dataset_name") + 1] == str(stages[0].output)
    rl = next(s for s in stages if s.name == "rl")
    assert rl.argv[rl.argv.index("--model_name_or_path") + 1] == str(stages[len(merges[:1]) + 1].output)
    assert all(s.argv[s.argv.index("--model_name_or_path") + 1] == str(stages[len(expected) - 5].output)
               for s in stages if s.name.startswith("eval_"))  # fmt: skip
    assert "missing inputs:" in out and str(tmp_path / "data" / "vstar_bench") in out


@pytest.mark.parametrize("name", SETS)
def test_a_lora_set_is_one_whose_recipes_train_adapters(name):
    chosen = SPEC["sets"][name]
    for stage in ("sft", "rl"):
        assert bool(load_recipe(REPO / chosen[stage]).values.get("use_peft")) == bool(chosen.get("lora")), stage


def test_the_plan_says_which_stages_are_done_and_resumes_an_interrupted_one(tmp_path, capsys):
    run = tmp_path / "run"
    for stage in ("convert", "sft"):
        (run / stage).mkdir(parents=True)
        (run / stage / ".done").write_text("{}")
    (run / "rl" / "checkpoint-3").mkdir(parents=True)
    (run / "rl" / "checkpoint-12").mkdir()
    (run / "eval_vstar").mkdir()  # started, no marker: evaluate.py resumes it by itself
    stages, out = dry_run(capsys, "--recipe_set", "tiny", "--data_root", str(tmp_path), "--run_dir", str(run))
    state = {
        line.split(": ")[0].split(". ")[1]: line.split(": ", 1)[1] for line in out.splitlines() if ". " in line[:4]
    }
    assert state["convert"] == f"done ({run / 'convert' / '.done'})" and state["sft"].startswith("done")
    assert state["rl"] == "resume from checkpoint-12" and state["eval_vstar"] == "to run"
    rl = next(s for s in stages if s.name == "rl")
    assert rl.command()[-2:] == ["--resume_from_checkpoint", "true"] and "--resume_from_checkpoint" not in rl.argv
    # the done stages' inputs are no longer needed: only the RL set and the benchmarks are missing
    missing = out.split("missing inputs:")[1]
    assert (
        str(tmp_path / "Mini-o3-Coldstart-Dataset") not in missing
        and str(tmp_path / "DeepEyes-Datasets-47k") in missing
    )


def test_missing_data_is_refused_before_any_stage_naming_each_path(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    (data / "vstar_bench").mkdir(parents=True)
    with pytest.raises(SystemExit) as refused:
        reproduce.main(["--recipe_set", "qwen2.5-vl-7b", "--data_root", str(data), "--run_dir", str(run)])
    message = str(refused.value)
    assert f"{data / 'Mini-o3-Coldstart-Dataset'}  <- Mini-o3/Mini-o3-Coldstart-Dataset: hf download" in message
    assert str(data / "DeepEyes-Datasets-47k" / "data_v0.8_visual_toolbox_v2.parquet") in message
    assert f"--local-dir {data / 'HR-Bench'}" in message and str(data / "vstar_bench") + " " not in message
    assert not run.exists()  # nothing ran, nothing was written


def test_an_unknown_set_or_a_missing_recipe_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"RECIPE_SET=nope: no such set .* known: qwen2.5-vl-7b, "):
        reproduce.main(["--recipe_set", "nope", "--data_root", str(tmp_path), "--dry_run"])
    sets = tmp_path / "sets.yaml"
    spec = {**SPEC, "sets": {"broken": {**SPEC["sets"]["tiny"], "rl": "recipes/tiny/rl/config_nope.yaml"}}}
    sets.write_text(yaml.safe_dump(spec))
    with pytest.raises(SystemExit, match=r"set broken, rl: recipes/tiny/rl/config_nope.yaml does not exist"):
        reproduce.main(["--recipe_set", "broken", "--data_root", str(tmp_path), "--sets_file", str(sets)])


# --------------------------------------------------------------------------------------------- reproduce.md
def test_the_report_reads_each_evaluation_the_rl_recipe_and_its_log(tmp_path):
    """On a run folder written by hand: the table's scores (HR-Bench: `mean`), tool use and gap rate, "—" for a
    benchmark not evaluated; the RL settings against the paper's recipe with the command line over the saved recipe;
    every curve drawn, the reasoning-action gap's (`semantic/z_mean`) included."""
    run = tmp_path / "run"
    metrics = {"vstar": {"accuracy": 0.5, "n": 4, "calls_per_sample": 1.25, "gap_rate": 0.2},
               "hrbench_4k": {"accuracy": 0.6, "mean": 0.75, "n": 4, "calls_per_sample": 1.0, "gap_rate": None}}  # fmt: skip
    for bench, values in metrics.items():
        (run / f"eval_{bench}").mkdir(parents=True)
        (run / f"eval_{bench}" / "metrics.json").write_text(json.dumps(values))
    (run / "rl").mkdir()
    paper = yaml.safe_load(PAPER_RECIPE.read_text())
    (run / "rl" / "recipe.yaml").write_text(yaml.safe_dump({**paper, "semantic_beta": 0.2, "output_dir": "x"}))
    command = ["accelerate", "launch", "rl.py", "--config", "r.yaml", "--learning_rate", "2e-6", "--max_steps", "3"]
    (run / "rl" / ".done").write_text(json.dumps({"command": command, "seconds": 5.0}))
    keys = ["reward", "rewards/gated_outcome_reward/mean", "rewards/semantic/mean", "tools/zoom_calls_per_rollout"]
    history = [{"step": step, **dict.fromkeys(keys, step / 4), "semantic/z_mean": 0.2 + step / 10} for step in (1, 2)]
    (run / "rl" / "trainer_state.json").write_text(json.dumps({"log_history": [*history, {"train_runtime": 1.0}]}))
    page = write_report(run, "tiny", SPEC["sets"]["tiny"], SPEC, ["rl"]).read_text()
    assert "| V* Bench | 50.0 | 4 | 1.25 | 20.0 | — [1] | 90.1 [2] |" in page
    assert "| HR-Bench 4K | 75.0 | 4 | 1.00 | — |" in page and "| HR-Bench 8K | — | — | — | — |" in page
    assert "- `semantic_beta`: 0.2 (the paper's recipe: 0.4)" in page and "`learning_rate`: 2e-06" in page
    assert "`max_steps: 3`" in page and "output_dir" not in page and "Stages: rl 5.0 s." in page
    for stem in ("reward", "r_sem", "zoom_calls", "gap"):
        assert f"](curves/{stem}.png)" in page and (run / "curves" / f"{stem}.png").stat().st_size > 1000


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
    """The 3B LoRA set's two training stages, as recipes/README.md's table gives them (scripts.memory)."""
    done = make("DRY=1", "RECIPE_SET=qwen2.5-vl-3b-lora", f"DATA_ROOT={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert "--accelerate single_gpu --num_gpus 1): training 12.91 GiB\n" in done.stdout
    assert "--accelerate single_gpu --num_gpus 1): training 15.64 GiB, generation 10.81 GiB\n" in done.stdout


def write_releases(root: Path) -> None:
    """DATA_ROOT as docs/reproduce.md lays it out, each release in its published layout, a few rows each: Mini-o3's
    cold start (tests/release_fixtures.py), DeepEyes-47k, V*, HR-Bench 4K/8K and MME-RealWorld-Lite (the layouts of
    tests/test_benchmarks.py's fixtures)."""
    call = {"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}
    write_mini_o3(root / "Mini-o3-Coldstart-Dataset", [mini_o3_row([call], index=i) for i in range(2)])
    rows = [
        {"data_source": "vstar", "images": [{"bytes": image_bytes((120, 90)), "path": None}],
         "prompt": [{"role": "user", "content": f"<image>\n{question}"}], "ability": "vl", "env_name": "visual_toolbox_v2",
         "reward_model": {"ground_truth": truth, "style": "model"}, "extra_info": {"question": f"<image>\n{question}"}}
        for question, truth in [("What is the color of the bag?", "black"), ("How many cups?", "3")]
    ]  # fmt: skip
    (root / "DeepEyes-Datasets-47k").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), root / "DeepEyes-Datasets-47k" / "data_v0.8_visual_toolbox_v2.parquet")
    vstar = root / "vstar_bench"
    (vstar / "direct_attributes").mkdir(parents=True)
    questions = [
        ("What is the color of the cup?", ["red", "blue"], "B"),
        ("What is the glove made of?", ["rubber", "cotton"], "A"),
    ]
    lines = []
    for qid, (question, options, label) in enumerate(questions):
        image = f"direct_attributes/sa_{qid}.jpg"
        (vstar / image).write_bytes(image_bytes((80 + qid, 60)))
        text = "\n".join([question, *(f"({chr(65 + i)}) {option}" for i, option in enumerate(options)), VSTAR_SUFFIX])
        record = {"image": image, "text": text, "category": "direct_attributes", "question_id": qid, "label": label}
        lines.append(json.dumps(record))
    (vstar / "test_questions.jsonl").write_text("\n".join(lines) + "\n")
    (root / "HR-Bench").mkdir()
    for k in ("4k", "8k"):
        pd.DataFrame(hrbench_rows()).to_csv(root / "HR-Bench" / f"hr_bench_{k}.tsv", sep="\t", index=False)
    lite = root / "MME-RealWorld-lite-lmms-eval" / "data"
    lite.mkdir(parents=True)
    mme = [{"index": i, "question": item["Text"], "multi-choice options": item["Answer choices"],
            "answer": item["Ground truth"], "category": f"{item['Task']}/{item['Subtask']}",
            "l2-category": item["Category"], "bytes": b64(image_bytes())} for i, item in enumerate(mme_items())]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(mme), lite / "train-00000-of-00001.parquet")


# 2 steps each, a short rollout budget (evaluation takes it from the RL checkpoint's record) and 2 rows per benchmark
TINY_ARGS = ('--sft_args "--max_steps 2 --per_device_train_batch_size 2" --rl_args "--max_steps 2 '
             '--max_completion_length 96" --eval_args "--limit 2"')  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tiny_kit, tmp_path_factory):
    """`make reproduce RECIPE_SET=tiny` twice on the same folders: the run, then a rerun that must skip it all."""
    root = tmp_path_factory.mktemp("reproduce")
    write_releases(root / "data")
    argv = ["RECIPE_SET=tiny", f"DATA_ROOT={root / 'data'}", f"RUN_DIR={root / 'run'}", f"ARGS={TINY_ARGS}"]
    first = make(*argv)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = make(*argv)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    return root / "run", first.stdout, second.stdout


STAGES = ["convert", "sft", "rl", *(f"eval_{b}" for b in SPEC["benchmarks"])]


@pytest.mark.slow
def test_the_tiny_reproduction_runs_every_stage_and_marks_it_done(tiny_run):
    run, first, _ = tiny_run
    assert [
        line.split(":")[0].removeprefix("==> ") for line in first.splitlines() if line.startswith("==> ")
    ] == STAGES
    for stage in STAGES:
        record = json.loads((run / stage / ".done").read_text())
        assert record["command"][0].endswith(("python", "python3", "accelerate")) and record["seconds"] > 0
    assert (run / "sft" / "model.safetensors").is_file() and (run / "rl" / "trainer_state.json").is_file()
    metrics = json.loads((run / "eval_hrbench_8k" / "metrics.json").read_text())
    assert metrics["n"] == 2 and "mean" in metrics


@pytest.mark.slow
def test_a_second_run_skips_every_finished_stage(tiny_run):
    run, _, second = tiny_run
    assert [line for line in second.splitlines() if line.startswith("==> ")] == [
        f"==> {stage}: done, skipped ({run / stage / '.done'})" for stage in STAGES
    ]


@pytest.mark.slow
def test_the_run_ends_with_reproduce_md_the_table_and_the_curves(tiny_run):
    run, _, second = tiny_run
    page = (run / "reproduce.md").read_text()
    assert f"report: {run / 'reproduce.md'}" in second
    assert "| benchmark | ours | n | calls / sample | gap rate | MAPO (paper) | DeepEyes-7B |" in page
    for bench in SPEC["benchmarks"].values():  # each evaluation's score (%) and rows, from its metrics.json
        assert re.search(rf"^\| {re.escape(bench['title'])} \| \d+\.\d \| 2 \| \d\.\d\d \|", page, re.M), bench
    assert "| V* Bench |" in page and "90.1 [2]" in page and "`max_steps`: " not in page  # paper sets no max_steps
    assert "set by the run, not by the paper's recipe: " in page and "`max_steps: 2`" in page
    for stem in ("reward", "r_sem", "zoom_calls"):
        assert f"](curves/{stem}.png)" in page and (run / "curves" / f"{stem}.png").stat().st_size > 1000
    assert "mean z_t per call" in page  # drawn, or said not logged (no valid call in one tiny step)
