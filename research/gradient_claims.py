"""`make experiment`: MAPO's gradient claims (Walk the Talk, section 4) measured on the trainer's own code, at fixed
policies, on CPU.

Section 4 argues about the policy-gradient estimate at a fixed policy, not about training curves (RL's own test is
`make experiment-curves`, research/reports/experiment_curves.md), and that can be measured here:

1. **Fixed policies where the question has an answer**: SFT checkpoints of the experiment's world (region hint, 768 px
   squares, the simulated reader of `research.rewards`), each round of the tiny SFT recipe from the last, built once
   and cached (`--start`); the first of `--checkpoints` is the primary one, whose sampled rate of framing the target
   (Q*, `target_in_view_reward`) must lie in `CHECKPOINT_RATE`.
2. **Rollouts and score vectors, once per checkpoint and seed** (`collect`): groups of G through the trainer's own
   rollout path (`MAPOTrainer._generate_and_score_completions`: TRL's tool loop, the real zoom-in tool), and for
   every step (assistant turn) the gradient of the trainer's loss term without its advantage
   (`utils.diagnostics.policy_gradient_loss`: the loss's own token mask and per-sequence normalisation). Only their
   Gram matrix is kept.
3. **Every estimator's advantages from the code that trains** (`replay`, primary checkpoint): a `MAPOTrainer` built
   as `rl.py` builds it replays the recorded rollouts; its rewards, R_sem, z_t, TRL's advantages and HPO's are its
   own. The controls and the quality sweep recombine recorded columns with `mapo.reference_advantages`, which this run
   first checks equal to every replayed MAPO trainer's advantages.
4. **Statistics** (`research.gradient_stats`): the reference directions are the gradients of E[Q*] and of E[V] (V: a
   well-formed rollout with a valid call) from unnormalised sequence scores with a leave-one-out baseline, and the
   framing direction (grad Q* with grad E[V] projected out); each estimator's batch gradient keeps the trainer's loss
   terms; the primary metric is the expected gain of one normalised SGD step; a stratified bootstrap over prompts of
   the whole pipeline gives standard errors; verdicts are stated before the numbers.

Its parts, by what each measures: `research.gradient_rollouts` (2 and 3's rollouts, score vectors and replays),
`research.gradient_products` (the reference directions and every arm's products with them),
`research.gradient_arms` (the estimators, controls and quality sweep), `research.gradient_verdicts` (4's verdicts),
`research.gradient_words` and `research.gradient_report` (the report); this module builds the trainers as `rl.py`
does, measures, and runs it all.

    make experiment                                   # checkpoints (cached), rollouts, replays, report
    make experiment ARGS="--reuse"                    # the report again from the cached measurements
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import rl
from data.benchmarks import load_saved_split
from evaluation.verifier_check import check_verifier
from mapo_trainer import MAPOTrainer

# The names marked noqa: F401 are re-exported: the tests read the measurement's parts as `gradient_claims.X`, as before
# the module was split by what each part measures (issue 63)
from research import gradient_stats as gs  # noqa: F401
from research.gradient_arms import (  # noqa: F401
    CHAIN,
    CONSTANT_BONUSES,
    ESTIMATORS,
    REFERENCE,
    check_replays,
    episode_advantages,
    semantics,
    walk_scores,
)
from research.gradient_products import DIRECTIONS, Directions  # noqa: F401
from research.gradient_report import write_report
from research.gradient_rollouts import (  # noqa: F401
    RecordingTrainer,
    Replayed,
    ReplayTrainer,
    Rollouts,
    collect,
    replay,
    step_advantages,
    step_vectors,
    turns_of,
)
from research.gradient_verdicts import (
    RECIPE_PROMPTS,  # noqa: F401
    analyse,
    analyse_replication,
)
from research.gradient_words import p1_verdict, pm_full, prop2b_words, short_summary, summary  # noqa: F401
from research.rewards import READER_HIT_P, READER_MISS_P, reader_outcome  # noqa: F401
from rewards.verifiers import build_verifier
from tiny import stages
from tools import ToolConfig, make_environment_factory
from utils.models import load_processor, pixel_budget

RECIPE = "research/recipes/config_experiment.yaml"
REPORT = Path("research/reports/experiment.md")


# ------------------------------------------------------------------------------------------------- the trainers
def parse_run(start: Path, checkpoint: Path, kit: dict, name: str, **fields) -> tuple:
    """The recipe's parsed arguments from `checkpoint`, as `rl.py` parses them, with `fields` on top."""
    argv = stages.rl_argv(
        checkpoint,
        start / "data",
        start / "clip",
        start / "trainers" / name,
        1,
        recipe=RECIPE,
        hpo_text_encoder=kit["text_encoder"],
        **fields,
    )
    return stages.rl_args(argv)


