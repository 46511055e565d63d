"""`make reproduce RECIPE_SET=<set> DATA_ROOT=<dir> [RUN_DIR=<dir>] [DRY=1] [FORCE=<stage>] [RL_BACKEND=<backend>]`:
the paper's pipeline in one command, with our own baselines.

    python -m scripts.reproduce --recipe_set qwen2.5-vl-7b --data_root /data [--run_dir DIR] [--dry_run]

Stages, each the entry point a user would run, with the set's recipes (`recipes/reproduce.yaml`):
`eval_base_<benchmark>` (the base model: V*, HR-Bench 4K/8K, MME-RealWorld-Lite), `convert` (the cold-start release,
`python -m data.convert`, with its stats and preview; SFT does not start when too many rows were skipped), `sft`
(`accelerate launch ... sft.py`), `sft_merge` (LoRA sets: `python -m scripts.merge_lora`), `eval_sft_<benchmark>`,
`rl_probe` (the SFT checkpoint on a sample of the RL data, scored by the RL recipe's rewards: RL does not start when
those that read the answer pay under a floor, 5% of the rollouts, unless --accept_probe), `rl` (MAPO on DeepEyes-47k, `rl.py`), `rl_merge` (LoRA sets), `eval_rl_<benchmark>`; last,
`RUN_DIR/reproduce.md` (`evaluation.reproduction`). Every evaluation runs under the same settings (the RL recipe's
tool and rollout budget, greedy), data-parallel over the set's `eval_processes`, on RL's generation backend (the set's
`rl_backend`, vLLM on the 8-GPU sets, or `--rl_backend`). While a stage runs its progress is read every minute and
the plan's remaining time re-estimated from it (`evaluation.reproduce_time`: `RUN_DIR/estimate.json`).

Each stage writes `RUN_DIR/<stage>/`, records each start (`.started`) and, when it exits 0, `.done`: its command, its
resolved recipe and the run ids of the stages it read (`evaluation.reproduce_state`). A stage done is skipped; one
whose command or resolved recipe differs from the plan's ("changed", each field named), or whose inputs were rerun
since ("stale"), stops the run before anything starts, unless `FORCE=<stage>` (comma-separated) reruns it and every
stage after it that reads it. A folder holding checkpoints or weights is deleted only when `DISCARD=<stage>` names it.
FORCE and DISCARD form a round (`RUN_DIR/.forced`) that an interrupted run goes on with: an SFT or RL stage with a
complete `checkpoint-*` and no marker resumes from it (never across a change of its recipe); an evaluation resumes
by itself. Before the first stage: every DATA_ROOT input a stage still to run reads is there (named by full path and
release) and opens (`evaluation.reproduce_inputs`: no Git LFS pointer, parquet footers, a first row and its image),
and the accelerate configs' backends (DeepSpeed) and the recipes' `report_to` backends are checked.
Layout of DATA_ROOT and what to expect: docs/reproduce.md.

Why subprocesses, never imports: each stage then runs exactly as its documented command does (its own process,
accelerate's launcher, its start-up checks), a crash in one leaves the others' markers intact, and this script stays
a leaf that loads no model. The memory estimate of `--dry_run` is `python -m scripts.memory` for the same reason.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

import yaml

from evaluation.reproduce_gates import conversion_verdict, probe_summary, probe_verdict
from evaluation.reproduce_inputs import lfs_pointer, missing_inputs, unreadable_inputs
from evaluation.reproduce_state import (
    FORCED,
    MARKER,
    STARTED,
    Stage,
    blocked,
    end_round,
    forced_round,
    keep_round,
    portable,
    run_id,
    stage_states,
    write_record,
)
from evaluation.reproduce_time import Clock, Measured, Throughput, parquet_rows, rl_rows, save_flags, total_line
from evaluation.reproduction import write_report
from tiny.releases import write_releases
from tools import ToolConfig
from utils.checks import check_accelerate_config, check_report_to
from utils.recipes import flag_values, load_recipe

REPO = Path(__file__).resolve().parents[1]
SETS_FILE = REPO / "recipes" / "reproduce.yaml"
SET_KEYS = {
    "sft", "rl", "lora", "accelerate", "num_processes", "eval_processes", "convert_format", "eval_args", "rl_vllm",
    "rl_probe", "rl_backend", "throughput", "own_data",
}  # fmt: skip
RL_BACKENDS = ("transformers", "vllm")
# RL's vLLM flags (a set's `rl_vllm`) that evaluate.py's vLLM backend takes too, by its own name: the evaluations then
# build the engine RL will build, so a vLLM that fails on the node fails in the first stage, not on day two.
EVAL_VLLM_FLAGS = {
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization", "vllm_enforce_eager": "vllm_enforce_eager",
    "vllm_dtype": "dtype", "vllm_max_model_len": "vllm_max_model_len",
}  # fmt: skip
MODELS = ("base", "sft", "rl")  # whose evaluations the table holds, in order
ROLLOUT_KEYS = ("max_completion_length", "max_tool_calling_iterations")
TOOL_KEYS = tuple(f.name for f in fields(ToolConfig))
PREVIEW_ROWS = 20
POLL_SECONDS = 60  # how often a running stage's progress is read
CHECKPOINT_HOURS = 2.0  # a training stage saves at least this often (estimated), unless recipes/reproduce.yaml says


# ------------------------------------------------------------------------------------------------------- the set
def load_set(name: str, path: Path = SETS_FILE) -> tuple[dict, dict]:
    """The set `name` of `path` and the whole file (its data and benchmark blocks). Refuses an unknown set, a key the
    file does not define, and a recipe or accelerate config that does not exist, naming each."""
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    sets = spec.get("sets", {})
    if name not in sets:
        raise SystemExit(f"RECIPE_SET={name}: no such set in {path}; known: {', '.join(sets)}")
    chosen = sets[name]
    if set(chosen) - SET_KEYS:
        raise SystemExit(
            f"{path}, set {name}: unknown keys {sorted(set(chosen) - SET_KEYS)}; known: {sorted(SET_KEYS)}"
        )
    files = {"sft": chosen["sft"], "rl": chosen["rl"], "accelerate": accelerate_config(chosen)}
    for key, file in files.items():
        if not (REPO / file).is_file():
            raise SystemExit(f"{path}, set {name}, {key}: {file} does not exist")
    return chosen, spec


def accelerate_config(chosen: dict) -> str:
    return f"recipes/accelerate_configs/{chosen['accelerate']}.yaml"


def eval_launcher(chosen: dict) -> list[str]:
    """How an evaluation starts: one process, or data-parallel under accelerate over `eval_processes` (plain DDP
    processes, one per GPU; on CPU, the two-process gloo config)."""
    n = chosen.get("eval_processes", 1)
    if n <= 1:
        return ["python"]
    config = "multi_cpu" if chosen["accelerate"] in ("cpu", "multi_cpu") else "ddp"
    return [
        "accelerate",
        "launch",
        "--config_file",
        f"recipes/accelerate_configs/{config}.yaml",
        "--num_processes",
        str(n),
    ]


def recipe_values(recipe: str, flags: Sequence[str]) -> dict:
    """A recipe's fields with a command line's flags over them."""
    return load_recipe(REPO / recipe).values | flag_values(flags)


def rl_files(spec: dict, data_root: Path) -> list[Path]:
    block = spec["rl_data"]
    return [data_root / block["folder"] / entry["file"] for entry in block["files"]]


def eval_settings(chosen: dict, sft_flags: list[str], rl_flags: list[str], backend: str) -> list[str]:
    """The flags every evaluation of the set runs under, base, SFT and RL alike: the tool settings the SFT and RL
    recipes set (RL's over SFT's) and the RL recipe's rollout budget, the backend RL's rollouts use (vLLM with RL's
    engine settings, `EVAL_VLLM_FLAGS`), then the set's own `eval_args`. A setting no recipe sets is each checkpoint's
    record, which the RL run inherits from SFT."""
    sft, rl = recipe_values(chosen["sft"], sft_flags), recipe_values(chosen["rl"], rl_flags)
    settings = {k: sft[k] for k in TOOL_KEYS if k in sft} | {k: rl[k] for k in (*TOOL_KEYS, *ROLLOUT_KEYS) if k in rl}
    if backend == "vllm":
        settings["backend"] = "vllm"
        settings |= {ours: rl[key] for key, ours in EVAL_VLLM_FLAGS.items() if key in rl}
    flags = [item for key, value in settings.items() for item in (f"--{key}", _flag(value))]
    return flags + list(chosen["eval_args"])


def default_backend(chosen: dict, asked: str | None) -> str:
    """The generation backend of RL's rollouts and every evaluation: the one asked, else the set's `rl_backend` (vLLM
    on the 8-GPU sets, whose week transformers generation overruns), else transformers."""
    return asked or chosen.get("rl_backend", "transformers")


def eval_rows(entry_rows: int, eval_flags: list[str]) -> int:
    """The rows an evaluation reads: the benchmark's, or `--limit` of the set's and the command line's eval flags."""
    limit = flag_values(eval_flags).get("limit")
    return min(entry_rows, limit) if isinstance(limit, int) and limit > 0 else entry_rows


