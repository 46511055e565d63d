"""Multi-process tool loops that cannot hang: every process takes part in every generation round of the tool loop.

TRL 1.16's `GRPOTrainer._tool_call_loop` runs one generation round per tool-calling turn, on each process alone:
a process whose rollouts stop calling the tool leaves the loop while the others go on. Three things make a round a
collective that every process must enter the same number of times:
- ZeRO-3 and FSDP: transformers turns on `synced_gpus` in `generate` (each decoding step all-reduces "finished"), and
  `unwrap_model_for_generation` gathers the sharded weights; a process that skipped a round leaves the others
  blocked in it (reproduced with 2 gloo processes, unequal tool depth: a hang until the process-group timeout);
- vLLM server mode: `VLLMGeneration.generate` gathers every process's prompts and slices the answers back assuming
  equal counts (trl#6673): unequal counts take other processes' completions or raise an IndexError;
- vLLM colocate with tensor parallelism: the same gather and slice within each tensor-parallel group.

`AgreedToolRounds` makes the processes agree, at each round, on the largest number of prompts any of them
generates (one all-reduce of a scalar). A process with nothing left takes part with a filler: the first prompt of
its own batch (image included, so the vision tower runs wherever it runs elsewhere), its output discarded. Under vLLM
every process pads its round to the agreed count with copies of the filler, so TRL's equal-count gather and slice
are right. The loop ends when no process has a prompt left. One process: nothing changes.

The filler and the random stream:
- transformers generation: the filler is one new token, sampled on a forked RNG (the CPU generator and this
  process's CUDA device), so after it this process's random stream is exactly what it was before it, and its later
  rollouts are those it would have drawn had it not joined the round. Only this process samples from that stream.
- vLLM: no rewind. The filler is a request like any other, and what it draws is the engine's: under vLLM's V1 model
  runner sampling draws from the device's default generator, which the engines of a tensor-parallel group
  (`vllm_tensor_parallel_size` > 1) must advance identically, so a process that rewound it after its filler would
  diverge from its partners (mismatched collectives or garbage); under the V2 runner (vLLM 0.31's default where
  Triton runs, so on CUDA) each request's seed comes from numpy's global random state, which a torch rewind does not
  reach. A process's later vLLM samples therefore depend on the fillers it generated, as they depend on its other
  requests.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch
import torch.distributed as dist
from transformers import Trainer


class AgreedToolRounds:
    """Mixin for a `GRPOTrainer` subclass: every process takes part in every tool-loop generation round (see the
    module docstring). Overrides `_tool_call_loop` and `_generate_single_turn`."""

    _in_tool_loop = False

    def _agree(self, count: int) -> int:
        """The largest `count` over processes: how many prompts the busiest process generates this round."""
        value = torch.tensor([count], dtype=torch.long, device=self.accelerator.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def _rounds_agree(self) -> bool:
        return self.accelerator.num_processes > 1 and dist.is_available() and dist.is_initialized()

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        if not self._rounds_agree():
            return super()._tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
            )
        self._filler = (list(prompt_ids[0]), list(images[0]) if images and images[0] else None)
        self._in_tool_loop = True
        try:
            out = super()._tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
            )
        finally:
            self._in_tool_loop = False
        while (count := self._agree(0)) > 0:  # the others still generate: take part until none does
            self._generate_filler(count)
        return out

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self._in_tool_loop:  # the first turn: every process generates it once per batch already
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        count = self._agree(len(prompt_ids))
        pad = count - len(prompt_ids) if self.use_vllm else 0
        if pad == 0:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        filler_ids, filler_images = self._filler
        ids = [*prompt_ids, *([filler_ids] * pad)]
        padded_images = None if images is None else [*images, *([filler_images] * pad)]
        completion_ids, logprobs = super()._generate_single_turn(
            ids, padded_images, multimodal_fields, num_generations, has_tool_images
        )
        return completion_ids[: len(prompt_ids)], None if logprobs is None else logprobs[: len(prompt_ids)]

    def _generate_filler(self, count: int) -> None:
        """One round of generation whose output is thrown away, so this process joins the others' collectives."""
        ids, images = self._filler
        rows = count if self.use_vllm else 1
        fields, has_images = {}, bool(images)
        if has_images and not self.use_vllm:  # vLLM takes raw images; transformers the processor's tensors
            fields = dict(
                Trainer._prepare_inputs(
                    self, self.processing_class.image_processor(images=images, return_tensors="pt")
                )
            )
        saved = getattr(self, "generation_config", None)  # transformers generation only; vLLM has none
        if not self.use_vllm:
            self.generation_config = copy.copy(saved)
            self.generation_config.max_new_tokens = 1  # synced generation keeps it stepping until all are done
        # transformers: the rank's own stream, rewound after the filler; vLLM: the engine's, never rewound (module
        # docstring: a tensor-parallel group's engines must sample in lockstep).
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        rewind = nullcontext() if self.use_vllm else torch.random.fork_rng(devices=devices)
        try:
            with rewind:
                super()._generate_single_turn(
                    [ids] * rows, None if images is None else [images] * rows, fields, 1, has_images
                )
        finally:
            if not self.use_vllm:
                self.generation_config = saved