def build(
    start: Path, checkpoint: Path, kit: dict, name: str, trainer_cls: type[MAPOTrainer], **fields
) -> MAPOTrainer:
    """`rl.build_trainer` on the recipe with `fields`, its model in training mode (what `train` would set)."""
    trainer = rl.build_trainer(*parse_run(start, checkpoint, kit, name, **fields), trainer_cls=trainer_cls)
    trainer.model.train()
    return trainer


# ------------------------------------------------------------------------------------------------- measurement
def measure(
    args: argparse.Namespace,
    start: Path,
    checkpoint: Path,
    rollouts: int,
    seed: int,
    replays: bool = True,
    log=print,
    recording_cls: type[RecordingTrainer] = RecordingTrainer,
    first_prompt: int = 0,
) -> tuple[dict, list[dict]]:
    """`rollouts` rollouts at `checkpoint` (seeded by `seed`) on the train split's rows from `first_prompt` on, their
    Gram matrix and, with `replays`, every estimator's replay; and the recorded batches. `recording_cls` draws the
    rollouts (a test scripts its calls)."""
    kit = stages.tiny_kit()
    recorder = build(start, checkpoint, kit, "recording", recording_cls, **ESTIMATORS[REFERENCE])
    group = recorder.num_generations
    batch_prompts = recorder.args.per_device_train_batch_size // group
    prompts = rollouts // group
    if first_prompt + prompts > len(recorder.train_dataset):
        raise ValueError(
            f"{rollouts} rollouts from prompt {first_prompt}: the train split has {len(recorder.train_dataset)} prompts"
        )
    recipe_scaling = recorder.scale_rewards
    parameters = sum(p.numel() for p in recorder.model.parameters() if p.requires_grad)  # the score vectors' size
    timings = {}
    t = time.time()
    log(
        f"{checkpoint.name}, seed {seed}: {rollouts} rollouts in groups of {group} from prompt {first_prompt}, "
        f"{batch_prompts} prompts a batch"
    )
    batches, recorded = collect(recorder, range(first_prompt, first_prompt + prompts), batch_prompts, seed, log)
    timings["rollouts and score vectors"] = time.time() - t
    del recorder
    replayed = {}
    t = time.time()
    for name, fields in ESTIMATORS.items() if replays else ():
        for scaling in dict.fromkeys((recipe_scaling, "none")):
            trainer = build(
                start, checkpoint, kit, f"{name}-{scaling}", ReplayTrainer, scale_rewards=scaling, **fields
            )
            replayed[(name, scaling)] = replay(trainer, batches)
            log(f"  replayed {name} (scale_rewards {scaling}): {time.time() - t:.0f} s")
            del trainer
    if replays:
        timings["replays"] = time.time() - t
    measurement = {
        "checkpoint": checkpoint.name,
        "seed": seed,
        "first_prompt": first_prompt,
        "prompt_rows": list(range(first_prompt, first_prompt + prompts)),
        "rollouts": recorded,
        "replays": replayed,
        "group": group,
        "batch_prompts": batch_prompts,
        "recipe_scaling": recipe_scaling,
        "parameters": parameters,
        "recipe": {k: v for part in parse_run(start, checkpoint, kit, "recipe") for k, v in vars(part).items()},
        "timings": timings,
    }
    return measurement, batches


