"""vLLM rollouts with image-returning tools under TRL 1.16: each image reaches vLLM with exactly one placeholder, and
vLLM's expansion of it is checked against the trainer's.

The bug (trl#6294, open; fixes proposed in trl#6718 for prompt images and trl#6719 for tool images): TRL tokenizes a
VLM prompt with the processor, which expands every image into N `<|image_pad|>` tokens (N from the image's grid),
and `_get_tool_suffix_ids` does the same to every crop a tool returns. In colocate mode `VLLMGeneration.generate`
hands these ids to `LLM.generate` as `prompt_token_ids`, with the raw images as `multi_modal_data`. vLLM then runs
its own multimodal processor on token ids: for the i-th image it replaces the i-th `<|image_pad|>` token it finds
with that image's N_i pads (`apply_token_matches`, vLLM's `multimodal/processing`). On already-expanded ids the
prompt image takes the first pad of its own run and the crop takes the second pad of the *prompt image's* run: the
context grows by N_i - 1 tokens per image and the crop's features land inside the wrong image. Nothing raises;
rollouts are generated from a corrupted context while the trainer scores them on the correct one.

The fix, `VLLMImagePlaceholders._generate_single_turn`: the one method through which every vLLM call passes (the
first turn from `_generate`, every tool turn from `_tool_call_loop`). In colocate mode it cuts every run of image pads
to one token on a copy of the ids it hands to vLLM, so vLLM expands each image exactly once, in order, and it keeps
the prompt ids vLLM returns, which TRL throws away, to check that vLLM's expansion equals the processor's token for
token: vLLM sizes images with its own processor, and a different pixel budget would put every image in another frame
without a word. The trainer keeps the processor-expanded ids for the forward pass, the loss, `tool_mask` and all
length checks, so training is unchanged. Smaller than the proposed upstream fixes, which thread a second,
tokenizer-only id track through `_tokenize_prompts`, `_get_tool_suffix_ids` and `_tool_call_loop`.

Three more things TRL 1.16 leaves out of the colocate engine: the recipe's pixel budget (it builds `LLM(model=...)`
without `mm_processor_kwargs`, so vLLM would resize by the checkpoint's saved processor config), the engine's dtype
(vLLM runs a float32 checkpoint in bf16), and `enforce_eager` (no compile at the engine's start: the tiny CPU
recipe's choice). `colocate_engine_options` adds them to that one call, and on vLLM's CPU build keeps the engine's
weights loadable by TRL's sync (`loadable_cpu_weights`).

After every weight sync, vLLM's encoder cache is reset (`reset_encoder_cache_after_sync`): TRL 1.16 resets only the
prefix cache, and vLLM keeps the vision tower's embeddings of an image after its request ends, so an image seen again
after an optimizer step would be generated from the old weights' embeddings, silently (the vision tower trains).

Server mode keeps the expanded ids on purpose: there TRL computes image features itself (`VLLMClient.image_features`)
and `VLLMGeneration._place_features` places them on the runs of image tokens of the *expanded* ids, one run per image,
which is already right (and needs vLLM >= 0.30 on the server, `utils.checks.MIN_VLLM_MULTIMODAL_SERVER`). The same
check runs there, on something else: with images, `VLLMClient` returns TRL's own echo of the ids it sent (the server
generates from the ids and the features TRL placed; it answers with no prompt ids of its own), so the check catches
a wrong slice of TRL's gather (another process's rollouts, trl#6673), not vLLM's expansion, which in server mode is
the features' and is checked once at start against the processor's (`utils.checks.check_vllm_server`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trl.generation.vllm_generation as trl_vllm
from trl.extras.profiling import profiling_context

from tools.config import PixelBudget
from utils.models import pixel_budget


def image_runs(ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """`(start, length)` of every maximal run of `image_token_id` in `ids`, in order."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == image_token_id:
            start = i
            while i < len(ids) and ids[i] == image_token_id:
                i += 1
            runs.append((start, i - start))
        else:
            i += 1
    return runs


def collapse_image_runs(ids: Sequence[int], image_token_id: int) -> list[int]:
    """`ids` with every run of image tokens cut to a single placeholder token, what vLLM expects with images.

    Runs never merge across images: Qwen-VL templates wrap each image as `<|vision_start|>pads<|vision_end|>`.
    """
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


