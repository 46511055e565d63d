"""Rewards a recipe picks by name (`reward_funcs: [gated_outcome]`), and the CLIP verifier that scores z_t.

Outcome and format rewards follow TRL's signature `(completions, **kwargs) -> list[float | None]` and are registered
in `REWARDS`; `None` marks a row its reward could not score (TRL and `MAPOTrainer` then give it advantage 0). The
semantic reward R_sem is not one of them: `MAPOTrainer` computes it from `ClipVerifier`'s scores of the calls each
rollout made (`mapo.semantic_reward`, eq. 2). Evaluation scores with the same verifier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from PIL import Image

from data.task import extract_answer, final_text, is_correct, is_well_formed_turn
from tools import ToolConfig, executed_calls
from utils.models import load_clip


# ------------------------------------------------------------------------------------------------ outcome and format
def outcome_reward(completions: list, answer: list[str], options: list[Sequence[str]] | None = None, **kwargs):
    """R_out: 1.0 when the final `<answer>` (fallback `\\boxed{}`) is correct, else 0.0. See `is_correct`."""
    options = options if options is not None else [()] * len(completions)
    return [float(is_correct(extract_answer(final_text(c)), a, o)) for c, a, o in zip(completions, answer, options)]


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 when every assistant turn is `<think>...</think>` followed by a tool call (intermediate turns) or by one
    `<answer>...</answer>` (the last turn), else 0.0."""
    scores = []
    for completion in completions:
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        turns = [m for m in completion if m.get("role") == "assistant"]
        ok = bool(turns) and all(is_well_formed_turn(m, i == len(turns) - 1) for i, m in enumerate(turns))
        scores.append(float(ok))
    return scores


def gated_outcome_reward(completions: list, answer: list[str], options: list[Sequence[str]] | None = None, **kwargs):
    """Binary R_out with format as a gate: 1.0 when the answer is correct *and* every turn is well formed
    (`format_reward`), else 0.0. MAPO pairs R_sem with a binary outcome reward (section 3.3); gating keeps it binary
    while still refusing credit to a right answer in a broken format."""
    correct = outcome_reward(completions, answer, options)
    return [c * f for c, f in zip(correct, format_reward(completions))]


def tool_bonus_reward(
    completions: list, answer: list[str], environments: list, options: list[Sequence[str]] | None = None, **kwargs
):
    """DeepEyes' tool bonus: 1.0 when the answer is correct and at least one zoom-in call of the trained completion
    returned a crop (DeepEyes counts returned images; a call that only errored earns nothing), else 0.0."""
    correct = outcome_reward(completions, answer, options)
    used = [any(call.ok for call in executed_calls(env, c)) for env, c in zip(environments, completions)]
    return [c * float(u) for c, u in zip(correct, used)]


REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "outcome": outcome_reward,
    "format": format_reward,
    "gated_outcome": gated_outcome_reward,
    "tool_bonus": tool_bonus_reward,
}


def get_reward_funcs(names: Sequence[str]) -> list[Callable]:
    """Reward functions by registry name; an unknown name fails with the list of known ones."""
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ValueError(f"reward_funcs: unknown reward(s) {unknown}; known: {sorted(REWARDS)}")
    return [REWARDS[name] for name in names]


# --------------------------------------------------------------------------------------------------- verifier
class ClipVerifier:
    """Frozen open_clip model scoring (label, crop) pairs: z_t = cosine of the L2-normalised embeddings.

    It lives beside the policy, not inside it: never wrapped by DeepSpeed/accelerate, no gradients, eval mode,
    half precision on GPU. `similarity` scores a whole generation batch in one call. Built from a `ToolConfig`, so
    training and evaluation score with the same model and the same preprocessing: by default each crop is letterboxed
    to CLIP's square input (`clip_resize: pad`), since open_clip's default centre crop would score only the middle
    square of an elongated crop.
    """

    def __init__(self, config: ToolConfig, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        # Building the model draws its random init from the global RNG; fork it so adding the verifier does not
        # change the policy's sampling (MAPO with beta = 0 must reproduce GRPO on the same seed).
        with torch.random.fork_rng(devices=[]):
            self.model, self.preprocess, self.tokenizer = load_clip(
                config.clip_model, config.clip_pretrained, resize=config.clip_resize
            )
        self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)

    @torch.no_grad()
    def similarity(self, labels: Sequence[str], images: Sequence[Image.Image]) -> torch.Tensor:
        """Cosine similarity of each label with its image, shape (N,), float32 on CPU."""
        if not labels:
            return torch.zeros(0)
        pixels = torch.stack([self.preprocess(image) for image in images]).to(self.device, self.dtype)
        tokens = self.tokenizer(list(labels)).to(self.device)
        image_emb = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
        text_emb = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return (image_emb * text_emb).sum(dim=-1).cpu()
