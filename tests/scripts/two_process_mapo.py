"""Run by tests/test_multiprocess.py under `torchrun --nproc_per_node 2` (CPU, gloo): one MAPO step with forced
tool calls, each process scoring its own rollouts; rank 0 writes what it saw to the JSON file named in argv[1]."""

import json
import sys
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import gather_object

from data.synthetic import build_synthetic
from mapo_trainer import SEMANTIC_REWARD_NAME, MAPOTrainer
from scripted import tiny_trainer
from tiny_models import kit_paths

out = Path(sys.argv[1])
kit = kit_paths(Path("outputs/tiny"))
trainer = tiny_trainer(
    MAPOTrainer, kit, build_synthetic(4, seed=0, split="train"), out.parent / "run", max_steps=1, num_generations=4
)
scored = []
similarity = trainer.verifier.similarity
trainer.verifier.similarity = lambda labels, images: scored.append(len(labels)) or similarity(labels, images)
trainer.train()
state = PartialState()
gathered = gather_object([{"rank": state.process_index, "crops_scored_here": sum(scored)}])
if state.is_main_process:
    log = [e for e in trainer.state.log_history if "rewards/semantic/mean" in e][-1]
    out.write_text(
        json.dumps(
            {
                "processes": gathered,
                "semantic_rewards_logged": len(trainer._logs["rewards"][SEMANTIC_REWARD_NAME]),
                "log": log,
            }
        )
    )
