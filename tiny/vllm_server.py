"""`trl vllm-serve` on CPU with the tiny kit: how the tests start it, and the one piece of server mode a CPU lacks.

TRL 1.16 pushes the trainer's weights over vLLM's NCCL weight-transfer engine; vLLM 0.31 has no transfer backend
without CUDA (nccl, sparse_nccl and nccl_m2n use NCCL, ipc CUDA IPC, sharded_rdt Ray and CUDA streams).
`disk_weight_transfer` replaces that transport, and only that: TRL still gathers the parameters, the server loads them
through its own `reload_weights` (the dev-mode `/collective_rpc`), and everything else goes to the real server as on a
GPU node (docs/vllm.md). It makes no encoder-cache reset itself: `reload_weights` clears the worker's encoder cache but
not the scheduler's, so without the trainer's own reset the server tests die ("Encoder cache miss").
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from trl.generation.vllm_client import VLLMClient


def serve_command(model: str | Path, port: int, *extra: str) -> list[str]:
    """`trl vllm-serve` for the tiny policy on CPU: eager (no torch.compile: ~1 min to healthy on 2 cores instead of
    several) and float32 like the trainer (`auto` would serve the float32 checkpoint in bfloat16)."""
    trl = Path(sys.executable).with_name("trl")
    return [str(trl), "vllm-serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--enforce_eager", "--dtype", "float32", *extra]  # fmt: skip


def disk_weight_transfer(directory: str | Path) -> None:
    """Make every `VLLMClient` in this process push weights through `directory` instead of NCCL (see the module
    docstring). Process-wide: call it before the trainer builds its client."""
    directory = Path(directory)

    def init_communicator(self, device=0):
        self._pushes = 0  # nothing to open: the server reads the file it is told

    def update_named_params(self, metadata, named_params: Iterable[tuple[str, torch.Tensor]]):
        directory.mkdir(parents=True, exist_ok=True)
        save_file({name: p.detach().cpu().contiguous() for name, p in named_params}, directory / "model.safetensors")
        reload = {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
        # No /reset_encoder_cache here: the trainer's own call after the sync must make it (module docstring).
        response = self.session.post(f"{self.base_url}/collective_rpc", json=reload)
        if response.status_code != 200:
            raise RuntimeError(f"/collective_rpc failed: {response.status_code} {response.text[:500]}")
        self._pushes += 1

    VLLMClient.init_communicator = init_communicator
    VLLMClient.update_named_params = update_named_params
