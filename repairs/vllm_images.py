"""vLLM rollouts with image-returning tools under TRL 1.16 (docs/vllm.md, "What `MAPOTrainer` changes"): each image
reaches a colocated vLLM with exactly one placeholder (trl#6294: TRL hands vLLM processor-expanded ids, which vLLM
expands again, silently), and the prompt ids vLLM returns are checked against the trainer's in both modes. Also: the
colocated engine's missing `LLM(...)` options (`colocate_engine_options`) and the encoder-cache reset after every
weight sync (`reset_encoder_cache_after_sync`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trl.generation.vllm_generation as trl_vllm
from trl.extras.profiling import profiling_context

from tools.config import PixelBudget
from utils.models import pixel_budget


def image_runs(ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """`(start, length)` of every maximal run of `image_token_id` in `ids`, in order."""
    runs, start = [], 0
    for token, group in itertools.groupby(ids):
        length = len(list(group))
        if token == image_token_id:
            runs.append((start, length))
        start += length
    return runs


def collapse_image_runs(ids: Sequence[int], image_token_id: int) -> list[int]:
    """`ids` with every run of image tokens cut to a single placeholder token, what vLLM expects with images.

    Runs never merge across images: Qwen-VL templates wrap each image as `<|vision_start|>pads<|vision_end|>`.
    """
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


class VLLMImagePlaceholders:
    """Mixin for a `GRPOTrainer` subclass: in vLLM colocate mode, every image reaches vLLM with one placeholder; in
    both vLLM modes, the prompt ids `VLLMGeneration.generate` returns are checked against the trainer's.

    Overrides `_generate_single_turn`, the one method every vLLM call passes through (the first turn and every tool
    turn), and runs TRL's vLLM branch of it itself (sync the weights when the step changed, generate, keep the sampled
    tokens' logprobs), keeping the prompt ids TRL throws away. The trainer keeps the expanded ids for the loss. Server
    mode sends the expanded ids on purpose: TRL places the server's image features on their runs.
    """

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self.use_vllm:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        image_token_id = self.processing_class.image_token_id
        sent = prompt_ids
        if self.vllm_mode == "colocate" and images is not None:
            sent = [collapse_image_runs(ids, image_token_id) for ids in prompt_ids]
            for row, (ids, row_images) in enumerate(zip(sent, images, strict=True)):
                placeholders, expected = ids.count(image_token_id), len(row_images or [])
                if placeholders != expected:
                    # vLLM would attach no features to the extra runs (or fail to place an image) without a word.
                    raise ValueError(
                        f"Rollout {row} holds {placeholders} runs of image tokens but {expected} image(s): its "
                        "context no longer matches its images (repairs.rollout.ban_placeholder_tokens keeps generation "
                        "from sampling the image token)."
                    )
        if self.state.global_step != self._last_loaded_step:
            with profiling_context(self, "sync_weights"):
                self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        returned, completion_ids, logprobs, _ = self.vllm_generation.generate(
            prompts=sent,
            images=images,
            num_generations=num_generations,
            profiler=profiling_context(self, "vLLM.generate"),
        )
        check_expansion(returned, prompt_ids, image_token_id, pixel_budget(self.processing_class))
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]  # the sampled token's logprob


def check_expansion(
    engine_ids: Sequence[Sequence[int]], trainer_ids: Sequence[Sequence[int]], image_token_id: int, budget: PixelBudget
) -> None:
    """Raise unless the engine's prompt ids equal the trainer's (the processor's expansion, the frame the policy's
    boxes and the loss live in), rollout by rollout. Colocate: `engine_ids` are vLLM's own expansion, which resizes
    images with its own processor. Server: TRL's echo of what this process sent after its gather and slice, so only a
    wrong slice (trl#6673) can fail; the server's expansion is checked at start (`utils.checks.check_vllm_server`)."""
    for row, (engine, trainer) in enumerate(zip(engine_ids, trainer_ids, strict=True)):
        if list(engine) == list(trainer):
            continue
        ours, theirs = image_runs(trainer, image_token_id), image_runs(engine, image_token_id)
        if [n for _, n in ours] != [n for _, n in theirs]:
            raise ValueError(
                f"Rollout {row}: vLLM expanded its images to {[n for _, n in theirs]} image tokens, the trainer's "
                f"processor to {[n for _, n in ours]}: the engine resizes images with another pixel budget than the "
                f"recipe's (min_pixels={budget.min_pixels}, max_pixels={budget.max_pixels}). MAPOTrainer hands the "
                "engine that budget (colocate_engine_options); check the checkpoint's processor config and vLLM's "
                "mm_processor_kwargs."
            )
        first = next((i for i, (a, b) in enumerate(zip(engine, trainer)) if a != b), min(len(engine), len(trainer)))
        raise ValueError(
            f"Rollout {row}: vLLM's prompt ids differ from the trainer's from position {first} on ({len(engine)} "
            f"against {len(trainer)} tokens): the engine generated from another context than the loss is computed on "
            "(in server mode: another process's rollout, trl#6673)."
        )


def reset_encoder_cache(vllm_generation) -> None:
    """Drop vLLM's cached image embeddings, which outlive their requests and would serve an image seen again from
    the old weights. Colocate: this process's engine. Server: the dev-mode endpoint `/reset_encoder_cache` (`trl
    vllm-serve` runs in dev mode), from the main process, which alone holds the client."""
    if vllm_generation.mode == "colocate":
        vllm_generation.llm.llm_engine.reset_encoder_cache()
    elif vllm_generation.mode == "server" and vllm_generation.accelerator.is_main_process:
        client = vllm_generation.vllm_client
        response = client.session.post(f"{client.base_url}/reset_encoder_cache")
        if response.status_code != 200:
            raise RuntimeError(
                f"The vLLM server at {client.base_url} refused /reset_encoder_cache ({response.status_code}: "
                f"{response.text[:300]}): it must run in dev mode (VLLM_SERVER_DEV_MODE=1, which `trl vllm-serve` "
                "sets)."
            )


def reset_encoder_cache_after_sync(vllm_generation) -> None:
    """Make every weight sync of this `VLLMGeneration` reset vLLM's encoder cache after it (TRL 1.16 resets only the
    prefix cache). Wrapped on the instance, it covers the sync `VLLMImagePlaceholders` makes and the one TRL's
    `generate` makes to refill a sleeping engine."""
    sync = vllm_generation.sync_weights

    @functools.wraps(sync)
    def sync_weights(*args, **kwargs):
        out = sync(*args, **kwargs)
        reset_encoder_cache(vllm_generation)
        return out

    vllm_generation.sync_weights = sync_weights


@contextmanager
def colocate_engine_options(**options) -> Iterator[None]:
    """Adds `options` (vLLM `LLM` arguments: TRL 1.16 passes no `mm_processor_kwargs`, `dtype` or `enforce_eager`)
    to the one `LLM(...)` call that builds a colocated engine; scoped to the trainer's `__init__`."""
    original = trl_vllm.LLM
    trl_vllm.LLM = functools.partial(original, **options)
    try:
        with loadable_cpu_weights():
            yield
    finally:
        trl_vllm.LLM = original


@contextmanager
def loadable_cpu_weights() -> Iterator[None]:
    """On vLLM's CPU build, keep oneDNN from packing the engine's linear weights away from where TRL's weight sync
    writes them (docs/vllm.md, colocate mode). No effect on GPU builds."""
    from vllm import _custom_ops
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        yield
        return
    saved = _custom_ops._supports_onednn
    _custom_ops._supports_onednn = False
    try:
        yield
    finally:
        _custom_ops._supports_onednn = saved
