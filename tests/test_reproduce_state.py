"""`make reproduce`'s states (evaluation/reproduce_state.py): a forced stage that started resumes from its last complete
checkpoint on a rerun, with or without FORCE, and a folder holding checkpoints or weights is never deleted unless
DISCARD names its stage. Run folders written by hand; the tiny run interrupted and resumed is in
tests/test_reproduce.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from fake_checkpoint import write_checkpoint

from evaluation.reproduce_state import FORCED, STARTED, end_round, forced_round, keep_round, stage_states
from scripts import reproduce

NO_EXTRA = {"sft": [], "rl": [], "eval": []}


def tiny_plan(tmp_path: Path) -> dict[str, reproduce.Stage]:
    chosen, spec = reproduce.load_set("tiny")
    stages = reproduce.plan({**chosen, "name": "tiny"}, spec, tmp_path / "data", tmp_path / "run", NO_EXTRA)
    return {s.name: s for s in stages}


def done(stage: reproduce.Stage, run: str, inputs: dict | None = None, round_id: str | None = None) -> None:
    stage.output.mkdir(parents=True, exist_ok=True)
    record = {"command": stage.argv, "id": run, "inputs": inputs or {}, "round": round_id}
    (stage.output / ".done").write_text(json.dumps(record))


def finished_run(tmp_path: Path) -> dict[str, reproduce.Stage]:
    """The tiny plan, every stage done in order, RL with two checkpoints and its final weights."""
    stages = tiny_plan(tmp_path)
    ids = {}
    for s in stages.values():
        ids[s.name] = f"{s.name}-1"
        done(s, ids[s.name], {name: ids[name] for name in s.reads})
    for step in (2, 4):
        write_checkpoint(stages["rl"].output, step)
    (stages["rl"].output / "model.safetensors").write_bytes(b"weights")
    return stages


def test_force_does_not_delete_a_folder_holding_checkpoints_unless_discard_names_it(tmp_path):
    stages = finished_run(tmp_path)
    run, plan = tmp_path / "run", list(stages.values())
    states = stage_states(plan, forced_round(run, plan, {"rl"}, set()))
    assert states["rl"] == "would delete" and states["eval_rl_vstar"] == "forced" and states["sft"] == "done"
    message = "\n".join(reproduce.blocked(plan, states))
    assert f"rl is forced, which reruns it from step 0 and deletes {run / 'rl'}: it holds checkpoint-2, " in message
    assert "checkpoint-4, model.safetensors; say so by name with DISCARD=rl" in message
    assert "DISCARD=rl reruns it from an empty folder" in message
    states = stage_states(plan, forced_round(run, plan, set(), {"rl"}))  # DISCARD: said by name, and forced
    assert states["rl"] == "forced" and states["eval_rl_vstar"] == "forced" and not reproduce.blocked(plan, states)
    # a forced stage that holds nothing of value needs no DISCARD
    assert stage_states(plan, forced_round(run, plan, {"eval_base_vstar"}, set()))["eval_base_vstar"] == "forced"


def test_a_changed_stage_holding_weights_is_advised_discard_its_readers_nothing(tmp_path):
    stages = finished_run(tmp_path)
    plan = list(stages.values())
    done(stages["sft"], "sft-2", {"convert": "convert-1"})  # rerun by hand since: everything after it is stale
    (stages["sft"].output / "model.safetensors").write_bytes(b"weights")
    states = stage_states(plan, set())
    assert states["eval_sft_vstar"] == states["rl"] == "stale"
    advice = reproduce.blocked(plan, states)[-1]
    forced = [f"eval_sft_{b}" for b in ("vstar", "hrbench_4k", "hrbench_8k", "mme_realworld_lite")] + ["rl_probe"]
    # RL's evaluations follow RL: no FORCE names them
    assert advice.startswith(f"FORCE={','.join(forced)} DISCARD=rl reruns them from an empty folder, with the stages")


def test_a_forced_rl_that_started_resumes_on_a_rerun_of_the_same_command_or_of_none(tmp_path):
    """FORCE=rl DISCARD=rl starts a round; RL starts in it (its .started) and is interrupted after checkpoint-3. The
    same command again, or none, goes on with the round: RL resumes from checkpoint-3, its evaluation (done before the
    round) is forced, not stale; once RL finishes in the round it is done, and the evaluation that started in it
    resumes its samples. The plan's end closes the round."""
    stages = finished_run(tmp_path)
    run, plan = tmp_path / "run", list(stages.values())
    rl = stages["rl"]
    pending = forced_round(run, plan, set(), {"rl"})
    keep_round(run, pending)
    round_id = pending["rl"]["round"]
    for child in rl.output.iterdir():  # the run's start: its folder emptied (DISCARD), its start recorded
        child.unlink() if child.is_file() else shutil.rmtree(child)
    (rl.output / STARTED).write_text(json.dumps({"command": rl.argv, "round": round_id}))
    write_checkpoint(rl.output, 3)
    for again in ((set(), {"rl"}), (set(), set()), ({"rl"}, set())):
        pending = forced_round(run, plan, *again)
        assert pending["rl"]["round"] == round_id, again  # the same round, not a new one
        states = stage_states(plan, pending)
        assert states["rl"] == "resume from checkpoint-3" and states["eval_rl_vstar"] == "forced", again
        assert not reproduce.blocked(plan, states)
    assert rl.command()[-2:] == ["--resume_from_checkpoint", "true"]
    done(rl, "rl-2", {"sft": "sft-1", "rl_probe": "rl_probe-1"}, round_id)
    evaluation = stages["eval_rl_vstar"]
    evaluation.output.joinpath(".done").unlink()
    (evaluation.output / STARTED).write_text(json.dumps({"command": evaluation.argv, "round": round_id}))
    states = stage_states(plan, forced_round(run, plan, set(), {"rl"}))  # the same command after RL finished
    assert states["rl"] == "done" and states["eval_rl_vstar"] == "resume"
    end_round(run)
    assert not (run / FORCED).exists()


