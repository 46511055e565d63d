"""The tiny MAPO run that tests/test_multiprocess.py compares across process counts: 2 steps with forced tool calls.

Run as `accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml --num_processes 2 <this> OUT.json
PER_DEVICE RUNS [LOADING_ENV]` (two gloo processes on CPU) or in-process through `run()` (one process). RUNS is a JSON
object `{name: {run()'s keyword arguments}}`: one launch trains every named run in turn, so the launch's start (imports,
process group) is paid once. The global batch is `PER_DEVICE x processes`; the test picks 2 x 2 against 1 x 4. The
main process writes, per run and per step, what TRL and `MAPOTrainer` logged: every reward column (gathered), the
advantages, the completions, the crops each process scored, and the step's logged metrics. LOADING_ENV, a JSON object
of environment variables (those `accelerate launch` sets for an FSDP config), first loads the frozen helper models
under it on both processes (`helper_weights`), and writes what each process loaded under "helper_weights".
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import AutoModel, TrainerCallback

from data.synthetic import build_synthetic
from mapo_trainer import MAPOTrainer
from rewards import format_reward
from rewards.verifiers import ClipVerifier
from tiny.kit import kit_paths
from tiny.scripted import DEFAULT_LABELS, force_tool_calls, tiny_trainer
from tools import ToolConfig
from utils.models import load_model, load_processor, load_text_encoder

STEPS = 2
DEEP = "Look twice."  # the marker of a question whose rollouts zoom in twice
OVER = "Look on and on."  # a question whose rollouts all keep calling the tool past max_tool_calling_iterations
HALF = "Look on in blue."  # a question whose rollouts labelled "blue square" do so
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


def over_turn_depth(text: str) -> int:
    """Zoom-in calls a rollout makes: 3 (past max_tool_calling_iterations 2, so it ends over-turn) for an `OVER`
    question, and for a `HALF` question whose first call was labelled with the second scripted label; else 1."""
    first_call = text.split("<tool_call>", 1)[1] if "<tool_call>" in text else ""
    return 3 if OVER in text or (HALF in text and DEFAULT_LABELS[1] in first_call) else 1


def mark_over_turn(row: dict, index: int) -> dict:
    """Row 0 asks for over-turn rollouts (`OVER`), row 1 for one of its two (`HALF`): with 2 processes x 2 prompts
    (gradient_accumulation_steps 2), rank 0 holds rows 0 and 1, 3 of its 4 rollouts over-turn, so one of its two
    micro-batches is wholly masked and the other has a lone survivor, whatever TRL's shuffle; rank 1 keeps all 4."""
    marker = {0: OVER, 1: HALF}.get(index)
    if marker is None:
        return row
    system, user = row["prompt"]
    return {"prompt": [system, {**user, "content": f"{user['content']} {marker}"}]}


class GradientRecorder(TrainerCallback):
    """The first optimizer step's gradient, flattened, as the optimizer sees it (after DDP's average, before its
    step; max_grad_norm 0 leaves it unclipped)."""

    def __init__(self):
        self.gradient: torch.Tensor | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.gradient is None:
            grads = [p.grad.flatten() for p in model.parameters() if p.requires_grad and p.grad is not None]
            self.gradient = torch.cat(grads).detach().cpu().clone()


