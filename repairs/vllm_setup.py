"""`VLLMSetup`: what `MAPOTrainer` needs around TRL's vLLM engine or server, idle under transformers generation: a
colocated engine built with the recipe's pixel budget and `vllm_dtype` (`repairs.vllm_images`), vLLM's encoder cache
reset after every weight sync, and a server that cannot be reached failing with the fields to change (one that
serves another model or pixel budget: `utils.checks.check_vllm_server`, from `MAPOTrainer.__init__`)."""

from __future__ import annotations

from contextlib import nullcontext

import requests

from repairs.vllm_images import colocate_engine_options, reset_encoder_cache_after_sync
from utils.models import pixel_budget


class VLLMSetup:
    """Mixin for a `GRPOTrainer` subclass; overrides `__init__` only."""

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args")
        engine = nullcontext()
        if config is not None and config.use_vllm and config.vllm_mode == "colocate":
            # vLLM resizes images itself: with the recipe's budget, not the checkpoint's saved one.
            budget = pixel_budget(kwargs["processing_class"])
            engine = colocate_engine_options(
                mm_processor_kwargs={"min_pixels": budget.min_pixels, "max_pixels": budget.max_pixels},
                dtype=config.vllm_dtype,
                enforce_eager=config.vllm_enforce_eager,
            )
        try:
            with engine:
                super().__init__(*args, **kwargs)
        except (ConnectionError, requests.ConnectionError) as err:  # TRL's client gave up waiting for the server
            if config is None:
                raise
            raise ConnectionError(
                f"{err} Check vllm_server_host={config.vllm_server_host}, vllm_server_port={config.vllm_server_port} "
                f"(or vllm_server_base_url), and vllm_server_timeout={config.vllm_server_timeout} s, which must cover "
                "the server's start."
            ) from err
        if self.use_vllm:  # TRL resets only the prefix cache: image embeddings of old weights would be reused
            reset_encoder_cache_after_sync(self.vllm_generation)