def test_an_interrupted_stage_is_not_resumed_under_another_command(tmp_path):
    stages = tiny_plan(tmp_path)
    rl = stages["rl"]
    rl.output.mkdir(parents=True)
    (rl.output / STARTED).write_text(json.dumps({"command": [*rl.argv, "--learning_rate", "1"], "round": None}))
    write_checkpoint(rl.output, 5)
    plan = list(stages.values())
    states = stage_states(plan, set())
    assert states["rl"] == "changed"
    message = "\n".join(reproduce.blocked(plan, states))
    assert "rl is interrupted at checkpoint-5 with another command or recipe than the plan's:" in message
    assert "--learning_rate 1" in message and "DISCARD=rl reruns it" in message


def test_the_advice_after_a_failure_says_what_a_rerun_takes_up(tmp_path):
    stages = tiny_plan(tmp_path)
    write_checkpoint(stages["rl"].output, 7)
    advice = reproduce.resume_advice(stages["rl"], "r1", "transformers")
    assert advice.startswith("Rerun the same command to resume: rl goes on from checkpoint-7. FORCE and DISCARD may")
    assert "vLLM" not in advice
    assert reproduce.resume_advice(stages["eval_base_vstar"], None, "vllm").startswith(
        "Rerun the same command to resume: it keeps its samples.\nThis stage generates with vLLM."
    )


@pytest.mark.parametrize("word", ["force", "discard"])
def test_an_unknown_stage_is_named(tmp_path, word):
    with pytest.raises(SystemExit, match=rf"{word.upper()}=nope: no stage \['nope'\]; stages: eval_base_vstar"):
        reproduce.main(["--recipe_set", "tiny", "--data_root", str(tmp_path), f"--{word}", "nope", "--dry_run"])