# ------------------------------------------------------------------------------------------------- main
def save_measurement(measurement: dict, path: Path) -> None:
    """`measure`'s output as plain containers (loadable whatever module ran it)."""
    plain = dict(measurement, rollouts=vars(measurement["rollouts"]))
    plain["replays"] = {f"{name}|{scale}": vars(rep) for (name, scale), rep in measurement["replays"].items()}
    torch.save(plain, path)


def load_measurement(path: Path) -> dict:
    """What `save_measurement` wrote."""
    plain = torch.load(path, weights_only=False)
    replays = {tuple(key.split("|")): Replayed(**rep) for key, rep in plain["replays"].items()}
    return dict(plain, rollouts=Rollouts(**plain["rollouts"]), replays=replays)


def checkpoint_path(start: Path, round_: int) -> Path:
    return start / f"sft-round{round_}"


def prepare_start(start: Path, sft_steps: int, rounds: int, image_side: int, log=print) -> None:
    """The fixed policies, built once by the demo's stages in the experiment's world and cached in `start`: the tiny
    CLIP verifier, the data (square images of `image_side`), and `rounds` runs of the tiny SFT recipe of `sft_steps`
    each, each from the last (`sft-round<i>`)."""
    kit = stages.tiny_kit()
    if not (start / "clip" / "open_clip_config.json").exists():
        log("the CLIP verifier")
        stages.train_verifier(start / "clip", kit, 300)
    if not (start / "data" / "dataset_dict.json").exists():
        log("the data")
        stages.make_data(start / "data", 1024, 128, min_size=image_side, max_size=image_side)
    previous = kit["policy"]
    for i in range(1, rounds + 1):
        out = checkpoint_path(start, i)
        if not (out / "config.json").exists():
            log(f"SFT round {i} of {rounds} ({sft_steps} steps)")
            stages.run_sft(previous, start / "data", out, sft_steps)
        previous = out


def tiny_clip_gate(start: Path, checkpoint: Path, rows: int) -> dict[str, dict]:
    """The verifier gate (talk and walk axes) of the start's tiny CLIP on the first `rows` test rows."""
    budget = pixel_budget(load_processor(checkpoint))
    tool = ToolConfig(clip_model=str(start / "clip")).resolved(budget)
    test = load_saved_split(str(start / "data"), "test").select(range(rows))
    make_env = make_environment_factory(tool, budget)
    gate = check_verifier(
        build_verifier("clip", tool), list(test), make_env, semantic_scores=("cosine", "contrastive")
    )
    return {score: result.as_dict() for score, result in gate.items()}


