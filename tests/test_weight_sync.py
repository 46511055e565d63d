"""vLLM's encoder cache is reset after every weight sync, colocate and server, without an engine.

TRL 1.16 resets only vLLM's prefix cache after pushing new weights; vLLM keeps the vision tower's embeddings of an
image beyond its request, so an image seen again after an optimizer step would be generated from the old weights'
embeddings. `MAPOTrainer` wraps TRL's `sync_weights` (`repairs.vllm_images.reset_encoder_cache_after_sync`). The real
engine runs in tests/test_vllm.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from trl import GRPOTrainer

import mapo_trainer
from mapo_trainer import MAPOTrainer
from repairs.vllm_images import reset_encoder_cache_after_sync


class Response:
    status_code, text = 200, ""


class Generation:
    """TRL's `VLLMGeneration` as the wrap sees it: `sync_weights`, `mode`, `accelerator`, and either the colocated
    `llm` (its `llm_engine`) or the server's `vllm_client` (its `session` and `base_url`). Records every call."""

    def __init__(self, mode: str, main: bool = True):
        self.mode, self.calls = mode, []
        self.accelerator = SimpleNamespace(is_main_process=main)
        self.generation_kwargs = {}
        engine = SimpleNamespace(reset_encoder_cache=lambda: self.calls.append("engine.reset_encoder_cache"))
        self.llm = SimpleNamespace(llm_engine=engine)
        session = SimpleNamespace(post=lambda url, **kw: self.calls.append(f"POST {url}") or Response())
        self.vllm_client = SimpleNamespace(session=session, base_url="http://vllm:8000")

    def sync_weights(self):
        self.calls.append("sync_weights")


def test_colocate_resets_the_engines_encoder_cache_after_each_sync():
    generation = Generation("colocate")
    reset_encoder_cache_after_sync(generation)
    generation.sync_weights()
    generation.sync_weights()
    assert generation.calls == ["sync_weights", "engine.reset_encoder_cache"] * 2


def test_server_mode_posts_the_reset_from_the_main_process_only():
    generation = Generation("server")
    reset_encoder_cache_after_sync(generation)
    generation.sync_weights()
    assert generation.calls == ["sync_weights", "POST http://vllm:8000/reset_encoder_cache"]
    other = Generation("server", main=False)  # holds no client in TRL; takes part in the gather only
    reset_encoder_cache_after_sync(other)
    other.sync_weights()
    assert other.calls == ["sync_weights"]


def test_a_server_that_refuses_the_reset_fails_naming_dev_mode():
    generation = Generation("server")
    refused = SimpleNamespace(status_code=404, text="Not Found")
    generation.vllm_client.session.post = lambda url, **kw: refused
    reset_encoder_cache_after_sync(generation)
    with pytest.raises(RuntimeError, match=r"refused /reset_encoder_cache \(404.*VLLM_SERVER_DEV_MODE=1"):
        generation.sync_weights()


class Stop(Exception):
    pass


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_the_trainer_wraps_the_sync_it_is_built_with(monkeypatch, mode):
    """`MAPOTrainer.__init__` wraps the `VLLMGeneration` TRL built, so the sync its generation hook makes resets the
    cache. TRL's `__init__` is replaced by the attributes the rest of `MAPOTrainer.__init__` reads, and the run stops
    at the step after the wrap (the server check, or the tool config record)."""
    generation = Generation(mode)

    def trl_init(self, *args, processing_class, **kwargs):
        self.use_vllm, self.vllm_mode, self.vllm_generation = True, mode, generation
        self.processing_class, self.model = processing_class, SimpleNamespace(name_or_path="policy")
        self._tokenizer = SimpleNamespace(parse_response=lambda ids: {})  # guarded by `repairs.response_parser`
        self.accelerator = SimpleNamespace(is_main_process=True)
        self.args = SimpleNamespace(max_completion_length=64, max_tool_calling_iterations=1)

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(GRPOTrainer, "__init__", trl_init)
    monkeypatch.setattr(mapo_trainer, "check_vllm_server", stop)
    monkeypatch.setattr(MAPOTrainer, "add_callback", stop)
    processor = SimpleNamespace(
        image_token="<|image_pad|>",
        video_token="<|video_pad|>",
        image_processor=SimpleNamespace(
            size={"shortest_edge": 3136, "longest_edge": 1003520}, patch_size=14, merge_size=2
        ),
    )
    with pytest.raises(Stop):
        MAPOTrainer(model=None, processing_class=processor)
    generation.sync_weights()
    reset = "engine.reset_encoder_cache" if mode == "colocate" else "POST http://vllm:8000/reset_encoder_cache"
    assert generation.calls == ["sync_weights", reset]