# ------------------------------------------------------------------------------------------------ resolved recipes
def edited_set(tmp_path: Path) -> Path:
    """recipes/reproduce.yaml with the tiny set's SFT and RL recipes copied under `tmp_path`, to be edited."""
    spec = yaml.safe_load(reproduce.SETS_FILE.read_text(encoding="utf-8"))
    for key in ("sft", "rl"):
        copy = tmp_path / f"{key}.yaml"
        shutil.copy(reproduce.REPO / spec["sets"]["tiny"][key], copy)
        spec["sets"]["tiny"][key] = str(copy)
    sets = tmp_path / "sets.yaml"
    sets.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return sets


def edit(recipe: Path, old: str, new: str) -> None:
    text = recipe.read_text(encoding="utf-8")
    assert old in text
    recipe.write_text(text.replace(old, new), encoding="utf-8")


def dry_run(capsys, tmp_path: Path, sets: Path) -> tuple[dict[str, reproduce.Stage], str]:
    argv = ["--recipe_set", "tiny", "--data_root", str(tmp_path / "data"), "--run_dir", str(tmp_path / "run")]
    stages = reproduce.main([*argv, "--sets_file", str(sets), "--dry_run", "--no_memory"])
    return {s.name: s for s in stages}, capsys.readouterr().out


def recorded(stages: dict[str, reproduce.Stage]) -> None:
    """Every stage done, its record as the run writes it: its command and its resolved recipe."""
    for s in stages.values():
        s.output.mkdir(parents=True, exist_ok=True)
        record = {"command": s.argv, "recipe": s.resolved(), "id": f"{s.name}-1",
                  "inputs": {name: f"{name}-1" for name in s.reads}}  # fmt: skip
        (s.output / ".done").write_text(json.dumps(record))


def test_an_edited_recipe_makes_its_stage_changed_and_the_dry_run_names_the_field(tmp_path, capsys):
    """The command of RL is the same after its recipe's learning rate is edited (`--config` names the file): the
    resolved recipe its record keeps is not, and the dry run says which field, with both values."""
    sets = edited_set(tmp_path)
    stages, _ = dry_run(capsys, tmp_path, sets)
    recorded(stages)
    assert "learning_rate" in stages["rl"].resolved() and stages["rl"].resolved()["learning_rate"] == 1.0e-4
    _, out = dry_run(capsys, tmp_path, sets)
    assert re.search(r"^\d+\. rl: done", out, re.M)
    edit(tmp_path / "rl.yaml", "learning_rate: 1.0e-4", "learning_rate: 2.0e-4")
    edited, out = dry_run(capsys, tmp_path, sets)
    assert edited["rl"].argv == stages["rl"].argv  # the command did not change
    assert re.search(r"^\d+\. rl: changed\n.*\n   changed: learning_rate: 0.0001 -> 0.0002$", out, re.M), out
    assert re.search(r"^\d+\. eval_rl_vstar: stale$", out, re.M) and re.search(r"^\d+\. sft: done", out, re.M)
    assert "would not start:\n  rl is done with another command or recipe than the plan's:\n" in out
    assert "  learning_rate: 0.0001 -> 0.0002\n" in out and "FORCE=rl reruns it" in out


def test_a_change_of_tool_rounds_makes_convert_and_sft_stale_too(tmp_path, capsys):
    """The converter drops rows with more calls than RL's max_tool_calling_iterations: its command says the number
    (--max_calls), so an edit of RL's makes convert changed and SFT, which reads it, stale."""
    sets = edited_set(tmp_path)
    stages, _ = dry_run(capsys, tmp_path, sets)
    assert stages["convert"].argv[stages["convert"].argv.index("--max_calls") + 1] == "2"  # the tiny RL recipe's
    recorded(stages)
    edit(tmp_path / "rl.yaml", "max_tool_calling_iterations: 2", "max_tool_calling_iterations: 3")
    _, out = dry_run(capsys, tmp_path, sets)
    assert re.search(r"^\d+\. convert: changed\n.*\n   changed: max_calls: 2 -> 3$", out, re.M), out
    assert re.search(r"^\d+\. sft: stale$", out, re.M)
    assert re.search(r"^\d+\. rl: changed\n.*\n   changed: max_tool_calling_iterations: 2 -> 3$", out, re.M)


