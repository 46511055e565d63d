"""Start-up checks every run gets: no silent no-learning in half precision, resuming only when asked, and a rollout
token budget whose worst case is checked against the lengths."""

import logging
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from fake_checkpoint import write_checkpoint
from peft import LoraConfig, get_peft_model
from transformers import Qwen2VLImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
from trl import ModelConfig
from trl.trainer.utils import RepeatSampler

import evaluate
import rl
import sft
from configs import ScriptArguments, SFTConfig, TrajectoryArguments
from data import load_split
from mapo_trainer import MAPOConfig
from repairs.resume import EpochSeededRepeatSampler, resume_checkpoint
from repairs.token_budget import check_token_budget, token_budget
from tools import ToolConfig
from utils import policy
from utils.checks import (
    check_accelerate_config,
    check_master_weights,
    check_planned_master_weights,
    check_report_to,
    check_vllm_server,
    check_wandb_login,
    planned_distributed_type,
)
from utils.lora import check_lora_targets, normalise_target_modules
from utils.models import load_model, load_processor
from utils.policy import policy_peft_config
from utils.recipes import parse_args_and_record
from utils.trainable import frozen_prefixes, only_trained_inputs_require_grads

RL_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
NOT_DISTRIBUTED = SimpleNamespace(deepspeed=None, fsdp="", report_to=[])  # the training arguments `load_policy` reads


# ------------------------------------------------------------------------------------------- master weights (bf16)
def test_bfloat16_rounds_a_small_update_away():
    """Why the check exists: a 1e-6 step on a weight of 0.02 does not change its bfloat16 value."""
    weight = torch.tensor(0.02, dtype=torch.bfloat16)
    assert weight - 1e-6 == weight
    assert torch.tensor(0.02) - 1e-6 != torch.tensor(0.02)


@pytest.fixture
def bf16_model(tiny_kit):
    return load_model(tiny_kit["policy"], dtype=torch.bfloat16)


def test_half_precision_weights_without_master_copy_fail_with_the_fields_to_change(bf16_model):
    for distributed in (DistributedType.NO, DistributedType.MULTI_GPU):  # single_gpu and ddp
        with pytest.raises(ValueError, match="bfloat16") as err:
            check_master_weights(bf16_model.named_parameters(), distributed)
        for fix in ("dtype: float32", "bf16: true", "zero2", "use_peft: true"):
            assert fix in str(err.value)


# The rule's other half, that ZeRO and FSDP mixed precision keep fp32 master weights for bf16-stored ones, is
# DeepSpeed's and accelerate's behaviour, not this repo's: checking it needs a real ZeRO/FSDP-wrapped optimizer, which
# this CPU-only suite does not build (DeepSpeed needs a GPU here). The test that only called the early return for
# those distributed types checked nothing, and is gone.


