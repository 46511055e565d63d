"""vLLM's side of the rollout, without an engine: the colocate hand-off (one placeholder per image, vLLM's expansion
checked against the processor's), the placeholder ban, the engine options TRL's one `LLM(...)` call gets, and the
version check at start. The real engine runs in tests/test_vllm.py.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import trl.generation.vllm_generation as trl_vllm
from packaging.version import Version
from trl import ModelConfig

from configs import ScriptArguments
from mapo_trainer import MAPOConfig
from repairs.rollout import ban_placeholder_tokens, placeholder_tokens
from repairs.vllm_images import (
    VLLMImagePlaceholders,
    check_expansion,
    collapse_image_runs,
    colocate_engine_options,
    image_runs,
)
from tools import PixelBudget, ToolConfig
from utils import checks
from utils.checks import MIN_VLLM_MULTIMODAL_SERVER, SUPPORTED_VLLM, check_vllm_version
from utils.recipes import parse_args_and_record

REPO = Path(__file__).resolve().parents[1]
PAD = 9
BUDGET = PixelBudget(3136, 1003520, 28)


def test_collapse_image_runs():
    assert collapse_image_runs([1, 9, 9, 9, 2, 9, 3, 9, 9], 9) == [1, 9, 2, 9, 3, 9]
    assert image_runs([9, 9, 1, 9], 9) == [(0, 2), (3, 1)]


class Engine:
    """TRL's `VLLMGeneration` as the hook sees it: records what it is sent, answers with `expand(ids)` as the prompt
    ids it read (what vLLM returns), and one sampled token per rollout."""

    def __init__(self, expand):
        self.expand, self.sent, self.synced = expand, None, 0

    def sync_weights(self):
        self.synced += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        self.sent = prompts
        return [self.expand(ids) for ids in prompts], [[5] for _ in prompts], [[[-0.5]] for _ in prompts], None


def vllm_expansion(lengths):
    """vLLM's expansion of one-placeholder ids: the i-th pad becomes `lengths[i]` pads."""

    def expand(ids):
        out, item = [], 0
        for token in ids:
            out += [PAD] * lengths[item] if token == PAD else [token]
            item += token == PAD
        return out

    return expand


