"""vLLM colocate rollouts with tool crops (trl#6294), on CPU: the vLLM engine is replaced by a stand-in.

vLLM cannot be installed here (GPU extra), so `StandInLLM` takes the place of `vllm.LLM` *under TRL's own
`VLLMGeneration`*: TRL's real colocate code builds the requests (`prompt_token_ids` + `multi_modal_data`), syncs the
weights and reads the outputs; only the engine is replaced. The stand-in enforces the contract vLLM's multimodal
processor relies on for token-id prompts, and expands the placeholders exactly as vLLM does (the i-th
`<|image_pad|>` token becomes image i's N_i pads, N_i from the image processor's grid), then answers with scripted
turns: a zoom-in call, then an answer once a tool response is in the context.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import trl.generation.vllm_generation as trl_vllm
from packaging.version import Version
from PIL import Image
from trl import GRPOTrainer, ModelConfig
from trl.generation.vllm_generation import VLLMGeneration

from configs import ScriptArguments
from data.synthetic import build_synthetic
from mapo_trainer import MAPOConfig, MAPOTrainer
from tiny.scripted import DEFAULT_LABELS, answer_turn, tiny_trainer, tool_call_turn
from tools import ToolConfig
from utils import checks
from utils.checks import MIN_VLLM_MULTIMODAL_SERVER, SUPPORTED_VLLM, check_vllm_version
from utils.recipes import parse_args_and_record
from utils.vllm_images import VLLMImagePlaceholders, collapse_image_runs, image_runs

IMAGE_PAD = "<|image_pad|>"
REPO = Path(__file__).resolve().parents[1]
WIDE_BOX = (0, 0, 100, 20)  # a wide crop: fewer image tokens than the prompt image, so a swap changes the ids


class VLLMContractError(AssertionError):
    """A request real vLLM would silently mis-process."""


@dataclass
class Call:
    """One `LLM.generate` request as the stand-in saw it."""

    prompt_ids: list[int]  # as sent (placeholders)
    images: list[Image.Image]
    expanded_ids: list[int]  # after vLLM's expansion: what the engine's model would see
    text: str  # decoded request


@dataclass
class StandInLLM:
    """Stands in for `vllm.LLM` in colocate mode: the attributes TRL touches, and `generate` with vLLM's contract."""

    processor: object
    max_model_len: int
    calls: list[Call] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)

    def __post_init__(self):
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.extend(name for name, _ in weights))
        runner = SimpleNamespace(model_runner=SimpleNamespace(model=model))
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=self.max_model_len),
            model_executor=SimpleNamespace(driver_worker=runner),
        )
        self.pad = self.processor.image_token_id
        self.tokenizer = self.processor.tokenizer

    def reset_prefix_cache(self):
        pass

    def image_tokens(self, image: Image.Image) -> int:
        """N: how many pads vLLM's Qwen2-VL processor gives this image (grid / merge_size^2, as the HF processor)."""
        grid = self.processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
        return int(grid.prod()) // self.processor.image_processor.merge_size**2

    def expand(self, ids: list[int], images: list[Image.Image]) -> list[int]:
        """vLLM's `apply_token_matches` for Qwen2-VL: the i-th pad token, in order, becomes image i's N_i pads."""
        out, item = [], 0
        for token in ids:
            if token == self.pad and item < len(images):
                out += [self.pad] * self.image_tokens(images[item])
                item += 1
            else:
                out.append(token)
        return out

    def check(self, row: int, ids: list[int], images: list[Image.Image]) -> None:
        runs = image_runs(ids, self.pad)
        long = [length for _, length in runs if length > 1]
        if long:
            expanded = self.expand(ids, images)
            misplaced = ", and image 1 inside image 0's run" if len(images) > 1 else ""
            raise VLLMContractError(
                f"request {row}: image placeholders already expanded (runs of {long} {IMAGE_PAD} for {len(images)} "
                f"image(s)). vLLM expands the first {len(images)} pad token(s) again, in order: the context would "
                f"hold {expanded.count(self.pad)} image tokens instead of {ids.count(self.pad)}{misplaced}."
            )
        if len(runs) != len(images):
            raise VLLMContractError(f"request {row}: {len(runs)} image placeholders for {len(images)} images")

    def generate(self, prompts, sampling_params, use_tqdm=False):
        assert sampling_params.kwargs["n"] == 1  # colocate: TRL duplicates prompts itself
        outputs = []
        for row, request in enumerate(prompts):
            ids = list(request["prompt_token_ids"])
            images = request.get("multi_modal_data", {}).get("image", [])
            images = images if isinstance(images, list) else [images]  # TRL sends a lone image unwrapped
            self.check(row, ids, images)
            text = self.tokenizer.decode(ids)
            expanded = self.expand(ids, images)
            self.calls.append(Call(ids, images, expanded, text))
            reply = (
                tool_call_turn(DEFAULT_LABELS[row % 2], WIDE_BOX)
                if "<tool_response>" not in text
                else answer_turn(row)
            )
            tokens = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            logprobs = [{t: SimpleNamespace(logprob=-1.0, rank=1)} for t in tokens]
            completion = SimpleNamespace(token_ids=tokens, logprobs=logprobs)
            outputs.append(SimpleNamespace(prompt_token_ids=expanded, outputs=[completion]))
        return outputs


class StandInSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture(scope="module")
def dataset():
    return build_synthetic(4, seed=0, split="train")


def colocate(trainer, monkeypatch) -> StandInLLM:
    """Switch a trainer built without vLLM to TRL's colocate backend with the stand-in engine; returns the engine.

    `GRPOTrainer.__init__` would build `vllm.LLM`; everything after it reads only `use_vllm`, `vllm_mode`,
    `vllm_generation` and `_last_loaded_step`, which are set here as `__init__` sets them.
    """
    engine = StandInLLM(trainer.processing_class, trainer.model.config.get_text_config().max_position_embeddings)
    monkeypatch.setattr(trl_vllm, "SamplingParams", StandInSamplingParams, raising=False)  # vllm's, not importable
    monkeypatch.setattr(VLLMGeneration, "_init_vllm", lambda self: setattr(self, "llm", engine))
    args = trainer.args
    trainer.vllm_generation = VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=trainer.processing_class,
        mode="colocate",
        temperature=args.temperature,
        max_completion_length=args.max_completion_length,
        logprobs=0,
        generation_kwargs=args.generation_kwargs,
    )
    trainer.use_vllm, trainer.vllm_mode, trainer._last_loaded_step = True, "colocate", -1
    return engine


def capture_rollouts(trainer) -> list[tuple]:
    """Record `_generate`'s output (processor-expanded prompt ids and completion ids: what the trainer trains on)."""
    seen = []
    generate = trainer._generate

    def spy(prompts):
        out = generate(prompts)
        seen.append(out)
        return out

    trainer._generate = spy
    return seen


def test_collapse_image_runs():
    assert collapse_image_runs([1, 9, 9, 9, 2, 9, 3, 9, 9], 9) == [1, 9, 2, 9, 3, 9]
    assert image_runs([9, 9, 1, 9], 9) == [(0, 2), (3, 1)]