def test_lora_adapters_train_in_fp32_over_a_frozen_bf16_base(bf16_model):
    lora = get_peft_model(bf16_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainable = [p for p in lora.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)  # PEFT upcasts the adapters
    check_master_weights(lora.named_parameters(), DistributedType.NO)


def test_the_recipe_alone_says_whether_weights_lack_a_master_copy(tiny_kit):
    """The same rule before any weight loads: from `dtype` (`auto`: the checkpoint config's), `use_peft` and the
    distributed type accelerate will have."""
    config = SimpleNamespace(dtype=torch.bfloat16)  # what `auto` loads a bf16 checkpoint in
    bf16 = ModelConfig(model_name_or_path="m", dtype="bfloat16")
    for model_args, cfg in ((bf16, None), (ModelConfig(model_name_or_path="m", dtype="auto"), config)):
        with pytest.raises(ValueError, match=r"stores the trainable weights of m in bfloat16.*dtype: float32"):
            check_planned_master_weights(model_args, cfg, DistributedType.NO)
    for distributed in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        check_planned_master_weights(bf16, None, distributed)
    check_planned_master_weights(
        ModelConfig(model_name_or_path="m", dtype="bfloat16", use_peft=True), None, DistributedType.NO
    )
    check_planned_master_weights(ModelConfig(model_name_or_path="m", dtype="float32"), config, DistributedType.NO)
    check_planned_master_weights(ModelConfig(model_name_or_path="m", dtype="auto"), None, DistributedType.NO)


def test_the_planned_distributed_type_comes_from_the_arguments_or_the_launcher(monkeypatch):
    assert planned_distributed_type(SimpleNamespace(deepspeed="zero3.json", fsdp="")) == DistributedType.DEEPSPEED
    assert planned_distributed_type(SimpleNamespace(deepspeed=None, fsdp="full_shard")) == DistributedType.FSDP
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert planned_distributed_type(SimpleNamespace(deepspeed=None, fsdp="")) == DistributedType.FSDP
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    assert planned_distributed_type(SimpleNamespace(deepspeed=None, fsdp="")) == DistributedType.NO


def test_fp32_weights_pass(tiny_kit):
    check_master_weights(load_model(tiny_kit["policy"], dtype=torch.float32).named_parameters(), DistributedType.NO)


# ------------------------------------------------------------------------------------- LoRA and the frozen tower
def hooked_embeddings(model) -> set[str]:
    return {name for name, module in model.named_modules() if module._forward_hooks}


def test_only_embeddings_before_trained_checkpointed_layers_are_hooked(tiny_kit):
    """`utils.trainable.enable_input_require_grads` on the tiny Qwen2.5-VL under PEFT, called twice as TRL and
    `gradient_checkpointing_enable` do: adapters in the language model only hook its token embedding, once; adapters in
    the vision blocks (`qkv`) hook the tower's `patch_embed` too, which reentrant checkpointing then needs. transformers'
    own method hooks both embeddings in either case, once per call."""
    for targets, expected in (
        (["q_proj", "v_proj"], {"embed_tokens"}),
        (["q_proj", "qkv"], {"embed_tokens", "patch_embed"}),
    ):
        model = only_trained_inputs_require_grads(load_model(tiny_kit["policy"], dtype=torch.float32))
        peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=targets))
        peft_model.enable_input_require_grads()
        peft_model.gradient_checkpointing_enable()  # transformers' second registration
        hooked = hooked_embeddings(peft_model)
        assert {name.rsplit(".", 1)[-1] for name in hooked} == expected, targets
        assert all(len(dict(peft_model.named_modules())[name]._forward_hooks) == 1 for name in hooked)
    stock = get_peft_model(
        load_model(tiny_kit["policy"], dtype=torch.float32), LoraConfig(r=2, target_modules=["q_proj"])
    )
    stock.enable_input_require_grads()
    stock.gradient_checkpointing_enable()
    assert {len(dict(stock.named_modules())[n]._forward_hooks) for n in hooked_embeddings(stock)} == {2}
    assert any(name.endswith("visual.patch_embed") for name in hooked_embeddings(stock))


@pytest.mark.parametrize(
    ("vision_tower", "projector", "adapted"),
    [(True, True, set()), (True, False, {"merger"}), (False, False, {"blocks", "merger"})],
)
def test_a_frozen_part_gets_no_lora_adapter(tiny_kit, vision_tower, projector, adapted):
    """`all-linear` also selects the vision tower's Linear layers; the parts the recipe freezes are left out of the
    adapters (peft's `exclude_modules`), as LLaMA-Factory leaves them out of its targets."""
    model = load_model(tiny_kit["policy"], dtype=torch.float32)
    training_args = SimpleNamespace(freeze_vision_tower=vision_tower, freeze_projector=projector)
    model_args = ModelConfig(model_name_or_path="m", use_peft=True, lora_r=2, lora_target_modules=["all-linear"])
    peft_model = get_peft_model(model, policy_peft_config(model_args, model, training_args))
    lora = [name for name, _ in peft_model.named_modules() if name.endswith("lora_A")]
    assert any(".language_model." in name for name in lora)
    assert {name.split("visual.")[1].split(".")[0] for name in lora if "visual." in name} == adapted


