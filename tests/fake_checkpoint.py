"""Small but real `Trainer` checkpoints for tests of resuming: what `transformers.Trainer._save_checkpoint` writes for a
whole-model run (safetensors weights, the optimizer's and scheduler's torch files, trainer_state.json), for a model of
one layer, in the formats and layout of a 7B checkpoint's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers.trainer_callback import TrainerState


def write_checkpoint(output_dir: Path, step: int, *, shards: int = 1) -> Path:
    """`output_dir/checkpoint-<step>`, after one real AdamW step of a 4x4 linear layer; `shards` > 1 splits its weights
    over `model-0000i-of-0000n.safetensors` files named by `model.safetensors.index.json`, as large models are saved."""
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    layer(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    weights = {name: tensor.detach().clone() for name, tensor in layer.state_dict().items()}
    if shards == 1:
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        names = sorted(weights)
        weight_map = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {name: weights[name] for name in names[i::shards]}
            save_file(part, folder / shard, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(part, shard)
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    TrainerState(global_step=step, max_steps=10).save_to_json(str(folder / "trainer_state.json"))
    return folder