def test_resuming_rl_across_an_edit_is_refused_naming_the_field(tmp_path, capsys):
    """RL started under one learning rate and was interrupted at checkpoint-4; the recipe was edited since. Resuming
    would continue the old run's schedule under a record of the new one: refused, the field named, DISCARD offered."""
    sets = edited_set(tmp_path)
    stages, _ = dry_run(capsys, tmp_path, sets)
    rl = stages["rl"]
    rl.output.mkdir(parents=True)
    (rl.output / STARTED).write_text(json.dumps({"command": rl.argv, "recipe": rl.resolved(), "round": None}))
    write_checkpoint(rl.output, 4)
    _, out = dry_run(capsys, tmp_path, sets)
    assert re.search(r"^\d+\. rl: resume from checkpoint-4$", out, re.M)
    edit(tmp_path / "rl.yaml", "learning_rate: 1.0e-4", "learning_rate: 2.0e-4")
    _, out = dry_run(capsys, tmp_path, sets)
    assert "  rl is interrupted at checkpoint-4 with another command or recipe than the plan's:\n" in out
    assert "  learning_rate: 0.0001 -> 0.0002\n" in out and "DISCARD=rl reruns it from an empty folder" in out


# ------------------------------------------------------------------------------------------------------ a moved run
def test_a_moved_run_folder_resumes_instead_of_rerunning(tmp_path):
    """Records as the run writes them (`Stage.record`: paths as $RUN_DIR/... and $DATA_ROOT/...). RUN_DIR and
    DATA_ROOT moved to a bigger disk: every finished stage is still done, RL interrupted after checkpoint-3 resumes
    from it, an evaluation interrupted half-way starts again (evaluate.py resumes only under its first paths; it
    holds no checkpoint). Records of absolute paths, as before, would make every stage changed."""
    stages = tiny_plan(tmp_path)
    for s in stages.values():
        s.output.mkdir(parents=True)
        (s.output / ".done").write_text(json.dumps({**s.record(), "id": f"{s.name}-1",
                                                    "inputs": {name: f"{name}-1" for name in s.reads}}))  # fmt: skip
    for name in [n for n in stages if n.startswith("eval_rl_")]:  # not run yet: RL was interrupted
        (stages[name].output / ".done").unlink()
    for name in ("rl", "eval_rl_vstar"):  # interrupted: started, not done
        s = stages[name]
        (s.output / ".done").unlink(missing_ok=True)
        (s.output / STARTED).write_text(json.dumps({**s.record(), "round": None}))
    write_checkpoint(stages["rl"].output, 3)
    assert json.loads((stages["sft"].output / ".done").read_text())["command"][-2:] == ["--output_dir", "$RUN_DIR/sft"]
    assert "$DATA_ROOT/Mini-o3-Coldstart-Dataset" in stages["convert"].record()["command"]
    (tmp_path / "bigger").mkdir()
    (tmp_path / "data").mkdir()
    for folder in ("run", "data"):
        shutil.move(tmp_path / folder, tmp_path / "bigger" / folder)
    chosen, spec = reproduce.load_set("tiny")
    moved = reproduce.plan({**chosen, "name": "tiny"}, spec, tmp_path / "bigger" / "data", tmp_path / "bigger" / "run",
                           NO_EXTRA)  # fmt: skip
    states = stage_states(moved, set())
    assert states.pop("rl") == "resume from checkpoint-3" and states.pop("eval_rl_vstar") == "moved"
    assert {name: state for name, state in states.items() if state != "done"} == dict.fromkeys(
        [f"eval_rl_{b}" for b in ("hrbench_4k", "hrbench_8k", "mme_realworld_lite")], "to run"
    )
    by_name = {s.name: s for s in moved}
    assert by_name["rl"].command()[-2:] == ["--resume_from_checkpoint", "true"]
    # before: records of absolute paths
    sft = by_name["sft"]
    (sft.output / ".done").write_text(json.dumps({"command": stages["sft"].argv, "id": "sft-1",
                                                  "inputs": {"convert": "convert-1"}}))  # fmt: skip
    assert stage_states(moved, set())["sft"] == "changed"