def test_vision_targets_warn_unless_their_tower_is_frozen(tiny_kit, caplog):
    """Qwen2.5-VL's vision MLP is also gate/up/down_proj: such a target list adapts the tower, which warns with the
    count and an example; the attention targets do not, and a frozen tower takes no adapter, so no warning."""
    model = load_model(tiny_kit["policy"], dtype=torch.float32)
    mlp = normalise_target_modules(["gate_proj", "up_proj", "down_proj"])
    with caplog.at_level(logging.WARNING, logger="utils.lora"):
        check_lora_targets(model, mlp)
        check_lora_targets(model, normalise_target_modules(["q_proj", "k_proj", "v_proj", "o_proj"]))
        check_lora_targets(model, mlp, frozen_prefixes(model, vision_tower=True, projector=True))
    blocks = model.config.vision_config.depth
    (record,) = caplog.records
    assert f"also select {3 * blocks} module(s) of the vision tower (e.g. model.visual.blocks.0.mlp.down_proj)" in (
        record.getMessage()
    )


def test_an_adapter_folder_is_refused_by_rl_and_evaluation_with_the_merge_command(tmp_path, monkeypatch):
    """A LoRA run's output_dir given where a full checkpoint is read: named as an adapter, with `scripts.merge_lora`,
    before any weight is read or any sample evaluated."""
    adapter = tmp_path / "Qwen2.5-VL-7B-Instruct-MAPO-LoRA"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "Qwen/Qwen2.5-VL-7B-Instruct"}')
    (adapter / "tool_config.json").write_text('{"tool": {}, "rollout": {}}')
    loaded = []
    monkeypatch.setattr(policy, "load_model", lambda *args, **kwargs: loaded.append(args))
    monkeypatch.setattr(evaluate, "run_evaluation", lambda *args: loaded.append(args))
    message = rf"model_name_or_path: {adapter} is a LoRA adapter .*python -m scripts.merge_lora --adapter {adapter}"
    with pytest.raises(ValueError, match=message):
        policy.load_policy(ModelConfig(model_name_or_path=str(adapter)), ToolConfig(), NOT_DISTRIBUTED)
    with pytest.raises(ValueError, match=message):
        evaluate.main(["--model_name_or_path", str(adapter), "--output_dir", str(tmp_path / "eval")])
    assert not loaded


def test_sft_names_the_converter_before_loading_any_weight(tiny_kit, tmp_path, monkeypatch):
    """The real SFT recipes read a converted set from `outputs/data/...`: missing, it fails first, naming
    `python -m data.convert`, not after the policy has loaded."""
    loaded = []
    monkeypatch.setattr(sft, "load_policy", lambda *args: loaded.append(args))
    argv = ["--config", "recipes/tiny/sft/config_sft.yaml", "--output_dir", str(tmp_path / "out")]
    argv += ["--model_name_or_path", str(tiny_kit["policy"]), "--dataset_name", str(tmp_path / "mini_o3_coldstart")]
    parsed = parse_args_and_record((ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig), argv)
    with pytest.raises(FileNotFoundError, match=r"dataset_name: .*mini_o3_coldstart does not exist.*python -m data"):
        sft.main(*parsed)
    assert not loaded


# ---------------------------------------------------------------------------------------------------------- resume
def test_resume_only_when_asked(tmp_path, caplog):
    for step in (2, 10):  # intact checkpoints (tests/test_recipe_refusals.py: damaged ones)
        write_checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-12").mkdir()  # killed while saving: never resumed from
    args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=None)
    assert resume_checkpoint(args) is None
    assert "checkpoint-10" in caplog.text and "--resume_from_checkpoint true" in caplog.text
    assert resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="true")).endswith(
        "checkpoint-10"
    )
    folder = str(tmp_path / "checkpoint-2")
    assert resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=folder)) == folder
    with pytest.raises(ValueError, match="needs an intact checkpoint-"):
        resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path / "new"), resume_from_checkpoint="true"))
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=str(tmp_path / "nope")))


