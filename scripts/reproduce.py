"""`make reproduce RECIPE_SET=<set> DATA_ROOT=<dir> [RUN_DIR=<dir>] [DRY=1]`: the paper's pipeline in one command.

    python -m scripts.reproduce --recipe_set qwen2.5-vl-7b --data_root /data [--run_dir DIR] [--dry_run]

Stages, each the entry point a user would run, with the set's recipes (`recipes/reproduce.yaml`): `convert` (the
cold-start release, `python -m data.convert`), `sft` (`accelerate launch ... sft.py`), `sft_merge` (LoRA sets:
`python -m scripts.merge_lora`), `rl` (MAPO on DeepEyes-47k, `rl.py`), `rl_merge` (LoRA sets), then `eval_<benchmark>`
(`python evaluate.py`) for V*, HR-Bench 4K/8K and MME-RealWorld-Lite; last, `RUN_DIR/reproduce.md`
(`evaluation.reproduction`). Each stage writes `RUN_DIR/<stage>/` and, when it exits 0, `RUN_DIR/<stage>/.done` with
its command: a stage with the marker is skipped; an SFT or RL stage with a `checkpoint-*` and no marker is rerun with
`--resume_from_checkpoint true`; an evaluation resumes by itself (evaluate.py skips the samples it has). The inputs
every stage still to run reads are checked before the first starts, each missing one named by its full path and
release. Layout of DATA_ROOT and what to expect: docs/reproduce.md.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from evaluation.reproduction import write_report

REPO = Path(__file__).resolve().parents[1]
SETS_FILE = REPO / "recipes" / "reproduce.yaml"
MARKER = ".done"
SET_KEYS = {"sft", "rl", "lora", "accelerate", "num_processes", "convert_format", "eval_args"}


@dataclass
class Stage:
    """One step of the plan: its command as a user types it (`python ...` or `accelerate launch ...`, from the repo
    root), the DATA_ROOT paths it reads (path -> release), and for training stages the recipe and accelerate config
    the memory estimate reads."""

    name: str
    argv: list[str]
    output: Path
    inputs: dict[Path, str] = field(default_factory=dict)
    recipe: str | None = None
    resumable: bool = False  # SFT and RL: a checkpoint-* is continued, not thrown away

    @property
    def done(self) -> bool:
        return (self.output / MARKER).is_file()

    def checkpoint(self) -> Path | None:
        found = sorted(self.output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        return found[-1] if self.resumable and found and not self.done else None

    def command(self) -> list[str]:
        """The command to run now: a training stage interrupted after a checkpoint continues from it."""
        return [*self.argv, "--resume_from_checkpoint", "true"] if self.checkpoint() else self.argv


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


def plan(chosen: dict, spec: dict, data_root: Path, run_dir: Path, extra: dict[str, list[str]]) -> list[Stage]:
    """Every stage of the set, in order, with its paths under `data_root` and `run_dir` passed as command-line
    overrides of the recipes' own (which name outputs/... and /data/...)."""
    data = {key: (data_root / entry["path"], entry["release"]) for key, entry in spec["data"].items()}
    launch = ["accelerate", "launch", "--config_file", accelerate_config(chosen)]
    launch += ["--num_processes", str(chosen["num_processes"])]
    out = lambda name: run_dir / name  # noqa: E731
    (coldstart, coldstart_release), (rl_data, rl_release) = data["coldstart"], data["rl"]

    convert = ["python", "-m", "data.convert", "--format", chosen["convert_format"]]
    convert += ["--input", str(coldstart), "--output", str(out("convert")), "--rl_recipe", chosen["rl"]]
    sft = [*launch, "sft.py", "--config", chosen["sft"], "--dataset_name", str(out("convert"))]
    sft += ["--output_dir", str(out("sft")), *extra["sft"]]
    stages = [
        Stage("convert", convert, out("convert"), {coldstart: coldstart_release}),
        Stage("sft", sft, out("sft"), recipe=chosen["sft"], resumable=True),
    ]
    policy = out("sft")
    if chosen.get("lora"):  # an adapter: RL starts from a full checkpoint
        stages.append(merge("sft_merge", policy, out("sft_merge")))
        policy = out("sft_merge")
    rl = [*launch, "rl.py", "--config", chosen["rl"], "--model_name_or_path", str(policy)]
    rl += ["--dataset_name", "deepeyes", "--dataset_path", str(rl_data), "--output_dir", str(out("rl")), *extra["rl"]]
    stages.append(Stage("rl", rl, out("rl"), {rl_data: rl_release}, recipe=chosen["rl"], resumable=True))
    policy = out("rl")
    if chosen.get("lora"):
        stages.append(merge("rl_merge", policy, out("rl_merge")))
        policy = out("rl_merge")
    for bench, entry in spec["benchmarks"].items():
        (path, release), name = data[bench], f"eval_{bench}"
        argv = ["python", "evaluate.py", "--model_name_or_path", str(policy), "--benchmark", entry["reader"]]
        argv += ["--data_path", str(path), "--output_dir", str(out(name)), *chosen["eval_args"], *extra["eval"]]
        stages.append(Stage(name, argv, out(name), {path: release}))
    return stages


def merge(name: str, adapter: Path, output: Path) -> Stage:
    argv = ["python", "-m", "scripts.merge_lora", "--adapter", str(adapter), "--output_dir", str(output)]
    return Stage(name, argv, output)