def runs(args: argparse.Namespace) -> list[tuple[int, int, int, int]]:
    """(SFT round, seed, rollouts, first prompt) of every measurement: the primary checkpoint at each seed, each on
    the train split's prompts after the previous seed's (the first is the primary run, the others are pooled with
    it), then the other checkpoints at the first seed from prompt 0."""
    primary, *others = args.checkpoints
    first, *more = args.seeds
    out = [(primary, first, args.rollouts, 0)]
    for seed in more:
        _, _, rollouts, start = out[-1]
        out.append((primary, seed, args.pooled_rollouts, start + rollouts // args.group))
    out += [(c, first, args.replication_rollouts, 0) for c in others]
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    add("--rollouts", type=int, default=2560, help="rollouts of the primary measurement (groups of the recipe's G)")
    add(
        "--pooled_rollouts",
        type=int,
        default=1536,
        help="rollouts of each further seed at the primary checkpoint, on prompts no earlier run used (1536: the train "
        "split's last 384 prompts after the primary's 640)",
    )
    add("--replication_rollouts", type=int, default=1024, help="rollouts of every other checkpoint")
    add("--checkpoints", type=ints, default=[2, 1, 3, 4], help="SFT rounds measured, the primary first")
    add(
        "--seeds",
        type=ints,
        default=[0, 2],
        help="rollout seeds at the primary checkpoint, the primary first; the others are independent runs pooled with "
        "it (2: a seed the second version did not use)",
    )
    add("--group", type=int, default=4, help="the recipe's num_generations, to place each run's prompts")
    add("--folds", type=int, default=4, help="folds by prompt (at least 4: the unbiased squares need 4)")
    add("--bootstrap", type=int, default=200, help="bootstrap replicates over prompts")
    add("--start", type=Path, default=Path("outputs/claims"), help="the cached checkpoints, data and CLIP")
    add("--sft_steps", type=int, default=900, help="SFT steps of each round, when a checkpoint is built")
    add("--image_side", type=int, default=768)
    add("--gate_rows", type=int, default=64, help="held-out rows of the tiny CLIP's verifier gate (0: skip)")
    add("--report", type=Path, default=REPORT, help="the PNG and results.json go in <report>/")
    add("--reuse", action="store_true", help="reuse <start>/measurement-*.pt instead of measuring again")
    add(
        "--render", action="store_true", help="rewrite the report from its results.json alone (its words, not figures)"
    )
    args = parser.parse_args(argv)
    if args.folds < 4 or args.bootstrap < 2:
        parser.error("--folds needs at least 4 and --bootstrap at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.render:
        record = json.loads((args.report.with_suffix("") / "results.json").read_text(encoding="utf-8"))
        replications, setup = record.pop("replications"), record.pop("setup")
        print(f"report: {write_report(args.report, record, replications, setup)} (rewritten from its results.json)")
        return record
    prepare_start(args.start, args.sft_steps, max(args.checkpoints), args.image_side)
    started, cpu = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    measurements, timings = [], {}
    plan = runs(args)
    pooled = sum(1 for round_, *_ in plan if round_ == args.checkpoints[0])
    for i, (round_, seed, rollouts, first) in enumerate(plan):
        saved = args.start / f"measurement-round{round_}-seed{seed}-n{rollouts}-p{first}.pt"
        if args.reuse and saved.exists():
            measurements.append(load_measurement(saved))
        else:
            m, _ = measure(
                args, args.start, checkpoint_path(args.start, round_), rollouts, seed, replays=i < pooled,
                first_prompt=first,
            )  # fmt: skip
            save_measurement(m, saved)
            measurements.append(m)
        if measurements[-1]["group"] != args.group:
            raise ValueError(f"--group {args.group}: the recipe's num_generations is {measurements[-1]['group']}")
        for k, v in measurements[-1]["timings"].items():
            timings[k] = timings.get(k, 0.0) + v
    t = time.time()
    primary, others = measurements[:pooled], measurements[pooled:]
    check_independent(primary)
    results = analyse(primary, args.folds, args.bootstrap)
    replications = [analyse_replication(m, args.folds, args.bootstrap, results["batch_sizes"]) for m in others]
    timings["statistics"] = time.time() - t
    primary_path = checkpoint_path(args.start, args.checkpoints[0])
    gate = tiny_clip_gate(args.start, primary_path, args.gate_rows) if args.gate_rows else None
    used = resource.getrusage(resource.RUSAGE_SELF)
    setup = {
        "date": datetime.date.today().isoformat(),
        "command": command_line(argv),
        "start": str(args.start),
        "sft_steps": args.sft_steps,
        "parameters": primary[0]["parameters"],
        "timings": timings,
        "minutes": (time.time() - started) / 60,
        "cpu_minutes": (used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime) / 60,
        "load": os.getloadavg()[0],
        "cores": torch.get_num_threads(),
        "gate": gate,
    }
    report = write_report(args.report, results, replications, setup)
    print(f"report: {report} ({setup['minutes']:.1f} min wall, {setup['cpu_minutes']:.1f} min CPU)")
    return results


def check_independent(ms: Sequence[dict]) -> None:
    """Runs pooled as one sample must be independent draws: no train-split prompt measured twice."""
    seen: dict[int, int] = {}
    for m in ms:
        for row in m["prompt_rows"]:
            if row in seen:
                raise ValueError(f"prompt {row} is measured by the runs of seeds {seen[row]} and {m['seed']}: pooled "
                                 "runs need prompts no other run used")  # fmt: skip
            seen[row] = m["seed"]


def command_line(argv: Sequence[str]) -> str:
    """The command that measures anew what this run reports (`--reuse` only skipped the measuring)."""
    measuring = [a for a in argv if a != "--reuse"]
    return f'make experiment ARGS="{" ".join(measuring)}"' if measuring else "make experiment"


if __name__ == "__main__":
    main()
