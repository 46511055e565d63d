"""`make reproduce` (scripts/reproduce.py, recipes/reproduce.yaml): every set's plan names files that exist, the plan
reads the run folder's markers and checkpoints, missing data is refused before any stage naming the path, and the
tiny set runs end to end through the Makefile target on release-shaped data written here (a second run skips every
stage), ending with reproduce.md: the table and the curves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from fake_checkpoint import write_checkpoint
from test_benchmarks import image_bytes
from trl import ModelConfig

import rl
from configs import MAPOConfig, ScriptArguments
from data import load_split
from data.benchmarks import BENCHMARKS
from data.converters import FORMATS
from evaluation import reproduce_time
from evaluation.reproduction import PAPER_RECIPE, settings_that_differ, write_report
from repairs.resume import last_complete_checkpoint
from rewards import check_rule_rewards
from scripts import reproduce
from tools import ToolConfig
from utils.recipes import flag_values, load_recipe, parse_args_and_record

REPO = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load(reproduce.SETS_FILE.read_text(encoding="utf-8"))
SETS = sorted(SPEC["sets"])
RL_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
NO_EXTRA = {"sft": [], "rl": [], "eval": []}


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
def stage_names(chosen: dict, benchmarks=SPEC["benchmarks"]) -> list[str]:
    merges = ["sft_merge", "rl_merge"] if chosen.get("lora") else []
    evals = lambda model: [f"eval_{model}_{b}" for b in benchmarks]  # noqa: E731
    return [*evals("base"), "convert", "sft", *merges[:1], *evals("sft"), "rl_probe", "rl", *merges[1:], *evals("rl")]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("name", SETS)
def test_every_set_plans_commands_whose_files_exist(name, tmp_path, capsys):
    stages, out = dry_run(capsys, "--recipe_set", name, "--data_root", str(tmp_path / "data"))
    chosen = SPEC["sets"][name]
    assert [s.name for s in stages] == stage_names(chosen)
    by_name = {s.name: s for s in stages}
    for s in stages:
        assert " ".join(s.argv) in out.replace("'", "")  # printed as run (shlex quotes nothing here)
        for file in named_files(s.argv):
            assert file.is_file(), f"{name}, {s.name}: {file} does not exist"
        if "--format" in s.argv:
            assert flag(s.argv, "--format") in FORMATS
        if "--benchmark" in s.argv:
            assert flag(s.argv, "--benchmark") in BENCHMARKS
    # each stage reads what the one before it wrote: SFT the conversion, the probe and RL the SFT (merged) output,
    # each evaluation its model; the base model is the SFT recipe's starting point
    assert flag(by_name["sft"].argv, "--dataset_name") == str(by_name["convert"].output)
    start = by_name["sft_merge" if chosen.get("lora") else "sft"].output
    end = by_name["rl_merge" if chosen.get("lora") else "rl"].output
    assert flag(by_name["rl"].argv, "--model_name_or_path") == flag(by_name["rl_probe"].argv, "--model_name_or_path")
    assert flag(by_name["rl"].argv, "--model_name_or_path") == str(start)
    base = load_recipe(REPO / chosen["sft"]).values["model_name_or_path"]
    for model, policy in (("base", base), ("sft", str(start)), ("rl", str(end))):
        assert all(
            flag(by_name[f"eval_{model}_{b}"].argv, "--model_name_or_path") == policy for b in SPEC["benchmarks"]
        )

    # the three models' evaluations of a benchmark differ in the model and the folder only: one protocol
    def protocol(argv):
        return [a for i, a in enumerate(argv) if not i or argv[i - 1] not in ("--model_name_or_path", "--output_dir")]

    for b in SPEC["benchmarks"]:
        assert protocol(by_name[f"eval_base_{b}"].argv) == protocol(by_name[f"eval_rl_{b}"].argv)
        assert protocol(by_name[f"eval_sft_{b}"].argv) == protocol(by_name[f"eval_rl_{b}"].argv)
    # RL reads the fine-grained and ThinkLite files, never the chart file; the probe samples the same files
    files = [str(tmp_path / "data" / "DeepEyes-Datasets-47k" / f) for f in (
        "data_0.1.2_visual_toolbox_v2.parquet", "data_thinklite_reasoning_acc.parquet")]  # fmt: skip
    for stage in ("rl", "rl_probe"):
        argv = by_name[stage].argv
        assert argv[argv.index("--dataset_path" if stage == "rl" else "--data_path") + 1 :][:2] == files
        assert "data_v0.8_visual_toolbox_v2.parquet" not in " ".join(argv)
    assert "~22k rows published, not downloaded" in out and "left out: data_v0.8_visual_toolbox_v2.parquet" in out
    assert "missing inputs" in out and str(tmp_path / "data" / "vstar_bench") in out
    gpu = chosen["accelerate"] not in ("cpu", "multi_cpu")
    assert ("estimated time still to run: ~" in out) == gpu  # stated throughput assumptions, GPU sets only
    if gpu:
        assert re.search(r"^\d+\. rl: to run   \[~\d+\.\d h\]$", out, re.M), out


def test_the_8_gpu_sets_default_to_vllm_and_fit_a_week_transformers_does_not(tmp_path, capsys):
    """The 7B set's default backend is vLLM colocated (its `rl_backend`): RL gets the set's colocate flags and the
    plan's total, backend named, is under 7 days; RL_BACKEND=transformers is still offered, and its plan says it
    overruns the week and what brings it under."""
    root = ["--recipe_set", "qwen2.5-vl-7b", "--data_root", str(tmp_path)]
    fast, fast_out = dry_run(capsys, *root)
    plain, plain_out = dry_run(capsys, *root, "--rl_backend", "transformers")
    rl = {s.name: s for s in fast}["rl"]
    assert rl.argv[-len(SPEC["sets"]["qwen2.5-vl-7b"]["rl_vllm"]) :] == SPEC["sets"]["qwen2.5-vl-7b"]["rl_vllm"]
    assert {s.name: s for s in plain}["rl"].hours > 3 * rl.hours  # generation dominates the transformers estimate
    assert "RL vllm" in fast_out and "RL transformers" in plain_out
    total = re.search(r"^estimated time still to run: ~(\d+) h \(([\d.]+) days\) with RL's rollouts and the evaluations "
                      r"on vllm ", fast_out, re.M)  # fmt: skip
    assert total and int(total.group(1)) < reproduce_time.WEEK_HOURS and "OVER A WEEK" not in fast_out
    slow = re.search(r"^estimated time still to run: ~(\d+) h .* on transformers ", plain_out, re.M)
    assert slow and int(slow.group(1)) > reproduce_time.WEEK_HOURS
    assert "OVER A WEEK (168 h): RL_BACKEND=vllm (colocated) or fewer RL steps" in plain_out
    assert SPEC["sets"]["qwen3-vl-8b"]["rl_backend"] == "vllm" and "rl_backend" not in SPEC["sets"]["tiny"]


def test_every_evaluation_runs_on_rl_s_backend_with_its_engine_settings(tmp_path):
    """Under vLLM the base evaluation, the first stage to load a model, builds the engine RL will build (its memory
    share, dtype, eager mode), and so does every other evaluation and the probe; under transformers none asks vLLM."""
    chosen, spec = reproduce.load_set("tiny")
    chosen = {**chosen, "name": "tiny"}
    for backend in ("vllm", "transformers"):
        stages = reproduce.plan(chosen, spec, tmp_path, tmp_path / "run", NO_EXTRA, rl_backend=backend)
        for s in stages:
            if "evaluate.py" in s.argv:
                settings = flag_values(s.argv[s.argv.index("evaluate.py") + 1 :])
                if backend == "vllm":
                    assert settings["backend"] == "vllm" and settings["dtype"] == "float32", s.name
                    assert settings["vllm_enforce_eager"] is True, s.name
                else:
                    assert "backend" not in settings and "vllm_enforce_eager" not in settings, s.name
    seven = reproduce.plan({**SPEC["sets"]["qwen2.5-vl-7b"], "name": "qwen2.5-vl-7b"}, SPEC, tmp_path, tmp_path,
                           NO_EXTRA, rl_backend="vllm")  # fmt: skip
    base = {s.name: s for s in seven}["eval_base_vstar"].argv
    assert flag(base, "--backend") == "vllm" and flag(base, "--vllm_gpu_memory_utilization") == "0.3"


def test_the_rl_files_are_counted_from_their_parquet_footers(tmp_path, capsys):
    folder = tmp_path / "DeepEyes-Datasets-47k"
    folder.mkdir()
    for rows, name in ((3, "data_0.1.2_visual_toolbox_v2.parquet"), (5, "data_thinklite_reasoning_acc.parquet")):
        pq.write_table(pa.table({"x": list(range(rows))}), folder / name)
    stages, out = dry_run(capsys, "--recipe_set", "qwen2.5-vl-7b", "--data_root", str(tmp_path))
    assert f"{folder / 'data_0.1.2_visual_toolbox_v2.parquet'}: 3 rows;" in out and ": 5 rows;" in out
    assert {s.name: s for s in stages}["rl"].hours < 1  # 8 rows are one step


def test_chart_rows_are_refused_under_a_rule_based_reward_naming_the_fix():
    sources = ["deepeyes/vstar", "deepeyes/chart", "deepeyes/chart"]
    with pytest.raises(ValueError, match=r"split train: 2 rows of deepeyes/chart .* reward_funcs: \[judge\]"):
        check_rule_rewards(sources, ["gated_outcome"], where="split train")
    check_rule_rewards(sources, ["judge"], where="split train")  # a judge scores them
    check_rule_rewards(sources, ["gated_outcome", "mypkg.rewards:mine"], where="x")  # the recipe's own choice
    check_rule_rewards(["deepeyes/vstar", "deepeyes/thinklite_eureka"], ["gated_outcome"], where="x")


def test_rl_refuses_the_chart_file_before_the_model_loads(tiny_kit, tmp_path, monkeypatch):
    """rl.build_trainer on a DeepEyes chart file with the tiny recipe's gated_outcome: refused after the data is read
    and before any weight loads."""
    chart = tmp_path / "data_v0.8_visual_toolbox_v2.parquet"
    row = {"data_source": "chart", "images": [{"bytes": image_bytes((60, 40)), "path": None}],
           "reward_model": {"ground_truth": "0.25", "style": "model"}, "extra_info": {"question": "What is the slope?"}}  # fmt: skip
    pq.write_table(pa.Table.from_pylist([row]), chart)
    monkeypatch.setattr(rl, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    argv = ["--config", "recipes/tiny/rl/config_mapo.yaml", "--model_name_or_path", str(tiny_kit["policy"]),
            "--dataset_name", "deepeyes", "--dataset_path", str(chart), "--output_dir", str(tmp_path / "rl")]  # fmt: skip
    monkeypatch.chdir(REPO)
    with pytest.raises(ValueError, match=r"1 rows of deepeyes/chart .*Leave their file out of dataset_path"):
        rl.build_trainer(*parse_args_and_record(RL_TYPES, argv))


def test_several_dataset_files_are_read_in_turn(tmp_path):
    files = []
    for k in range(2):
        row = {"data_source": "vstar", "images": [{"bytes": image_bytes((60 + k, 40)), "path": None}],
               "reward_model": {"ground_truth": "red"}, "extra_info": {"question": f"Colour {k}?"}}  # fmt: skip
        files.append(tmp_path / f"part{k}.parquet")
        pq.write_table(pa.Table.from_pylist([row, row]), files[-1])
    args = ScriptArguments(dataset_name="deepeyes", dataset_path=[str(f) for f in files])
    assert load_split(args, "train")["id"] == ["part0-0", "part0-1", "part1-0", "part1-1"]
    assert ScriptArguments(dataset_name="deepeyes", dataset_path=str(files[0])).dataset_path == [str(files[0])]


# ------------------------------------------------------------------------------------------- markers and states
def done(stage_dir: Path, command: list[str], inputs: dict | None = None, run: str = "r") -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / ".done").write_text(json.dumps({"command": command, "id": run, "inputs": inputs or {}}))


def tiny_plan(tmp_path: Path) -> list[reproduce.Stage]:
    chosen, spec = reproduce.load_set("tiny")
    return reproduce.plan({**chosen, "name": "tiny"}, spec, tmp_path / "data", tmp_path / "run", NO_EXTRA)


def gpu_plan(tmp_path: Path, extra: dict = NO_EXTRA) -> tuple[dict, list[reproduce.Stage]]:
    chosen, spec = reproduce.load_set("qwen2.5-vl-7b")
    chosen = {**chosen, "name": "qwen2.5-vl-7b"}
    return chosen, reproduce.plan(chosen, spec, tmp_path / "data", tmp_path / "run", extra)


def test_the_plan_reads_markers_and_resumes_from_the_last_complete_checkpoint(tmp_path, capsys):
    stages = {s.name: s for s in tiny_plan(tmp_path)}
    run = tmp_path / "run"
    done(run / "convert", stages["convert"].argv, run="c1")
    done(run / "sft", stages["sft"].argv, {"convert": "c1"}, run="s1")
    write_checkpoint(run / "rl", 3)
    (run / "rl" / "checkpoint-12").mkdir()  # killed while saving: no trainer_state.json
    (run / "eval_rl_vstar").mkdir()  # started, no marker: evaluate.py resumes it by itself
    states = reproduce.stage_states(list(stages.values()), set())
    assert states["convert"] == "done" and states["sft"] == "done" and states["eval_rl_vstar"] == "to run"
    assert states["rl"] == "resume from checkpoint-3"
    assert stages["rl"].command()[-2:] == ["--resume_from_checkpoint", "true"]
    assert last_complete_checkpoint(run / "rl") == str(run / "rl" / "checkpoint-3")
    # the done stages' inputs are no longer needed: the cold start is not missing, the RL data is
    missing = "\n".join(reproduce.missing_inputs(list(stages.values()), states))
    assert "Mini-o3-Coldstart-Dataset" not in missing and "DeepEyes-Datasets-47k" in missing


def test_a_changed_command_is_refused_showing_both_unless_forced(tmp_path, capsys):
    stages = {s.name: s for s in tiny_plan(tmp_path)}
    run = tmp_path / "run"
    done(run / "convert", stages["convert"].argv, run="c1")
    done(run / "sft", [*stages["sft"].argv[:-2], "--max_steps", "7"], {"convert": "c1"}, run="s1")
    done(run / "eval_sft_vstar", stages["eval_sft_vstar"].argv, {"sft": "s1"}, run="e1")
    states = reproduce.stage_states(list(stages.values()), set())
    assert states["sft"] == "changed" and states["eval_sft_vstar"] == "stale" and states["convert"] == "done"
    with pytest.raises(SystemExit) as refused:
        reproduce.main(["--recipe_set", "tiny", "--data_root", str(tmp_path / "data"), "--run_dir", str(run)])
    message = str(refused.value)
    assert "sft is done with another command or recipe than the plan's:" in message
    assert "--max_steps 7" in message.split("done: ")[1].split("\n")[0]
    assert "  plan: " in message and "FORCE=sft reruns it" in message
    assert not (run / "sft_merge").exists() and not (run / "eval_base_vstar").exists()  # nothing ran
    forced = reproduce.stage_states(list(stages.values()), {"sft"})
    assert forced["sft"] == forced["eval_sft_vstar"] == forced["rl"] == forced["eval_rl_vstar"] == "forced"
    assert forced["convert"] == "done" and forced["eval_base_vstar"] == "to run"
    # rerunning convert makes everything that read it stale, never silently reused
    done(run / "sft", stages["sft"].argv, {"convert": "c0"}, run="s1")
    assert reproduce.stage_states(list(stages.values()), set())["sft"] == "stale"


def test_the_dry_run_marks_changed_stages_and_what_would_not_start(tmp_path, capsys):
    stages = {s.name: s for s in tiny_plan(tmp_path)}
    done(tmp_path / "run" / "convert", ["python", "-m", "data.convert", "--other"], run="c1")
    _, out = dry_run(capsys, "--recipe_set", "tiny", "--data_root", str(tmp_path / "data"), "--run_dir",
                     str(tmp_path / "run"))  # fmt: skip
    assert re.search(r"^\d+\. convert: changed$", out, re.M) and re.search(r"^\d+\. sft: forced|to run", out, re.M)
    assert "would not start:" in out and "FORCE=convert" in out
    assert stages["convert"].argv[-2:] == ["--preview", "20"]  # the conversion is checked by eye too


def test_missing_data_is_refused_before_any_stage_naming_each_path(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    (data / "vstar_bench").mkdir(parents=True)
    with pytest.raises(SystemExit) as refused:
        reproduce.main(["--recipe_set", "qwen2.5-vl-7b", "--data_root", str(data), "--run_dir", str(run)])
    message = str(refused.value)
    assert f"{data / 'Mini-o3-Coldstart-Dataset'}  <- Mini-o3/Mini-o3-Coldstart-Dataset: hf download" in message
    assert str(data / "DeepEyes-Datasets-47k" / "data_0.1.2_visual_toolbox_v2.parquet") in message
    assert f"--local-dir {data / 'HR-Bench'}" in message and str(data / "vstar_bench") + " " not in message
    assert not run.exists()  # nothing ran, nothing was written


def test_a_missing_logging_or_accelerate_backend_is_refused_before_any_stage(tmp_path):
    """With every input present, the 7B set still does not start here: DeepSpeed (zero3) and wandb (report_to) are
    GPU extras, named with the fix before the first stage rather than days later."""
    data, run = tmp_path / "data", tmp_path / "run"
    for stage in gpu_plan(tmp_path)[1]:
        for path in stage.inputs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("") if path.suffix else path.mkdir(exist_ok=True)
    with pytest.raises(SystemExit) as refused:
        reproduce.main(["--recipe_set", "qwen2.5-vl-7b", "--data_root", str(data), "--run_dir", str(run)])
    message = str(refused.value)
    assert message.startswith("the installed stack cannot run this plan (nothing was run):")
    assert "zero3.yaml: distributed_type DEEPSPEED needs deepspeed" in message
    assert "sft (recipes/Qwen2.5-VL-7B-Instruct/sft/config_sft.yaml): report_to: wandb (pip install wandb" in message
    assert not run.exists()
    # the command line's flags count: --report_to none leaves DeepSpeed the only problem
    chosen, stages = gpu_plan(tmp_path, {"sft": ["--report_to", "none"], "rl": ["--report_to", "none"], "eval": []})
    problems = reproduce.environment_problems(chosen, stages, {s.name: "to run" for s in stages})
    assert len(problems) == 1 and "deepspeed" in problems[0]


def test_an_unknown_set_or_a_missing_recipe_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"RECIPE_SET=nope: no such set .* known: qwen2.5-vl-7b, "):
        reproduce.main(["--recipe_set", "nope", "--data_root", str(tmp_path), "--dry_run"])
    sets = tmp_path / "sets.yaml"
    spec = {**SPEC, "sets": {"broken": {**SPEC["sets"]["tiny"], "rl": "recipes/tiny/rl/config_nope.yaml"}}}
    sets.write_text(yaml.safe_dump(spec))
    with pytest.raises(SystemExit, match=r"set broken, rl: recipes/tiny/rl/config_nope.yaml does not exist"):
        reproduce.main(["--recipe_set", "broken", "--data_root", str(tmp_path), "--sets_file", str(sets)])


# ---------------------------------------------------------------------------------------------------- the gates
def test_sft_does_not_start_on_a_conversion_that_skipped_too_much(tmp_path):
    stats = {"rows_read": 10, "rows_skipped": {"crop_mismatch": 2, "missing_image": 1},
             "skipped_examples": {"crop_mismatch": ["a.parquet row 3: call 1"], "missing_image": ["row 7"]}}  # fmt: skip
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    verdict = reproduce.conversion_verdict(tmp_path, 0.2)
    assert verdict.startswith("the conversion skipped 3 of 10 rows (30% > --max_skip_rate 0.2); top reasons: ")
    assert "crop_mismatch 2 (e.g. a.parquet row 3: call 1); missing_image 1 (e.g. row 7)" in verdict
    assert reproduce.conversion_verdict(tmp_path, 0.3) is None
    assert "is missing" in reproduce.conversion_verdict(tmp_path / "nope", 0.2)


# --------------------------------------------------------------------------------------------- reproduce.md
def test_the_report_reads_each_evaluation_the_rl_recipe_and_its_log(tmp_path):
    """On a run folder written by hand: a row per model of ours and per published system, each with its protocol
    (ours from the evaluation's own eval_args.json), HR-Bench by `mean`, "—" where nothing was evaluated or published,
    the marked cell footnoted; tool use per model; the probe; the RL settings against the paper's recipe with the
    command line over the saved recipe; every curve drawn, the reasoning-action gap's included."""
    run = tmp_path / "run"
    metrics = {("base", "vstar"): {"accuracy": 0.25, "n": 4, "calls_per_sample": 0.0, "gap_rate": None},
               ("rl", "vstar"): {"accuracy": 0.5, "n": 4, "calls_per_sample": 1.25, "valid_call_rate": 0.8, "gap_rate": 0.2},
               ("rl", "hrbench_4k"): {"accuracy": 0.6, "mean": 0.75, "n": 4, "calls_per_sample": 1.0, "gap_rate": None}}  # fmt: skip
    for (model, bench), values in metrics.items():
        (run / f"eval_{model}_{bench}").mkdir(parents=True)
        (run / f"eval_{model}_{bench}" / "metrics.json").write_text(json.dumps(values))
    eval_args = {"temperature": 0.0, "max_tool_calling_iterations": 5, "max_completion_length": 8192,
                 "tool": {"max_pixels": 1003520, "crop_max_pixels": 401408}}  # fmt: skip
    (run / "eval_rl_vstar" / "eval_args.json").write_text(json.dumps(eval_args))
    (run / "rl_probe").mkdir()
    probe = {"n": 64, "rewards": {"gated_outcome": {"mean": 0.125, "scored": 64, "paid": 8}}}
    (run / "rl_probe" / "metrics.json").write_text(json.dumps(probe))
    (run / "rl").mkdir()
    paper = yaml.safe_load(PAPER_RECIPE.read_text())
    (run / "rl" / "recipe.yaml").write_text(yaml.safe_dump({**paper, "semantic_beta": 0.2, "output_dir": "x"}))
    command = ["accelerate", "launch", "rl.py", "--config", "r.yaml", "--learning_rate", "2e-6", "--max_steps", "3"]
    (run / "rl" / ".done").write_text(json.dumps({"command": command, "seconds": 5.0}))
    keys = ["reward", "rewards/gated_outcome_reward/mean", "rewards/semantic/mean", "tools/zoom_calls_per_rollout"]
    history = [{"step": step, **dict.fromkeys(keys, step / 4), "semantic/z_mean": 0.2 + step / 10} for step in (1, 2)]
    (run / "rl" / "trainer_state.json").write_text(json.dumps({"log_history": [*history, {"train_runtime": 1.0}]}))
    page = write_report(run, "tiny", SPEC["sets"]["tiny"], SPEC, ["rl"]).read_text()
    assert "| system | V* Bench | HR-Bench 4K | HR-Bench 8K | MME-RealWorld-Lite | protocol |" in page
    assert "| ours: base model | 25.0 | — | — | — | not run yet |" in page
    assert "| ours: SFT | — | — | — | — | not run yet |" in page
    assert ("| ours: MAPO (RL) | 50.0 | 75.0 | — | — | greedy, 1 sample (Avg@1); images <= 1003520 px, crops <= "
            "401408 px; <= 5 zoom rounds in 8192 tokens; ") in page  # fmt: skip
    assert "| DeepEyes-7B [2] | 90.1 | 75.1 | 72.6 | 53.2 | greedy (temperature 0)" in page
    assert "| Qwen2.5-VL-7B (DeepEyes' tables) [3] | 71.2 | 68.8 | 65.3 | 42.3 (*) |" in page
    assert "(*) not marked reproduced in DeepEyes' Table 2" in page
    assert "| Mini-o3-7B [4] | 88.2 | 77.5 | 73.3 | — | Avg@32" in page  # full MME-RealWorld, not Lite: left out
    assert (
        "| MAPO (RL) | V* Bench | 4 | 1.25 | 80.0 | 20.0 |" in page and "| base model | V* Bench | 4 | 0.00 |" in page
    )
    # 8 of 64: 12.5%, SE sqrt(0.125 x 0.875 / 64) = 4.1%; the tiny set's floor is 0: none said
    assert "- gated_outcome: paid 8 of 64 rollouts (12.5% ± 4.1% SE, mean 0.125)" in page
    assert "RL starts when a reward" not in page
    assert "- `semantic_beta`: 0.2 (the paper's recipe: 0.4)" in page and "`learning_rate`: 2e-06" in page
    assert "`max_steps: 3`" in page and "output_dir" not in page and "Stages: rl 5.0 s." in page
    for stem in ("reward", "r_sem", "zoom_calls", "gap"):
        assert f"](curves/{stem}.png)" in page and (run / "curves" / f"{stem}.png").stat().st_size > 1000


def test_the_report_states_the_recipe_rl_ran_not_one_edited_since(tmp_path):
    """rl/recipe.yaml is rewritten by every start of rl.py; the resolved recipe the RL stage's record keeps is the one
    its checkpoints were trained under (the plan refuses to resume them under another): the report reads that."""
    run = tmp_path / "run"
    (run / "rl").mkdir(parents=True)
    paper = yaml.safe_load(PAPER_RECIPE.read_text())
    (run / "rl" / "recipe.yaml").write_text(yaml.safe_dump({**paper, "learning_rate": 3.0e-6}))
    record = {"command": ["accelerate", "launch", "rl.py"], "recipe": {**paper, "learning_rate": 5.0e-7}}
    (run / "rl" / ".started").write_text(json.dumps(record))
    assert "- `learning_rate`: 5e-07 (the paper's recipe: 1e-06)" in settings_that_differ(run, SPEC)
    (run / "rl" / ".done").write_text(json.dumps({**record, "recipe": paper}))
    assert settings_that_differ(run, SPEC)[0] == "- none: the RL run used the paper's recipe"


@pytest.mark.parametrize("name", SETS)
def test_the_three_rows_of_a_set_share_one_pixel_budget_and_crop_ceiling(name, tmp_path):
    """Every evaluation names max_pixels and crop_max_pixels: the base model, which records none, then runs under the
    ceilings the SFT and RL checkpoints record, not under mapo_paper.yaml's (the tiny set's base was evaluated with
    401,408-pixel crops, its checkpoints with 12,544)."""
    chosen, spec = reproduce.load_set(name)
    for s in reproduce.plan({**chosen, "name": name}, spec, tmp_path, tmp_path / "run", NO_EXTRA):
        if "evaluate.py" in s.argv:
            assert {"max_pixels", "crop_max_pixels"} <= set(flag_values(s.argv)), (name, s.name)
    if name == "tiny":  # the kit's processor budget, which its SFT checkpoint records
        base = {s.name: s for s in reproduce.plan({**chosen, "name": name}, spec, tmp_path, tmp_path, NO_EXTRA)}
        assert flag(base["eval_base_vstar"].argv, "--crop_max_pixels") == "12544"


def test_reproduce_md_states_where_the_batch_departs_from_deepeyes():
    """DeepEyes' released script (examples/agent/final_merged_v1v8_thinklite.sh): 256 prompts a step, 16 rollouts
    each, 20,480 response tokens; the 7B recipe: 8 x 4 x 8 = 256 rollouts, 32 prompts of 8, 8,192 tokens. The note
    says so, and no longer that the batch sizes follow DeepEyes."""
    notes = " ".join(SPEC["notes"])
    rl = reproduce.recipe_values(SPEC["sets"]["qwen2.5-vl-7b"]["rl"], [])
    rollouts = rl["per_device_train_batch_size"] * rl["gradient_accumulation_steps"] * 8
    assert (rollouts // rl["num_generations"], rl["num_generations"], rl["max_completion_length"]) == (32, 8, 8192)
    assert "256 prompts a step x 16 rollouts" in notes and "20,480 response tokens" in notes
    assert "32 prompts x 8 rollouts" in notes and "8,192" in notes and "Batch sizes" not in notes