class VLLMImagePlaceholders:
    """Mixin for a `GRPOTrainer` subclass: in vLLM colocate mode, every image reaches vLLM with one placeholder; in
    both vLLM modes, the prompt ids `VLLMGeneration.generate` returns are checked against the trainer's.

    Overrides `_generate_single_turn` only (see the module docstring for the bug and why this hook). With vLLM it runs
    TRL's vLLM branch of that method itself (sync the weights when the step changed, generate, keep the sampled
    tokens' logprobs), keeping the prompt ids vLLM returns. Colocate: vLLM's own expansion of the images, which must
    be the processor's. Server: the ids this process sent, echoed back by TRL's client (not the server's expansion)
    through TRL's gather and slice, which must be this process's own (trl#6673: unequal counts across processes hand a
    process another's rollouts).
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
    """Raise unless the engine's prompt ids equal the trainer's, rollout by rollout: same images, same token counts,
    same places. The trainer's ids are the processor's expansion, the frame the policy's boxes and the loss live in.

    Colocate: `engine_ids` are vLLM's own expansion of the one-placeholder ids. Server mode with images: TRL's echo of
    what this process sent, after its gather and slice, so only a wrong slice can fail (vLLM's expansion is checked at
    start, `utils.checks.check_vllm_server`)."""
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
    """Drop vLLM's cached encoder outputs (the vision tower's image embeddings), through vLLM's own call.

    vLLM asks for this whenever the weights change (`LLMEngine.reset_encoder_cache`): its encoder cache outlives the
    requests that filled it, so the next request holding an already-seen image (a prompt image of an earlier step, the
    same crop) would reuse embeddings of the old weights. Colocate: the engine of this process (every process of a
    tensor-parallel group resets its own). Server: the dev-mode endpoint `/reset_encoder_cache` (`trl vllm-serve` runs
    the server in dev mode, as TRL's own `/reset_prefix_cache` needs), from the main process, which alone holds the
    client, as TRL's prefix-cache reset does.
    """
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
    """Make every weight sync of TRL's `VLLMGeneration` (this instance) reset vLLM's encoder cache after it.

    TRL 1.16's `sync_weights` pushes the weights and resets only the prefix cache. Wrapping it on the instance covers
    every sync: the one `VLLMImagePlaceholders._generate_single_turn` makes when the step changed, and the one TRL's
    `generate` makes itself to refill an engine put to sleep (`vllm_enable_sleep_mode`).
    """
    sync = vllm_generation.sync_weights

    @functools.wraps(sync)
    def sync_weights(*args, **kwargs):
        out = sync(*args, **kwargs)
        reset_encoder_cache(vllm_generation)
        return out

    vllm_generation.sync_weights = sync_weights


@contextmanager
def colocate_engine_options(**options) -> Iterator[None]:
    """Adds `options` (vLLM `LLM` arguments) to the one `LLM(...)` call TRL 1.16 makes to build a colocated engine.

    TRL builds it with fixed arguments (`VLLMGeneration._init_vllm`): no `mm_processor_kwargs`, no
    `limit_mm_per_prompt`, no `dtype`, no `enforce_eager`. Scoped to the trainer's `__init__`, the only place the engine is built.
    """
    original = trl_vllm.LLM
    trl_vllm.LLM = functools.partial(original, **options)
    try:
        with loadable_cpu_weights():
            yield
    finally:
        trl_vllm.LLM = original


@contextmanager
def loadable_cpu_weights() -> Iterator[None]:
    """On vLLM's CPU build, keep the engine's linear weights where TRL's weight sync writes them.

    After loading, vLLM's CPU backend packs each linear layer's weight into a oneDNN handle and replaces the weight by
    an empty tensor without a `weight_loader` (`dispatch_cpu_unquantized_gemm`), so the `load_weights` TRL calls at
    every sync fails ("'Parameter' object has no attribute 'weight_loader'"). Without oneDNN, vLLM keeps the weights
    and uses `torch.nn.functional.linear`. No effect on GPU builds.
    """
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
