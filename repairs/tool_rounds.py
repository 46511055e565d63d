"""Multi-process tool loops that cannot hang: every process takes part in every generation round of the tool loop.

TRL 1.16's `_tool_call_loop` runs one generation round per tool-calling turn on each process alone, so a process
whose rollouts stop calling the tool leaves the loop while the others go on. Yet a round is a collective: under ZeRO-3
and FSDP (`synced_gpus` in `generate`, gathered weights: a hang until the process-group timeout), in vLLM server mode
(TRL gathers every process's prompts and slices the answers back assuming equal counts, trl#6673; docs/vllm.md) and
in colocate mode with tensor parallelism (the same gather within each group).

`AgreedToolRounds` agrees, at each round, on the largest prompt count of any process (one all-reduce). A process with
nothing left joins with a filler, the first prompt of its own batch (its image included), its output discarded; under
vLLM every process pads its round to the agreed count with copies of it. One process: nothing changes.

The filler and the random stream: under transformers the filler samples one token on a forked RNG, so this process's
later rollouts are those it would have drawn without it. Under vLLM there is no rewind: the engines of a
tensor-parallel group must advance the device generator identically (V1 runner), and the V2 runner seeds each request
from numpy's global state, which a torch rewind does not reach; later vLLM samples depend on the fillers.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch
import torch.distributed as dist
from transformers import Trainer


class AgreedToolRounds:
    """Mixin for a `GRPOTrainer` subclass: every process takes part in every tool-loop generation round (module
    docstring). Overrides `_tool_call_loop` and `_generate_single_turn`."""

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
        # transformers: the rank's own stream, rewound after the filler; vLLM: the engine's, never rewound (module doc)
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
