"""The tiny MAPO run that tests/test_multiprocess.py compares across process counts: 2 steps with forced tool calls.

Run as `accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml --num_processes 2 <this> OUT.json
PER_DEVICE RUNS` (two gloo processes on CPU) or in-process through `run()` (one process). RUNS is a JSON object
`{name: {run()'s keyword arguments}}`: one launch trains every named run in turn, so the launch's start (imports,
process group) is paid once. The global batch is `PER_DEVICE x processes`; the test picks 2 x 2 against 1 x 4. The
main process writes, per run and per step, what TRL and `MAPOTrainer` logged: every reward column (gathered), the
advantages, the completions, the crops each process scored, and the step's logged metrics.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback

from data.synthetic import build_synthetic
from mapo_trainer import MAPOTrainer
from rewards import format_reward
from tiny.kit import kit_paths
from tiny.scripted import force_tool_calls, tiny_trainer
from utils.models import load_model, load_processor

STEPS = 2
DEEP = "Look twice."  # the marker of a question whose rollouts zoom in twice
ROWS = 4  # 2 steps x 2 prompts, in dataset order (shuffle_dataset=False): step 1 rows 0 and 1, step 2 rows 2 and 3


def flipped_format(completions, flip, **kwargs) -> list[float]:
    """The format reward, inverted on rows whose `flip` is 1 (odd dataset rows).

    The scripted answers alternate with the row's index inside each process's batch, so every process sees the same
    reward pattern; with this inversion the two groups of a step (one per process) get opposite advantages, and a
    process training on another's slice of advantages (a slicing bug) changes the loss's sign instead of nothing.
    """
    return [1.0 - r if f else r for r, f in zip(format_reward(completions), flip)]


class Snapshot(TrainerCallback):
    """After each optimizer step, a copy of the trainer's `_logs` (TRL keeps only the last generation batch)."""

    def __init__(self):
        self.trainer: MAPOTrainer | None = None
        self.steps: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        logs = self.trainer._logs
        self.steps.append(
            {
                "rewards": {name: list(values) for name, values in logs["rewards"].items()},
                "advantages": list(logs["advantages"]),
                "completions": [str(c) for c in logs["completion"]],
                "zoom_labels": list(logs["extra"].get("zoom_labels", [])),
                "z_t": list(logs["extra"].get("z_t", [])),
            }
        )


def look_twice(row: dict, index: int) -> dict:
    """Even rows ask for two zoom-in calls (`DEEP` in the question), odd rows for one: unequal tool depth."""
    if index % 2:
        return row
    system, user = row["prompt"]
    return {"prompt": [system, {**user, "content": f"{user['content']} {DEEP}"}]}


def run(
    output_dir: str | Path,
    per_device: int,
    kit_dir: str | Path = "outputs/tiny",
    *,
    unequal_depth: bool = False,
    synced_gpus: bool = False,
    **config,
) -> dict | None:
    """Train 2 steps; on the main process return what was logged (None elsewhere). `config`: more MAPOConfig fields
    (another estimator, say). `unequal_depth`: even rows' rollouts make two zoom-in calls, odd rows' one, so with 2
    processes rank 0 runs one more tool round than rank 1. `synced_gpus`: generation synchronized across processes,
    as transformers turns it on under ZeRO-3 and FSDP (every decoding step all-reduces)."""
    kit = kit_paths(Path(kit_dir))
    processor = load_processor(str(kit["policy"]))
    model = load_model(str(kit["policy"]), dtype=torch.float32)
    if synced_gpus:
        model.generate = functools.partial(model.generate, synced_gpus=True)
    force_tool_calls(model, processor.tokenizer, depth=(lambda text: 1 + (DEEP in text)) if unequal_depth else None)
    dataset = build_synthetic(ROWS, seed=0, split="train").add_column("flip", [i % 2 for i in range(ROWS)])
    if unequal_depth:
        dataset = dataset.map(look_twice, with_indices=True)
    snapshot = Snapshot()
    trainer = tiny_trainer(
        MAPOTrainer,
        kit,
        dataset,
        str(output_dir),
        model=model,
        processor=processor,
        reward_funcs=("outcome", flipped_format),
        callbacks=[snapshot],
        shuffle_dataset=False,
        max_steps=STEPS,
        per_device_train_batch_size=per_device,
        optim="sgd",  # Adam normalises each gradient entry: float noise in near-zero entries would become full steps
        learning_rate=1e-1,  # large, so step 2 shows whether step 1 updated the weights alike
        **{"num_generations": 2} | config,
    )
    snapshot.trainer = trainer
    scored: list[int] = []
    similarity = trainer.verifier.similarity
    trainer.verifier.similarity = lambda labels, images: scored.append(len(labels)) or similarity(labels, images)
    # Each process's own advantages, after TRL sliced the gathered ones back: what its loss really trains on (the
    # logged `advantages` are gathered before slicing, so a slicing bug cannot show in them).
    sliced: list[list[float]] = []
    generate_and_score = trainer._generate_and_score_completions

    def recorded(inputs):
        out = generate_and_score(inputs)
        sliced.append(out["advantages"].tolist())
        return out

    trainer._generate_and_score_completions = recorded
    trainer.train()
    state = PartialState()
    processes = gather_object(
        [{"rank": state.process_index, "crops_scored_here": sum(scored), "sliced_advantages": sliced}]
    )
    if not state.is_main_process:
        return None
    logged = [e for e in trainer.state.log_history if "rewards/semantic/mean" in e]
    return {"num_processes": state.num_processes, "processes": processes, "steps": snapshot.steps, "log": logged}


if __name__ == "__main__":  # OUT.json PER_DEVICE RUNS
    out = Path(sys.argv[1])
    runs = json.loads(sys.argv[3])
    results = {name: run(out.parent / name, per_device=int(sys.argv[2]), **extra) for name, extra in runs.items()}
    if PartialState().is_main_process:
        out.write_text(json.dumps(results, indent=1))
    # Everything is written: leave without the interpreter's teardown. In 2 of 5 fresh-clone CI runs one rank
    # aborted there ("terminate called without an active exception", exit -6: a C++ thread still joinable when
    # static destructors ran), once even after destroying the process group; the results were complete both times.
    # Any failure before this line still exits non-zero through the exception.
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
