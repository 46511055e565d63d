"""The verifiers that score z_t, the match of a zoom-in call's label with its crop (`semantic_verifier`): built by a
factory `(tool_config, device, seed) -> verifier`, scoring valid calls with `score(calls, scenes) -> torch.Tensor` (one
z_t per call, before `mapo.scale_similarity`). The paper's is CLIP (`ClipVerifier`, evaluation's too); a recipe may
name another by import path (`utils.registry`), as `research/` does for its ground-truth controls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from PIL import Image

from tools import ToolConfig, VerifierConfig, ZoomCall
from utils.models import load_clip
from utils.registry import resolve


class ClipVerifier:
    """Frozen open_clip model scoring (label, crop) pairs: z_t = cosine of the L2-normalised embeddings.

    Beside the policy, not inside it: never wrapped by DeepSpeed/accelerate, no gradients, half precision on GPU.
    Built from a `VerifierConfig` (a `ToolConfig` is one), so training and evaluation score with the same model and
    preprocessing (`clip_resize`).
    """

    def __init__(self, config: VerifierConfig, device: torch.device | str = "cpu"):
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

    def score(self, calls: Sequence[ZoomCall], scenes: Sequence[Scene]) -> torch.Tensor:
        """z_t's raw cosine for valid `calls` (label against crop); the scenes are not read."""
        return self.similarity([call.label for call in calls], [call.crop for call in calls])


@dataclass(frozen=True)
class Scene:
    """What a verifier may know of a call's rollout besides the call: the whole image and, where the data has them,
    the target's box (original pixels) and label: the ground truth the controls score from."""

    image: Image.Image
    target_bbox: Sequence[int] | None = None
    target_label: str | None = None

    def whole_image_call(self, call: ZoomCall) -> ZoomCall:
        """`call` as if it had zoomed on the whole image: what `semantic_score: contrastive` subtracts."""
        return replace(call, crop=self.image, box=(0, 0, *self.image.size))


VerifierFactory = Callable[[ToolConfig, torch.device | str, int], object]

# A verifier by the name a recipe gives (`semantic_verifier`): each built from the tool settings, a device and a seed.
VERIFIERS: dict[str, VerifierFactory] = {
    "clip": lambda config, device, seed: ClipVerifier(config, device=device),
}


def verifier_factory(spec: str) -> VerifierFactory:
    """The factory `spec` names: a name in `VERIFIERS` or an import path `package.module:name`."""
    return resolve(spec, VERIFIERS, "semantic_verifier")


def build_verifier(spec: str, config: ToolConfig, device: torch.device | str = "cpu", seed: int = 0):
    """The verifier `spec` names (`verifier_factory`), built; a bad name fails with what is wrong."""
    return verifier_factory(spec)(config, device, seed)