def weight_digest(model: torch.nn.Module) -> dict:
    """What a process loaded: the sum of |w| over every parameter (float64) and a hash of their bytes."""
    params = [p.detach().cpu().contiguous() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
    return {"abs_sum": sum(float(p.double().abs().sum()) for p in params), "sha256": digest}


def helper_weights(kit_dir: str | Path, env: dict[str, str]) -> list[dict] | None:
    """Under `env` (the variables `accelerate launch` sets for an FSDP config with fsdp_cpu_ram_efficient_loading),
    load on every process HPO's text encoder and the CLIP verifier as the trainer does, and the encoder through plain
    `AutoModel.from_pretrained` (the control: what transformers does without `utils.models`' guard); on the main
    process, each process's `weight_digest` of the three."""
    kit = kit_paths(Path(kit_dir))
    state = PartialState(cpu=True)  # gloo, as the runs' use_cpu makes it; transformers' is_fsdp_enabled needs it up
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        encoder, _ = load_text_encoder(str(kit["text_encoder"]))
        clip = ClipVerifier(ToolConfig(clip_model=str(kit["clip"]))).model
        unguarded = AutoModel.from_pretrained(str(kit["text_encoder"]))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    mine = {
        "rank": state.process_index,
        "local_rank": os.environ.get("LOCAL_RANK"),
        "encoder": weight_digest(encoder),
        "clip": weight_digest(clip),
        "unguarded_encoder": weight_digest(unguarded),
    }
    every = gather_object([mine])
    return every if state.is_main_process else None


def run(
    output_dir: str | Path,
    per_device: int,
    kit_dir: str | Path = "outputs/tiny",
    *,
    unequal_depth: bool = False,
    synced_gpus: bool = False,
    over_turn: bool = False,
    zero_over_turn_advantages: bool = False,
    **config,
) -> dict | None:
    """Train 2 steps; on the main process return what was logged (None elsewhere). `config`: more MAPOConfig fields
    (another estimator, say). `unequal_depth`: even rows' rollouts make two zoom-in calls, odd rows' one, so with 2
    processes rank 0 runs one more tool round than rank 1. `synced_gpus`: generation synchronized across processes,
    as transformers turns it on under ZeRO-3 and FSDP (every decoding step all-reduces). `over_turn`: rows 0 and 1's
    rollouts end over-turn as `mark_over_turn` says, and the first step's gradient is saved (`gradient.pt` in
    `output_dir`, on the main process); `zero_over_turn_advantages`: their advantages are zeroed after scoring (the
    reference a masked run is compared with)."""
    kit = kit_paths(Path(kit_dir))
    processor = load_processor(str(kit["policy"]))
    model = load_model(str(kit["policy"]), dtype=torch.float32)
    if synced_gpus:
        model.generate = functools.partial(model.generate, synced_gpus=True)
    depth = (lambda text: 1 + (DEEP in text)) if unequal_depth else over_turn_depth if over_turn else None
    force_tool_calls(model, processor.tokenizer, depth=depth)
    dataset = build_synthetic(ROWS, seed=0, split="train").add_column("flip", [i % 2 for i in range(ROWS)])
    if unequal_depth:
        dataset = dataset.map(look_twice, with_indices=True)
    if over_turn:
        dataset = dataset.map(mark_over_turn, with_indices=True)
    snapshot, recorder = Snapshot(), GradientRecorder()
    trainer = tiny_trainer(
        MAPOTrainer,
        kit,
        dataset,
        str(output_dir),
        model=model,
        processor=processor,
        reward_funcs=("outcome", flipped_format),
        callbacks=[snapshot, recorder],
        shuffle_dataset=False,
        per_device_train_batch_size=per_device,
        optim="sgd",  # Adam normalises each gradient entry: float noise in near-zero entries would become full steps
        learning_rate=1e-1,  # large, so step 2 shows whether step 1 updated the weights alike
        **{"num_generations": 2, "max_steps": STEPS} | config,
    )
    snapshot.trainer = trainer
    scored: list[int] = []
    similarity = trainer.verifier.similarity
    trainer.verifier.similarity = lambda labels, images: scored.append(len(labels)) or similarity(labels, images)
    # Each process's own advantages, after TRL sliced the gathered ones back: what its loss really trains on (the
    # logged `advantages` are gathered before slicing, so a slicing bug cannot show in them).
    sliced: list[list[float]] = []
    over: list[list[bool]] = []  # each step's over-turn rollouts of this process
    scales: list[float] = []  # each step's `kept_row_scale`, where the mask set it
    generate_and_score = trainer._generate_and_score_completions

    def recorded(inputs):
        out = generate_and_score(inputs)
        if zero_over_turn_advantages:
            out["advantages"] = out["advantages"] * (~trainer._over_turn).to(out["advantages"].dtype)
        sliced.append(out["advantages"].tolist())
        over.append(trainer._over_turn.tolist())
        if "kept_row_scale" in out:
            scales.append(float(out["kept_row_scale"]))
        return out

    trainer._generate_and_score_completions = recorded
    trainer.train()
    state = PartialState()
    mine = {"rank": state.process_index, "crops_scored_here": sum(scored), "sliced_advantages": sliced}
    processes = gather_object([mine | {"over_turn": over, "kept_row_scale": scales}])
    if not state.is_main_process:
        return None
    logged = [e for e in trainer.state.log_history if "rewards/semantic/mean" in e]
    result = {"num_processes": state.num_processes, "processes": processes, "steps": snapshot.steps, "log": logged}
    if over_turn:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        torch.save(recorder.gradient, Path(output_dir) / "gradient.pt")
        result["gradient"] = str(Path(output_dir) / "gradient.pt")
    return result


if __name__ == "__main__":  # OUT.json PER_DEVICE RUNS [LOADING_ENV]
    out = Path(sys.argv[1])
    runs = json.loads(sys.argv[3])
    results = {}
    if len(sys.argv) > 4:
        results["helper_weights"] = helper_weights("outputs/tiny", json.loads(sys.argv[4]))
    results |= {name: run(out.parent / name, per_device=int(sys.argv[2]), **extra) for name, extra in runs.items()}
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