def _epochs(sampler, epochs, set_epoch=True):
    out = []
    for epoch in epochs:
        if set_epoch:
            sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_the_resumable_sampler_keeps_stock_trl_order_in_every_epoch():
    """Epoch k's order is the one stock TRL's `RepeatSampler` gives an uninterrupted run, epoch 0 included, and a
    sampler that starts at epoch k (a resumed run) gets the same order as one that iterated epochs 0..k-1."""
    kwargs = dict(data_source=list(range(6)), mini_repeat_count=2, batch_size=3, repeat_count=1, seed=7)
    stock = _epochs(RepeatSampler(**kwargs), range(4), set_epoch=False)
    assert len({tuple(order) for order in stock}) > 1  # the epochs really reshuffle
    assert _epochs(EpochSeededRepeatSampler(**kwargs), range(4)) == stock
    assert _epochs(EpochSeededRepeatSampler(**kwargs), [2, 3]) == stock[2:]
    assert _epochs(EpochSeededRepeatSampler(**kwargs), [0, 3, 1]) == [stock[0], stock[3], stock[1]]


# ---------------------------------------------------------------------------------------------------- token budget
def test_the_worst_case_is_measured_with_the_real_template(tiny_processor):
    budget = token_budget(
        tiny_processor, ToolConfig(), max_completion_length=320, max_tool_calling_iterations=2, context_length=128000
    )
    assert budget.prompt_image == 16  # 28 * 28 * 16 pixels / 28^2: the tiny kit's image budget
    assert budget.crop_response > 16  # the full-size crop plus the tool-response text around it
    assert budget.completion == 2 * (budget.call_turn + budget.crop_response) + budget.answer_turn
    small = token_budget(
        tiny_processor,
        ToolConfig(crop_max_pixels=28 * 28 * 4),
        max_completion_length=320,
        max_tool_calling_iterations=2,
        context_length=128000,
    )
    assert budget.crop_response - small.crop_response == 16 - 4  # a crop costs its budget / 28^2 tokens


def test_a_budget_that_cannot_hold_the_tool_responses_warns_with_the_numbers(tiny_processor):
    with pytest.warns(UserWarning, match=r"max_completion_length=100: its later tool responses are dropped") as w:
        budget = check_token_budget(
            tiny_processor,
            ToolConfig(),
            max_completion_length=100,
            max_tool_calling_iterations=5,
            context_length=128000,
        )
    assert f"= {budget.completion} tokens" in str(w[0].message)
    with pytest.warns(UserWarning, match="exceeds the model's context"):
        check_token_budget(
            tiny_processor, ToolConfig(), max_completion_length=320, max_tool_calling_iterations=2, context_length=300
        )
    with pytest.warns(UserWarning, match="is None"):
        check_token_budget(
            tiny_processor,
            ToolConfig(),
            max_completion_length=320,
            max_tool_calling_iterations=None,
            context_length=128000,
        )


RL_RECIPES = ["recipes/tiny/rl/config_mapo.yaml"]
RL_RECIPES += sorted(str(p) for p in Path("recipes").glob("*/rl/*.yaml") if p.parts[1] != "tiny")