def executable(argv: list[str]) -> list[str]:
    """`python` and `accelerate` as this interpreter's own (the .venv's), the rest as printed."""
    tools = {"python": sys.executable, "accelerate": str(Path(sys.executable).with_name("accelerate"))}
    return [tools.get(argv[0], argv[0]), *argv[1:]]


def memory_commands(chosen: dict, stages: list[Stage]) -> dict[str, list[str]]:
    """`python -m scripts.memory` per training stage; none for a CPU set (no GPU memory to estimate)."""
    if chosen["accelerate"] in ("cpu", "multi_cpu"):
        return {}
    hardware = ["--accelerate", chosen["accelerate"], "--num_gpus", str(chosen["num_processes"])]
    return {s.name: ["python", "-m", "scripts.memory", "--recipe", s.recipe, *hardware] for s in stages if s.recipe}


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


def missing_inputs(stages: list[Stage]) -> list[str]:
    """The DATA_ROOT paths the stages still to run read and that do not exist, each with the release to put there."""
    return [
        f"  {path}  <- {release}: hf download {release} --repo-type dataset --local-dir {data_folder(path, release)}"
        for s in stages
        if not s.done
        for path, release in s.inputs.items()
        if not path.exists()
    ]


def data_folder(path: Path, release: str) -> Path:
    """The folder a release downloads into: the path's first part under DATA_ROOT named after it."""
    name = release.split("/")[-1]
    return next((p for p in [path, *path.parents] if p.name == name), path)


def print_plan(stages: list[Stage], memory: dict[str, str], memory_argv: dict[str, list[str]]) -> None:
    for i, s in enumerate(stages, 1):
        state = (
            f"done ({s.output / MARKER})"
            if s.done
            else f"resume from {s.checkpoint().name}"
            if s.checkpoint()
            else "to run"
        )
        print(f"{i}. {s.name}: {state}\n   {shlex.join(s.command())}")
        if s.name in memory_argv:
            estimate = memory.get(s.name, "not estimated (--no_memory)")
            print(f"   memory per GPU ({shlex.join(memory_argv[s.name])}): {estimate}")


def run_stage(s: Stage) -> None:
    """Run one stage; on exit 0 write its marker (the command and when). A stage that is neither resumable nor an
    evaluation (convert, a merge) starts from an empty folder: what an interrupted run left there is incomplete."""
    if s.output.exists() and not s.resumable and not s.name.startswith("eval_"):
        shutil.rmtree(s.output)
    argv = s.command()
    print(f"\n==> {s.name}: {shlex.join(argv)}", flush=True)
    start = time.monotonic()
    code = subprocess.run(executable(argv), cwd=REPO).returncode
    if code:
        raise SystemExit(f"stage {s.name} failed (exit {code}): {shlex.join(argv)}\nRerun the same command to resume.")
    seconds = round(time.monotonic() - start, 1)
    record = {"command": argv, "seconds": seconds, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    s.output.mkdir(parents=True, exist_ok=True)
    (s.output / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe_set", required=True, help="a set of recipes/reproduce.yaml")
    parser.add_argument("--data_root", required=True, type=Path, help="one folder per release (docs/reproduce.md)")
    parser.add_argument("--run_dir", type=Path, help="default: outputs/reproduce/<recipe_set>")
    parser.add_argument("--dry_run", action="store_true", help="print the plan (commands, memory, state); run nothing")
    parser.add_argument("--no_memory", action="store_true", help="skip the memory estimate")
    for stage in ("sft", "rl", "eval"):
        parser.add_argument(f"--{stage}_args", default="", help=f"flags appended to every {stage} command, quoted")
    parser.add_argument("--sets_file", type=Path, default=SETS_FILE, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Stage]:
    args = parse_args(argv)
    chosen, spec = load_set(args.recipe_set, args.sets_file)
    run_dir = (args.run_dir or REPO / "outputs" / "reproduce" / args.recipe_set).resolve()
    data_root = args.data_root.resolve()
    extra = {stage: shlex.split(getattr(args, f"{stage}_args")) for stage in ("sft", "rl", "eval")}
    stages = plan(chosen, spec, data_root, run_dir, extra)
    memory_argv = memory_commands(chosen, stages)
    print(f"make reproduce: set {args.recipe_set}, DATA_ROOT {data_root}, RUN_DIR {run_dir}")
    missing = missing_inputs(stages)
    if args.dry_run:
        print_plan(stages, {} if args.no_memory else estimate_memory(memory_argv), memory_argv)
        print("\n".join(["missing inputs:", *missing]) if missing else "inputs: all present")
        return stages
    if missing:  # before any stage: nothing loads, nothing is half-written
        raise SystemExit(
            f"missing inputs under DATA_ROOT={data_root} (nothing was run):\n" + "\n".join(missing) + "\n"
            "DATA_ROOT holds one folder per release, named as published (docs/reproduce.md)."
        )
    print_plan(stages, {}, {})
    for s in stages:
        if s.done:
            print(f"\n==> {s.name}: done, skipped ({s.output / MARKER})")
        else:
            s.output.parent.mkdir(parents=True, exist_ok=True)
            run_stage(s)
    report = write_report(run_dir, args.recipe_set, chosen, spec, [s.name for s in stages])
    print(f"\nreport: {report}")
    return stages


if __name__ == "__main__":
    main()