class Base:
    """Stands in for `GRPOTrainer._generate_single_turn` (transformers generation, or server mode)."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        self.base_sent = prompt_ids
        return "base", None


class Probe(VLLMImagePlaceholders, Base):
    def __init__(self, engine=None, use_vllm=True, mode="colocate"):
        self.use_vllm, self.vllm_mode, self.vllm_generation = use_vllm, mode, engine
        self.processing_class = SimpleNamespace(
            image_token_id=PAD,
            image_processor=SimpleNamespace(
                size={"shortest_edge": 3136, "longest_edge": 1003520}, patch_size=14, merge_size=2
            ),
        )
        self.state, self._last_loaded_step = SimpleNamespace(global_step=3), 2
        self.args, self.accelerator = SimpleNamespace(report_to=[]), SimpleNamespace(is_main_process=True)


def test_colocate_sends_one_placeholder_per_image_and_checks_vllms_expansion():
    ids, images = [[1, 9, 9, 2, 9, 9, 9, 3]], [["prompt image", "crop"]]
    engine = Engine(vllm_expansion([2, 3]))
    probe = Probe(engine)
    completions, logprobs = probe._generate_single_turn(ids, images, {}, 1)
    assert engine.sent == [[1, 9, 2, 9, 3]] and ids == [[1, 9, 9, 2, 9, 9, 9, 3]]  # the trainer keeps its own ids
    assert completions == [[5]] and logprobs == [[-0.5]]  # the sampled token's logprob, as TRL keeps it
    assert engine.synced == 1 and probe._last_loaded_step == 3  # a new step: the weights were pushed first
    probe._generate_single_turn(ids, images, {}, 1)
    assert engine.synced == 1  # same step: not again
    other = Probe(use_vllm=False)
    assert other._generate_single_turn(ids, images, {}, 1) == ("base", None) and other.base_sent is ids
    engine = Engine(lambda ids: ids)  # no image in the batch: the ids go as they are, and come back
    Probe(engine)._generate_single_turn(ids, None, {}, 1)
    assert engine.sent is ids


def test_server_mode_sends_expanded_ids_and_wants_its_own_back():
    """TRL's server path places image features on the expanded runs; what comes back through its gather and slice
    must be this process's rollouts (trl#6673 hands back another process's with unequal counts)."""
    ids = [[1, 9, 9, 2], [1, 9, 9, 3]]
    engine = Engine(lambda sent: sent)
    Probe(engine, mode="server")._generate_single_turn(ids, [["a"], ["b"]], {}, 1)
    assert engine.sent is ids
    engine.generate = lambda prompts, images, num_generations, profiler=None: (
        [[1, 9, 9, 7]] * 2,
        [[5]] * 2,
        [[[0.0]]] * 2,
        None,
    )
    with pytest.raises(ValueError, match=r"Rollout 0: .* from position 3 on .*another process's rollout, trl#6673"):
        Probe(engine, mode="server")._generate_single_turn(ids, [["a"], ["b"]], {}, 1)


def test_colocate_fails_when_vllm_expands_an_image_otherwise():
    """vLLM sized the crop to 4 tokens where the processor gave it 3: another pixel budget, named in the error."""
    probe = Probe(Engine(vllm_expansion([2, 4])))
    with pytest.raises(
        ValueError,
        match=r"Rollout 0: vLLM expanded its images to \[2, 4\] image tokens, the trainer's processor to \[2, 3\].*max_pixels=1003520",
    ):
        probe._generate_single_turn([[1, 9, 9, 2, 9, 9, 9, 3]], [["prompt image", "crop"]], {}, 1)


def test_check_expansion_names_the_first_differing_position():
    check_expansion([[1, 9, 9, 2]], [[1, 9, 9, 2]], PAD, BUDGET)
    with pytest.raises(ValueError, match="Rollout 1: vLLM's prompt ids differ from the trainer's from position 2 on"):
        check_expansion([[1, 9, 2], [1, 9, 7, 2]], [[1, 9, 2], [1, 9, 8, 2]], PAD, BUDGET)
    with pytest.raises(
        ValueError, match=r"Rollout 0: vLLM expanded its images to \[3\].*\[2\]"
    ):  # stock TRL: re-expanded
        check_expansion([[1, 9, 9, 9, 2]], [[1, 9, 9, 2]], PAD, BUDGET)


def test_a_sampled_image_token_is_refused_before_vllm_sees_it():
    engine = Engine(vllm_expansion([1, 1]))
    with pytest.raises(ValueError, match=r"Rollout 1 holds 2 runs of image tokens but 1 image\(s\)"):
        Probe(engine)._generate_single_turn([[9, 9, 1], [9, 9, 2, 9]], [["a"], ["b"]], {}, 1)
    assert engine.sent is None


def test_the_colocate_engine_gets_the_options_only_while_the_trainer_builds_it(monkeypatch):
    built = []
    monkeypatch.setattr(trl_vllm, "LLM", lambda **kwargs: built.append(kwargs), raising=False)
    original = trl_vllm.LLM
    with colocate_engine_options(mm_processor_kwargs={"max_pixels": 6272}, dtype="float32"):
        trl_vllm.LLM(model="m", seed=0)  # as VLLMGeneration._init_vllm calls it
    assert built == [{"model": "m", "seed": 0, "mm_processor_kwargs": {"max_pixels": 6272}, "dtype": "float32"}]
    assert trl_vllm.LLM is original


def test_placeholders_are_banned_in_both_backends(tiny_processor):
    assert placeholder_tokens(tiny_processor) == ["<|image_pad|>", "<|video_pad|>"]
    ids = tiny_processor.tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    trainer = SimpleNamespace(
        use_vllm=False,
        processing_class=tiny_processor,
        generation_config=SimpleNamespace(suppress_tokens=[ids[0]]),  # TRL's: the image token only
        generation_kwargs={"suppress_tokens": [ids[0]]},
    )
    ban_placeholder_tokens(trainer)
    assert trainer.generation_config.suppress_tokens == ids == trainer.generation_kwargs["suppress_tokens"]
    trainer = SimpleNamespace(
        use_vllm=True,
        processing_class=tiny_processor,
        vllm_generation=SimpleNamespace(generation_kwargs={"bad_words": ["x"]}),
    )
    ban_placeholder_tokens(trainer)
    assert trainer.vllm_generation.generation_kwargs == {"bad_words": ["x", "<|image_pad|>", "<|video_pad|>"]}


# ------------------------------------------------------------------------------------------ vLLM version at start
def versions(installed: str | None):
    def version(name):
        assert name == "vllm"
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    return version


@pytest.mark.parametrize("installed", [None, "0.21.1", "0.32.0", "not-a-version"])
def test_use_vllm_with_an_unsupported_vllm_fails_naming_the_field_and_range(installed):
    with pytest.raises(ValueError, match=r"use_vllm=True needs vLLM 0\.22\.0 to 0\.31\.0") as caught:
        check_vllm_version(True, versions(installed))
    assert ("not installed" if installed is None else installed) in str(caught.value)


@pytest.mark.parametrize("installed", [SUPPORTED_VLLM[0], "0.31.0+cu129", SUPPORTED_VLLM[1]])
def test_supported_vllm_or_no_vllm_use_passes(installed):
    check_vllm_version(True, versions(installed))
    check_vllm_version(False, versions(None))


def test_mapo_config_checks_vllm_at_start(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "installed_version", versions(None))
    with pytest.raises(ValueError, match="use_vllm"):
        MAPOConfig(output_dir=str(tmp_path), use_vllm=True, use_cpu=True, bf16=False)


SERVER_RECIPE = str(REPO / "recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_vllm_server.yaml")


def test_server_recipe_parses_and_needs_a_supported_vllm(monkeypatch):
    """The server-mode recipe fails at parse time where vLLM is missing, and parses to server mode with vLLM 0.31."""
    types = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
    argv = ["--config", SERVER_RECIPE, "--bf16", "false"]  # bf16 cannot be instantiated on a CPU-only machine
    monkeypatch.setattr(checks, "installed_version", versions(None))
    with pytest.raises(ValueError, match="use_vllm=True needs vLLM 0.22.0 to 0.31.0"):
        parse_args_and_record(types, argv)
    monkeypatch.setattr(checks, "installed_version", versions("0.31.0"))
    _, config, _, tool = parse_args_and_record(types, argv)
    assert (config.use_vllm, config.vllm_mode, config.vllm_importance_sampling_correction) == (True, "server", True)
    assert tool.max_pixels == 1003520  # the server's --mm-processor-kwargs must repeat it (docs/vllm.md)


def test_the_gpu_extras_pin_a_vllm_trl_supports_with_multimodal_server_mode():
    pins = dict(
        line.split("#")[0].strip().split("==")
        for line in (REPO / "requirements-gpu.txt").read_text().splitlines()
        if "==" in line.split("#")[0]
    )
    low, high = (Version(v) for v in SUPPORTED_VLLM)
    assert low <= Version(pins["vllm"]) <= high and Version(pins["vllm"]) >= Version(MIN_VLLM_MULTIMODAL_SERVER)