@pytest.mark.parametrize("recipe", RL_RECIPES)
def test_every_rl_recipe_fits_its_worst_case(tiny_kit, recipe):
    """Image tokens depend only on the pixel budgets and the processor's patch x merge factor: the tiny kit's
    processors are each family's own, Qwen2.5-VL's 28 (14-pixel patches) and Qwen3-VL's 32 (16-pixel patches). Their
    byte-level tokenizer spends more tokens on text than Qwen's, so a recipe that fits here fits the real model. The
    Qwen3-VL recipe is measured in its own box convention (its system prompt and tool description)."""
    argv = ["--config", recipe, "--bf16", "false", "--use_vllm", "false"]  # no bf16 on CPU, no vLLM installed
    _, config, _, tool = parse_args_and_record(RL_TYPES, argv)  # the entry scripts' parser: recipe bases merged
    qwen3 = "Qwen3-VL" in recipe
    policy = tiny_kit["qwen3_vl" if qwen3 else "policy"]  # the tiny model of the recipe's family
    processor = load_processor(policy, min_pixels=tool.min_pixels, max_pixels=tool.max_pixels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        budget = check_token_budget(
            processor,
            tool,
            max_completion_length=config.max_completion_length,
            max_tool_calling_iterations=config.max_tool_calling_iterations,
            context_length=262144 if qwen3 else 128000,  # the text config's max_position_embeddings
        )
    if "Qwen2.5-VL" in recipe:  # the arithmetic in the recipes' comments (recipes/mapo_paper.yaml, mapo_lora.yaml)
        assert budget.prompt_image == 1280 and 512 < budget.crop_response < 512 + 60
    if qwen3:
        assert tool.box_convention == "relative_1000"
        assert budget.prompt_image == 980 and 392 < budget.crop_response < 392 + 60


@pytest.mark.parametrize("convention", ["pixels", "relative_1000"])
def test_the_tiny_qwen3_vl_budget_is_measured_with_its_own_processor(tiny_qwen3_vl_processor, convention):
    """On the real Qwen3-VL processor: 32-pixel blocks (16-pixel patches merged 2 x 2), so a crop costs its budget /
    32^2 tokens; the prompt text is measured with the convention's system prompt and tool description."""
    kwargs = dict(max_completion_length=320, max_tool_calling_iterations=2, context_length=4096)
    budget = token_budget(tiny_qwen3_vl_processor, ToolConfig(box_convention=convention), **kwargs)
    assert budget.prompt_image == 16  # 32 * 32 * 16 pixels / 32^2: the tiny Qwen3-VL's image budget
    small = token_budget(
        tiny_qwen3_vl_processor, ToolConfig(crop_max_pixels=32 * 32 * 4, box_convention=convention), **kwargs
    )
    assert budget.crop_response - small.crop_response == 16 - 4
    pixels = token_budget(tiny_qwen3_vl_processor, ToolConfig(), **kwargs)
    assert (budget.prompt_text != pixels.prompt_text) == (convention != "pixels")  # the words of its frame


# ------------------------------------------------------------------------------------------------------ the data
def test_a_recipe_sets_the_synthetic_world(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "dataset_name: synthetic\nnum_samples: 2\nsynthetic_object_fraction: [0.1, 0.1]\n"
        "synthetic_question_types: [shape]\nsynthetic_region_hint: true\nsynthetic_image_size: [600, 700]\n"
        "use_cpu: true\nbf16: false\n"
        "output_dir: " + str(tmp_path / "out") + "\n"
    )
    script_args = parse_args_and_record(RL_TYPES, ["--config", str(recipe)])[0]
    rows = load_split(script_args, "train")
    assert [row["source"] for row in rows] == ["synthetic/shape"] * 2
    assert all(" of the image." in row["prompt"][-1]["content"] for row in rows)  # the region hint
    assert all(600 <= side <= 700 for row in rows for side in row["image"].size)
    for row in rows:  # the object is a tenth of the short side: the target box is about that wide
        x1, y1, x2, y2 = row["target_bbox"]
        assert max(x2 - x1, y2 - y1) >= 0.09 * min(row["image"].size)


# ---------------------------------------------------------------------------------------- the vLLM server's budget
class Server:
    """TRL's `VLLMClient` as `check_vllm_server` reads it: the model it serves, and the image features it makes of
    each prompt's images, sized by the server's own pixel budget (`smart_resize`, as vLLM's Qwen2-VL processor)."""

    base_url = "http://vllm:8000"

    def __init__(self, min_pixels: int, max_pixels: int, model: str = "policy"):
        self.model, self.min_pixels, self.max_pixels = model, min_pixels, max_pixels

    def image_features(self, images):
        out = []
        for row in images:
            lengths = []
            for image in row:
                h, w = smart_resize(image.height, image.width, 28, self.min_pixels, self.max_pixels)
                lengths.append(h * w // 28**2)
            out.append({"mm_placeholders": {"image": [{"offset": 0, "length": n} for n in lengths]}})
        return out


def test_the_server_check_probes_both_ends_of_the_pixel_budget():
    """A server started with another min_pixels resizes every image below it otherwise (small crops): the check
    fails naming the flag, as it does for max_pixels, and passes a server with the recipe's budget."""
    processor = SimpleNamespace(
        image_processor=Qwen2VLImageProcessor(size={"shortest_edge": 3136, "longest_edge": 1003520})
    )
    check_vllm_server(Server(3136, 1003520), "policy", processor)
    with pytest.raises(
        ValueError,
        match=r"makes 1 image tokens of a 28x28 image, the trainer's processor 4: the server's min_pixels differs "
        r"from the recipe's min_pixels=3136.*--mm-processor-kwargs '\{\"min_pixels\": 3136, \"max_pixels\": 1003520\}'",
    ):
        check_vllm_server(Server(784, 1003520), "policy", processor)
    with pytest.raises(
        ValueError, match=r"of a 4096x4096 image, the trainer's processor 1225: the server's max_pixels"
    ):
        check_vllm_server(Server(3136, 12845056), "policy", processor)
    with pytest.raises(ValueError, match="serves 'other', but model_name_or_path is 'policy'"):
        check_vllm_server(Server(3136, 1003520, model="other"), "policy", processor)


# ---------------------------------------------------------------------------------------------- logging backends
def test_a_missing_report_to_backend_is_named_before_any_weight_loads(tiny_kit, tmp_path, monkeypatch):
    """wandb is a GPU extra (requirements-gpu.txt), absent here: the RL entry script refuses `--report_to wandb` after
    reading its data and before any weight loads, naming the package; transformers would raise only once the trainer
    is built, after every rank has loaded the model."""
    monkeypatch.setattr("utils.policy.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    argv = ["--config", "recipes/tiny/rl/config_mapo.yaml", "--model_name_or_path", str(tiny_kit["policy"]),
            "--output_dir", str(tmp_path), "--report_to", "wandb"]  # fmt: skip
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    with pytest.raises(ValueError, match=r"report_to: wandb \(pip install wandb: WandbCallback requires wandb"):
        rl.build_trainer(*parse_args_and_record(RL_TYPES, argv))
    for nothing in (["none"], "none", None, []):  # nothing to check
        check_report_to(nothing)
    with pytest.raises(ValueError, match=r"report_to: unknown backend 'wandbb'; known: none, all, azure_ml"):
        check_report_to(["wandbb"])


def test_wandb_needs_a_login_a_launched_job_cannot_type(tmp_path):
    netrc = tmp_path / "netrc"
    with pytest.raises(ValueError, match=r"no wandb login \(no WANDB_API_KEY, no key for api.wandb.ai in .*netrc\)"):
        check_wandb_login({"NETRC": str(netrc)})
    check_wandb_login({"NETRC": str(netrc), "WANDB_API_KEY": "k"})
    check_wandb_login({"NETRC": str(netrc), "WANDB_MODE": "offline"})
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    check_wandb_login({"NETRC": str(netrc)})  # `wandb login` wrote it
    with pytest.raises(ValueError, match=r"no key for wandb.example.org"):
        check_wandb_login({"NETRC": str(netrc), "WANDB_BASE_URL": "https://wandb.example.org"})


def test_an_accelerate_config_needs_its_backend_installed():
    configs = Path(__file__).resolve().parents[1] / "recipes" / "accelerate_configs"
    with pytest.raises(ValueError, match=r"zero3.yaml: distributed_type DEEPSPEED needs deepspeed, which is not"):
        check_accelerate_config(configs / "zero3.yaml")  # DeepSpeed is a GPU extra
    for name in ("cpu", "multi_cpu", "ddp", "fsdp2", "single_gpu"):
        check_accelerate_config(configs / f"{name}.yaml")
