"""vLLM rollouts with image-returning tools under TRL 1.16: each image reaches vLLM with exactly one placeholder.

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
first turn from `_generate`, every tool turn from `_tool_call_loop`), and the one that throws away the prompt ids
vLLM returns. In colocate mode it cuts every run of image pads to one token on a copy of the ids it hands down, so
vLLM expands each image exactly once, in order. The trainer keeps the processor-expanded ids for the forward pass,
the loss, `tool_mask` and all length checks, so training is unchanged. Smaller than the proposed upstream fixes,
which thread a second, tokenizer-only id track through `_tokenize_prompts`, `_get_tool_suffix_ids` and
`_tool_call_loop`.

Server mode is left alone on purpose: there TRL computes image features itself (`VLLMClient.image_features`) and
`VLLMGeneration._place_features` places them on the runs of image tokens of the *expanded* ids, one run per image,
which is already right (and needs vLLM >= 0.30 on the server, `utils.checks.MIN_VLLM_MULTIMODAL_SERVER`).
"""

from __future__ import annotations

from collections.abc import Sequence


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
    """Mixin for a `GRPOTrainer` subclass: in vLLM colocate mode, every image reaches vLLM with one placeholder.

    Overrides `_generate_single_turn` only (see the module docstring for the bug and why this hook).
    """

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.use_vllm and self.vllm_mode == "colocate" and images is not None:
            image_token_id = self.processing_class.image_token_id
            collapsed = [collapse_image_runs(ids, image_token_id) for ids in prompt_ids]
            for row, (ids, row_images) in enumerate(zip(collapsed, images, strict=True)):
                placeholders, expected = ids.count(image_token_id), len(row_images or [])
                if placeholders != expected:
                    # vLLM would attach no features to the extra runs (or fail to place an image) without a word.
                    raise ValueError(
                        f"Rollout {row} holds {placeholders} runs of image tokens but {expected} image(s): the policy "
                        "probably sampled an image token (vLLM does not suppress it, unlike TRL's transformers "
                        "generation), so its context no longer matches its images."
                    )
            prompt_ids = collapsed
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