class Recorder:
    """Stands in for `GRPOTrainer._generate_single_turn`: records the ids it is handed."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        self.sent = prompt_ids
        return prompt_ids


class Probe(VLLMImagePlaceholders, Recorder):
    def __init__(self, use_vllm=True, mode="colocate"):
        self.use_vllm, self.vllm_mode, self.processing_class = use_vllm, mode, SimpleNamespace(image_token_id=9)


def test_only_colocate_vllm_gets_one_placeholder_per_image():
    ids, images = [[1, 9, 9, 2, 9, 9, 9, 3]], [["prompt image", "crop"]]
    probe = Probe()
    probe._generate_single_turn(ids, images, {}, 1)
    assert probe.sent == [[1, 9, 2, 9, 3]] and ids == [[1, 9, 9, 2, 9, 9, 9, 3]]  # the trainer keeps its own ids
    for probe in (Probe(mode="server"), Probe(use_vllm=False)):  # server mode places features on expanded runs
        probe._generate_single_turn(ids, images, {}, 1)
        assert probe.sent is ids
    probe = Probe()
    probe._generate_single_turn(ids, None, {}, 1)  # no image in the batch
    assert probe.sent is ids


def test_a_sampled_image_token_is_refused_before_vllm_sees_it():
    with pytest.raises(ValueError, match=r"Rollout 1 holds 2 runs of image tokens but 1 image\(s\)"):
        Probe()._generate_single_turn([[9, 9, 1], [9, 9, 2, 9]], [["a"], ["b"]], {}, 1)


def test_two_turn_rollout_with_a_crop_meets_vllms_contract(tiny_kit, dataset, tmp_path, monkeypatch):
    trainer = tiny_trainer(MAPOTrainer, tiny_kit, dataset, tmp_path, max_steps=1)
    engine = colocate(trainer, monkeypatch)
    rollouts = capture_rollouts(trainer)
    trainer.train()

    assert engine.loaded  # TRL pushed the policy's weights to the engine before generating
    first, second = engine.calls[:4], engine.calls[4:]
    assert len(first) == len(second) == 4  # batch 4: a zoom-in turn each, then an answer after the crop
    for call in first:
        assert len(call.images) == 1 and call.text.count(f"<|vision_start|>{IMAGE_PAD}<|vision_end|>") == 1
    for call in second:
        assert len(call.images) == 2  # the prompt image, then the crop, each behind one placeholder
        assert call.text.count(f"<|vision_start|>{IMAGE_PAD}<|vision_end|>") == 2 and "<tool_response>" in call.text
        assert call.images[1].size != call.images[0].size  # a crop, not the prompt image again

    # Order: vLLM's expansion of each request must be exactly the context the trainer trains on (the processor's
    # expansion), so image i's features sit on the i-th image's tokens. Prompt image and crop expand to different N,
    # so a swapped or misplaced image would change the sequence.
    prompt_ids, completion_ids = rollouts[0][0], rollouts[0][1]
    trained = [p + c for p, c in zip(prompt_ids, completion_ids)]
    assert all(engine.image_tokens(call.images[0]) != engine.image_tokens(call.images[1]) for call in second)
    for row, call in enumerate(first):
        assert call.expanded_ids == prompt_ids[row]
    for row, call in enumerate(second):
        assert trained[row][: len(call.expanded_ids)] == call.expanded_ids

    # The rollout the trainer scored is the scripted one: a call with a real crop, then the answer.
    completions = rollouts[0][3]
    assert all([m["role"] for m in c] == ["assistant", "tool", "assistant"] for c in completions)
    assert all("<answer>A</answer>" in trainer.processing_class.decode(ids) for ids in completion_ids)
    logged = [entry for entry in trainer.state.log_history if "tools/zoom_calls_per_rollout" in entry]
    assert logged and logged[0]["tools/zoom_calls_per_rollout"] == 1.0


def test_stock_trl_sends_expanded_images_to_vllm(tiny_kit, dataset, tmp_path, monkeypatch):
    """Unpatched TRL 1.16 (`GRPOTrainer`) fails the contract on the first request: the processor already expanded
    the prompt image, and vLLM would expand it a second time (trl#6294)."""
    trainer = tiny_trainer(GRPOTrainer, tiny_kit, dataset, tmp_path, max_steps=1)
    colocate(trainer, monkeypatch)
    with pytest.raises(VLLMContractError, match="already expanded"):
        trainer.train()


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