def _flag(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------------------------------------ the plan
def plan(
    chosen: dict,
    spec: dict,
    data_root: Path,
    run_dir: Path,
    extra: dict[str, list[str]],
    *,
    rl_backend: str = "transformers",
    max_skip_rate: float | None = None,
    accept_probe: bool = False,
    no_tools_row: bool = False,
) -> list[Stage]:
    """Every stage of the set, in order, with its paths under `data_root` and `run_dir` passed as command-line
    overrides of the recipes' own (which name outputs/... and /data/...); `no_tools_row`: the RL model evaluated again
    with its tools withheld, against its evaluation with them (`eval_rl_no_tools_<benchmark>`)."""
    data = {key: (data_root / entry["path"], entry["release"]) for key, entry in spec["data"].items()}
    launch = ["accelerate", "launch", "--config_file", accelerate_config(chosen)]
    launch += ["--num_processes", str(chosen["num_processes"])]
    out = lambda name: run_dir / name  # noqa: E731
    coldstart, coldstart_release = data["coldstart"]
    rl_flags = [*extra["rl"], *(chosen.get("rl_vllm", []) if rl_backend == "vllm" else [])]
    settings = eval_settings(chosen, extra["sft"], rl_flags, rl_backend)
    rl_recipe = recipe_values(chosen["rl"], rl_flags)
    base = recipe_values(chosen["sft"], extra["sft"])["model_name_or_path"]
    assumed = Throughput(spec.get("throughput", {}), chosen, rl_backend)
    rows = lambda n: eval_rows(n, [*chosen["eval_args"], *extra["eval"]])  # noqa: E731
    every = spec.get("checkpoint_hours", CHECKPOINT_HOURS)

    def evaluations(model: str, policy: str | Path, reads: tuple[str, ...], no_tools: bool = False) -> list[Stage]:
        stages = []
        for bench, entry in spec["benchmarks"].items():
            (path, release), name = data[bench], f"eval_{model}_{bench}"
            argv = [*eval_launcher(chosen), "evaluate.py", "--model_name_or_path", str(policy)]
            argv += ["--benchmark", entry["reader"], "--data_path", str(path), "--output_dir", str(out(name))]
            argv += [*settings, *extra["eval"]]
            if no_tools:  # set against the same model's run with its tools (docs/evaluation.md, "What the tool adds")
                argv += ["--no_tools", "--with_tools_run", str(out(f"eval_rl_{bench}"))]
            work = assumed.evaluation(rows(entry["rows"]))
            after = (*reads, f"eval_rl_{bench}") if no_tools else reads
            stages.append(Stage(name, argv, out(name), {path: release}, after, work=work, kind="eval"))
        return stages

    stages = evaluations("base", base, ())
    convert = ["python", "-m", "data.convert", "--format", chosen["convert_format"]]
    convert += ["--input", str(coldstart), "--output", str(out("convert")), "--rl_recipe", chosen["rl"]]
    # the rows it keeps depend on RL's tool rounds (it drops longer ones): given, so that a change of them changes it
    convert += ["--max_calls", str(rl_recipe.get("max_tool_calling_iterations", 5))]
    convert += ["--preview", str(PREVIEW_ROWS)]
    stages.append(Stage("convert", convert, out("convert"), {coldstart: coldstart_release}))
    sft_recipe = recipe_values(chosen["sft"], extra["sft"])
    work = assumed.sft(sft_recipe, out("convert"))
    sft = [*launch, "sft.py", "--config", chosen["sft"], "--dataset_name", str(out("convert"))]
    sft += ["--output_dir", str(out("sft")), *save_flags(sft_recipe, extra["sft"], work, every), *extra["sft"]]
    skip_rate = spec.get("max_skip_rate", 0.2) if max_skip_rate is None else max_skip_rate
    stages.append(
        Stage(
            "sft", sft, out("sft"), reads=("convert",), recipe=chosen["sft"], recipe_args=extra["sft"],
            resumable=True, gate=lambda: conversion_verdict(out("convert"), skip_rate), work=work, kind="train",
        )
    )  # fmt: skip
    policy, last = out("sft"), "sft"
    if chosen.get("lora"):  # an adapter: RL starts from a full checkpoint
        stages.append(merge("sft_merge", policy, out("sft_merge"), last))
        policy, last = out("sft_merge"), "sft_merge"
    stages += evaluations("sft", policy, (last,))

    files = rl_files(spec, data_root)
    release = spec["rl_data"]["release"]
    probe = spec.get("rl_probe", {}) | chosen.get("rl_probe", {})
    probe_argv = [*eval_launcher(chosen), "evaluate.py", "--model_name_or_path", str(policy)]
    probe_argv += ["--benchmark", spec["rl_data"]["dataset_name"], "--data_path", *map(str, files)]
    probe_argv += ["--limit", str(probe["rows"]), "--sample_seed", "0", "--output_dir", str(out("rl_probe"))]
    probe_argv += ["--reward_funcs", *rl_recipe.get("reward_funcs", ["outcome", "format"])]
    probe_argv += ["--temperature", _flag(rl_recipe.get("temperature", 1.0)), *settings]
    stages.append(
        Stage(
            "rl_probe", probe_argv, out("rl_probe"), dict.fromkeys(files, release), (last,),
            work=assumed.evaluation(probe["rows"]), kind="eval",
        )
    )  # fmt: skip
    work = assumed.rl(rl_recipe, rl_rows(spec, files))
    rl = [*launch, "rl.py", "--config", chosen["rl"], "--model_name_or_path", str(policy)]
    rl += ["--dataset_name", spec["rl_data"]["dataset_name"], "--dataset_path", *map(str, files)]
    rl += ["--output_dir", str(out("rl")), *save_flags(rl_recipe, rl_flags, work, every), *rl_flags]
    stages.append(
        Stage(
            "rl", rl, out("rl"), dict.fromkeys(files, release), (last, "rl_probe"), recipe=chosen["rl"],
            recipe_args=rl_flags, resumable=True,
            gate=lambda: probe_verdict(out("rl_probe"), probe["min_paid_rate"], accept_probe),
            work=work, kind="train",
        )
    )  # fmt: skip
    policy, last = out("rl"), "rl"
    if chosen.get("lora"):
        stages.append(merge("rl_merge", policy, out("rl_merge"), last))
        policy, last = out("rl_merge"), "rl_merge"
    stages += evaluations("rl", policy, (last,))
    stages += evaluations("rl_no_tools", policy, (last,), no_tools=True) if no_tools_row else []
    for s in stages:  # what the records write as $RUN_DIR and $DATA_ROOT, so that a moved run still matches
        s.roots = {"RUN_DIR": run_dir, "DATA_ROOT": data_root}
    return stages


def merge(name: str, adapter: Path, output: Path, reads: str) -> Stage:
    argv = ["python", "-m", "scripts.merge_lora", "--adapter", str(adapter), "--output_dir", str(output)]
    return Stage(name, argv, output, reads=(reads,))


# --------------------------------------------------------------------------------------------------------- running
def executable(argv: list[str]) -> list[str]:
    """`python` and `accelerate` as this interpreter's own (the .venv's), the rest as printed."""
    tools = {"python": sys.executable, "accelerate": str(Path(sys.executable).with_name("accelerate"))}
    return [tools.get(argv[0], argv[0]), *argv[1:]]


def memory_commands(chosen: dict, stages: list[Stage]) -> dict[str, list[str]]:
    """`python -m scripts.memory` per training stage, with the stage's own recipe flags; none for a CPU set."""
    if chosen["accelerate"] in ("cpu", "multi_cpu"):
        return {}
    hardware = ["--accelerate", chosen["accelerate"], "--num_gpus", str(chosen["num_processes"])]
    return {
        s.name: ["python", "-m", "scripts.memory", "--recipe", s.recipe, *hardware]
        + (["--recipe_args", shlex.join(s.recipe_args)] if s.recipe_args else [])
        for s in stages
        if s.recipe
    }


def estimate_memory(commands: dict[str, list[str]]) -> dict[str, str]:
    """Each training stage's estimated peak per GPU, from `python -m scripts.memory` (run side by side; it builds
    the model on the meta device, seconds each). The estimator reads the recipe as written: for RL that is the model
    the recipe names (or its folder's architecture), the same one the SFT output will be."""
    running = {
        name: subprocess.Popen(executable(argv), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, argv in commands.items()
    }
    found = {}
    for name, process in running.items():
        out, err = process.communicate()
        values = dict(re.findall(r"^(total|generation_total)\s+([\d.]+) GiB", out, re.M))
        if process.returncode or "total" not in values:
            last = (err.strip().splitlines() or ["no output"])[-1]
            found[name] = f"not estimated ({last})"
        else:
            generation = f", generation {values['generation_total']} GiB" if "generation_total" in values else ""
            found[name] = f"training {values['total']} GiB{generation}"
    return found


def environment_problems(chosen: dict, stages: list[Stage], states: dict[str, str]) -> list[str]:
    """What the installed stack lacks for the stages still to run: the accelerate configs' backends (DeepSpeed) and
    every training recipe's `report_to` backends (with a wandb login), each found now rather than after days."""
    problems, todo = [], [s for s in stages if states[s.name] != "done"]
    configs = {arg for s in todo for i, arg in enumerate(s.argv) if i and s.argv[i - 1] == "--config_file"}
    for config in sorted(configs):
        try:
            check_accelerate_config(REPO / config)
        except ValueError as err:
            problems.append(str(err))
    for s in todo:
        if s.recipe:
            try:
                check_report_to(recipe_values(s.recipe, s.recipe_args).get("report_to"))
            except ValueError as err:
                problems.append(f"{s.name} ({s.recipe}): {err}")
    return problems


def print_plan(
    stages: list[Stage], states: dict[str, str], memory: dict[str, str], memory_argv: dict[str, list[str]],
    backend: str,
) -> None:  # fmt: skip
    for i, s in enumerate(stages, 1):
        state = f"done ({s.output / MARKER})" if states[s.name] == "done" else states[s.name]
        estimate = "" if s.hours is None else f"   [~{s.hours:.1f} h]"
        print(f"{i}. {s.name}: {state}{estimate}\n   {shlex.join(s.command())}")
        if states[s.name] == "changed":  # what differs from the run the folder holds, field by field
            print("\n".join(f"   changed: {field}" for field in s.differs(s.marker or s.started)))
        if s.name in memory_argv:
            print(f"   memory per GPU ({shlex.join(memory_argv[s.name])}): {memory.get(s.name, 'not estimated')}")
        if s.gate is not None and states[s.name] != "done":
            verdict = s.gate()
            if verdict is not None and "is missing" not in verdict:
                print(f"   will not start: {verdict}")
    known = [s.hours for s in stages if s.hours is not None and states[s.name] != "done"]
    if known:
        source = "recipes/reproduce.yaml, `throughput`: assumptions, replaced by the run's own step times as it runs"
        print(f"\nestimated time still to run: {total_line(sum(known), backend, source)}")


def print_sources(chosen: dict, spec: dict, files: list[Path]) -> None:
    """The recipes the set runs, where they depart from the paper's recipe, and the RL files with their rows."""
    print(f"recipes: SFT {chosen['sft']}, RL {chosen['rl']} (base recipes/mapo_paper.yaml; departures: reproduce.md)")
    print(f"RL data ({spec['rl_data']['release']}):")
    for path, entry in zip(files, spec["rl_data"]["files"]):
        rows = parquet_rows(path)
        if rows is not None:
            counted = f"{rows:,} rows"
        else:
            counted = (
                ("a Git LFS pointer, not the file" if lfs_pointer(path) else "not a readable parquet file")
                if path.is_file()
                else f"{entry['rows']} rows published, not downloaded"
            )
        print(f"  {path}: {counted}; {entry['what']}")
    for entry in spec["rl_data"].get("left_out", []):
        print(f"  left out: {entry['file']} ({entry['rows']} rows; {entry['what']})")


def run_stage(s: Stage, stages: list[Stage], state: str, round_id: str | None, clock: Clock, backend: str) -> None:
    """Run one stage, measuring it as it runs (`clock`); on exit 0 write its marker (the plan's command, the one run,
    when, a run id, the run ids of the stages it read and the forced round it ran in). A `forced` stage, and one that
    is neither resumable nor an evaluation (convert, a merge), starts from an empty folder: what an earlier run left
    there does not belong to this command (the states leave a folder holding checkpoints forced only under DISCARD).
    Every start is recorded (`.started`), so a rerun knows what it would resume. A failure says how to resume and,
    under vLLM, names the fallback."""
    fresh = state in ("forced", "moved") or (state == "to run" and not s.resumable and s.kind != "eval")
    if fresh and s.output.exists():
        shutil.rmtree(s.output)
    argv = s.command()
    by_name = {t.name: t for t in stages}
    inputs = {name: run_id(by_name[name]) for name in s.reads}
    kept = s.record()  # what this run is, field by field, its folders as $RUN_DIR and $DATA_ROOT: a later plan's match
    ran = portable(argv, s.roots)
    write_record(s.output / STARTED, {**kept, "ran": ran, "round": round_id, "inputs": inputs,
                                      "started": time.strftime("%Y-%m-%dT%H:%M:%S")})  # fmt: skip
    print(f"\n==> {s.name}: {shlex.join(argv)}", flush=True)
    start = time.monotonic()
    meter = clock.meter(s.name, s.output)
    try:
        code = watch(subprocess.Popen(executable(argv), cwd=REPO), lambda: clock.look(s.name, meter()))
    except KeyboardInterrupt:
        raise SystemExit(f"\nstage {s.name} interrupted.\n{resume_advice(s, round_id, backend)}") from None
    seconds = time.monotonic() - start
    if code:
        raise SystemExit(
            f"stage {s.name} failed (exit {code}): {shlex.join(argv)}\n{resume_advice(s, round_id, backend)}"
        )
    measured = meter()
    if measured is None and s.kind == "eval" and s.work is not None:  # too short to look twice: its whole time
        measured = Measured(s.work.units, s.work.units, seconds / max(1, s.work.units))
    clock.finish(s.name, measured)
    record = {
        **kept,
        "ran": ran,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "id": uuid.uuid4().hex,
        "inputs": inputs,
        "round": round_id,
    }
    write_record(s.output / MARKER, record)


def resume_advice(s: Stage, round_id: str | None, backend: str) -> str:
    """What to type after stage `s` failed: the same command, and what it will take up again; under vLLM, the
    fallback."""
    checkpoint = s.checkpoint()
    kept = (
        f": {s.name} goes on from {checkpoint.name}"
        if checkpoint
        else ": it keeps its samples"
        if s.kind == "eval"
        else ""
    )
    advice = f"Rerun the same command to resume{kept}."
    if round_id is not None:
        advice += (
            f" FORCE and DISCARD may be left out: {s.output.parent / FORCED} keeps the forced stages until the plan "
            "finishes, and a rerun deletes nothing the round has made."
        )
    if backend == "vllm" and ("evaluate.py" in s.argv or "--use_vllm" in s.argv):
        advice += (
            "\nThis stage generates with vLLM. If vLLM is what failed (the traceback above), RL_BACKEND="
            "transformers runs RL's rollouts and every evaluation on transformers generation instead "
            "(DRY=1 prints its time)."
        )
    return advice


def watch(process: subprocess.Popen, look: Callable[[], None], every: float = POLL_SECONDS) -> int:
    """Wait for `process`, calling `look` every `every` seconds while it runs; its exit code. Interrupted (Ctrl-C
    reaches the stage too), it waits for the stage to end before stopping."""
    while True:
        try:
            return process.wait(timeout=every)
        except subprocess.TimeoutExpired:
            look()
        except KeyboardInterrupt:
            process.wait()
            raise


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe_set", required=True, help="a set of recipes/reproduce.yaml")
    parser.add_argument("--data_root", required=True, type=Path, help="one folder per release (docs/reproduce.md)")
    parser.add_argument("--run_dir", type=Path, help="default: outputs/reproduce/<recipe_set>")
    parser.add_argument("--dry_run", action="store_true", help="print the plan (commands, memory, state); run nothing")
    parser.add_argument("--no_memory", action="store_true", help="skip the memory estimate")
    parser.add_argument(
        "--force", default="", help="stages to rerun (comma-separated), with the stages that read them"
    )
    parser.add_argument(
        "--discard",
        default="",
        help="stages to rerun from step 0 whose folders' checkpoints and weights may be deleted (forces them too)",
    )
    parser.add_argument(
        "--rl_backend",
        choices=RL_BACKENDS,
        help="RL's rollouts and every evaluation: vllm (colocated) or transformers; default: the set's rl_backend",
    )
    parser.add_argument("--max_skip_rate", type=float, help="converted rows skipped above which SFT does not start")
    parser.add_argument(
        "--accept_probe",
        action="store_true",
        help="start RL even when the probe's answer rewards paid under the floor",
    )
    parser.add_argument("--benchmarks", default="", help="evaluate only these (comma-separated keys of benchmarks:)")
    parser.add_argument(
        "--no_tools_row", action="store_true", help="also evaluate the RL model with its tools withheld"
    )
    for stage in ("sft", "rl", "eval"):
        parser.add_argument(f"--{stage}_args", default="", help=f"flags appended to every {stage} command, quoted")
    parser.add_argument("--sets_file", type=Path, default=SETS_FILE, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Stage]:
    args = parse_args(argv)
    chosen, spec = load_set(args.recipe_set, args.sets_file)
    chosen = {**chosen, "name": args.recipe_set}
    if args.benchmarks:
        wanted = args.benchmarks.split(",")
        unknown = sorted(set(wanted) - set(spec["benchmarks"]))
        if unknown:
            raise SystemExit(f"--benchmarks: unknown {unknown}; known: {', '.join(spec['benchmarks'])}")
        spec = {**spec, "benchmarks": {name: spec["benchmarks"][name] for name in wanted}}
    run_dir = (args.run_dir or REPO / "outputs" / "reproduce" / args.recipe_set).resolve()
    data_root = args.data_root.resolve()
    extra = {stage: shlex.split(getattr(args, f"{stage}_args")) for stage in ("sft", "rl", "eval")}
    backend = default_backend(chosen, args.rl_backend)
    stages = plan(
        chosen, spec, data_root, run_dir, extra, rl_backend=backend, max_skip_rate=args.max_skip_rate,
        accept_probe=args.accept_probe, no_tools_row=args.no_tools_row,
    )  # fmt: skip
    force, discard = ({name for name in value.split(",") if name} for value in (args.force, args.discard))
    for word, names in (("FORCE", force), ("DISCARD", discard)):
        unknown = names - {s.name for s in stages}
        if unknown:
            raise SystemExit(
                f"{word}={','.join(sorted(names))}: no stage {sorted(unknown)}; stages: {', '.join(s.name for s in stages)}"
            )
    pending = forced_round(run_dir, stages, force, discard)
    states = stage_states(stages, pending)
    memory_argv = memory_commands(chosen, stages)
    print(f"make reproduce: set {args.recipe_set}, DATA_ROOT {data_root}, RUN_DIR {run_dir}, RL {backend}")
    print_sources(chosen, spec, rl_files(spec, data_root))
    if chosen.get("own_data") and not args.dry_run:  # the offline kit's road needs no download (tiny/releases.py)
        for path in write_releases(data_root, spec):
            print(f"--> wrote release-shaped data: {path}")
    missing, problems = missing_inputs(stages, states), environment_problems(chosen, stages, states)
    unreadable = unreadable_inputs(stages, states)  # every input opened: a broken one stops the plan now
    refused = blocked(stages, states)
    if args.dry_run:
        print_plan(stages, states, {} if args.no_memory else estimate_memory(memory_argv), memory_argv, backend)
        written = " (the run writes its own, release-shaped: tiny/releases.py)" if chosen.get("own_data") else ""
        print("\n".join([f"missing inputs{written}:", *missing]) if missing else "inputs: all present")
        opened = (
            "inputs opened: each present one reads (parquet footers, a first row and its image, no Git LFS pointer)"
        )
        print("\n".join(["unreadable inputs:", *unreadable]) if unreadable else opened)
        print("\n".join(["environment:", *(f"  {p}" for p in problems)]) if problems else "environment: ready")
        if refused:
            print("\n".join(["would not start:", *(f"  {line}" for line in refused)]))
        return stages
    # before any stage: nothing loads, nothing is half-written
    if refused:
        raise SystemExit("\n".join(["nothing was run:", *refused]))
    if missing:
        raise SystemExit(
            f"missing inputs under DATA_ROOT={data_root} (nothing was run):\n" + "\n".join(missing) + "\n"
            "DATA_ROOT holds one folder per release, named as published (docs/reproduce.md)."
        )
    if problems:
        raise SystemExit("\n".join(["the installed stack cannot run this plan (nothing was run):", *problems]))
    if unreadable:
        raise SystemExit(
            f"unreadable inputs under DATA_ROOT={data_root} (nothing was run):\n" + "\n".join(unreadable) + "\n"
            "Each was opened as its stage will read it; replace the file named, then rerun."
        )
    print_plan(stages, states, {}, {}, backend)
    report = lambda: write_report(run_dir, args.recipe_set, chosen, spec, [s.name for s in stages])  # noqa: E731

    def measured(name: str, first: Measured) -> None:  # the plan's time from the run's own figures
        left = clock.left()
        known = sum(hours for hours in left.values() if hours is not None)
        source = f"{name} measured {first.seconds:.1f} s a {'step' if clock.plan[name][0] == 'train' else 'row'}"
        print(f"\n--> re-estimate: {total_line(known, backend, source)} ({report()})", flush=True)

    todo = [s.name for s in stages if states[s.name] != "done"]
    clock = Clock(run_dir, {s.name: (s.kind, s.work) for s in stages}, todo, backend, measured)
    clock.write()
    keep_round(run_dir, pending)
    for s in stages:
        if states[s.name] == "done":
            print(f"\n==> {s.name}: done, skipped ({s.output / MARKER})")
            continue
        verdict = s.gate() if s.gate is not None else None
        if verdict is not None:
            raise SystemExit(f"stage {s.name} not started: {verdict}")
        s.output.parent.mkdir(parents=True, exist_ok=True)
        run_stage(s, stages, states[s.name], pending.get(s.name, {}).get("round"), clock, backend)
        if s.name == "rl_probe":  # what RL will learn from, said before it starts (or is refused)
            rewards = json.loads((s.output / "metrics.json").read_text(encoding="utf-8")).get("rewards", {})
            print(f"\n--> the probe: {probe_summary(rewards)}", flush=True)
    end_round(run_dir)
    print(f"\nreport: {report()}")
    return stages


if __name__ == "__main__":
    main()
