"""`memory.py` and the shipped architecture configs: offline, on the meta device, no weights."""

import json
import re
from pathlib import Path

import pytest
from torch import nn
from transformers import AutoConfig, Qwen2Config
from trl import ModelConfig

from scripts import memory
from tests.tolerance import FLOAT64, HAND_TERMS, approx
from utils.recipes import load_recipe

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "recipes" / "model_configs"
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]

# Parameters of the meta-built models (tied weights once). Qwen2.5-VL-3B/7B match the published ~3.75B / ~8.29B (the
# latter is also what the lead's GPU run built from random weights); Qwen3-VL-8B matches, to the parameter, the tensor
# total of the released safetensors (8,767,123,696), recorded in recipes/model_configs/README.md.
EXPECTED_PARAMS = {
    "Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen2.5-VL-7B-Instruct": 8_292_166_656,
    "Qwen3-VL-8B-Instruct": 8_767_123_696,
}
ROUND_FIGURES = {"Qwen2.5-VL-3B-Instruct": 3.75e9, "Qwen2.5-VL-7B-Instruct": 8.29e9, "Qwen3-VL-8B-Instruct": 8.77e9}


@pytest.fixture(scope="module")
def meta_models():
    return {path.name: memory.build_on_meta(path) for path in CONFIGS.iterdir() if (path / "config.json").is_file()}


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMS))
def test_shipped_config_builds_on_meta_with_the_published_size(meta_models, name):
    model = meta_models[name]
    assert all(p.is_meta for p in model.parameters())
    n = memory.parameter_count(model)
    assert n == pytest.approx(ROUND_FIGURES[name], rel=0.01, abs=0)  # published figures, rounded
    assert n == EXPECTED_PARAMS[name]


def test_shipped_configs_carry_the_known_shapes():
    seven = AutoConfig.from_pretrained(CONFIGS / "Qwen2.5-VL-7B-Instruct")
    text, vision = seven.text_config, seven.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        3584,
        28,
        28,
        4,
    )
    assert (text.intermediate_size, text.vocab_size, seven.tie_word_embeddings) == (18944, 152064, False)
    assert (vision.depth, vision.hidden_size, vision.intermediate_size, vision.num_heads) == (32, 1280, 3420, 16)
    assert (vision.out_hidden_size, vision.fullatt_block_indexes, vision.window_size) == (3584, [7, 15, 23, 31], 112)
    assert text.rope_parameters["mrope_section"] == [16, 24, 24]

    three = AutoConfig.from_pretrained(CONFIGS / "Qwen2.5-VL-3B-Instruct")
    text = three.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        2048,
        36,
        16,
        2,
    )
    assert (text.intermediate_size, three.tie_word_embeddings, three.vision_config.out_hidden_size) == (
        11008,
        True,
        2048,
    )


def test_hub_names_resolve_to_the_shipped_copies():
    assert memory.resolve_config_path("Qwen/Qwen2.5-VL-7B-Instruct") == str(CONFIGS / "Qwen2.5-VL-7B-Instruct")
    assert memory.resolve_config_path("some/unknown-model") == "some/unknown-model"


def test_lora_targets_of_the_recipes_exist(meta_models):
    # 28 layers x 4 projections; the vision tower's fused `qkv`/`proj` are not selected by these names.
    assert memory.check_lora_targets(meta_models["Qwen2.5-VL-7B-Instruct"], QKVO) == 28 * 4
    assert memory.check_lora_targets(meta_models["Qwen2.5-VL-3B-Instruct"], QKVO) == 36 * 4
    assert memory.check_lora_targets(meta_models["Qwen3-VL-8B-Instruct"], QKVO) == 36 * 4


def test_every_lora_recipe_names_existing_modules(meta_models):
    recipes = [p for p in (REPO_ROOT / "recipes").glob("*/*/*.yaml") if (CONFIGS / p.parts[-3]).is_dir()]
    values = {p: load_recipe(p).values for p in recipes}  # with their bases merged, as the entry scripts read them
    lora = [p for p in recipes if values[p].get("use_peft")]
    assert len({p.parts[-3] for p in lora}) >= 2, "LoRA recipes for the 7B and the 3B"
    for path in lora:
        targets = memory.normalise_target_modules(values[path]["lora_target_modules"])
        assert memory.check_lora_targets(meta_models[path.parts[-3]], targets) > 0, path


def test_a_misspelt_target_is_named_with_the_suffixes_on_offer(meta_models):
    with pytest.raises(ValueError) as info:
        memory.check_lora_targets(meta_models["Qwen2.5-VL-7B-Instruct"], ["q_proj", "qkv_projj"])
    message = str(info.value)
    assert "['qkv_projj']" in message  # only the missing one
    assert all(f"'{suffix}'" in message for suffix in ("q_proj", "gate_proj", "qkv", "proj", "lm_head"))


def test_targets_that_select_no_linear_layer_are_refused(meta_models):
    with pytest.raises(ValueError, match="cannot adapt"):
        memory.check_lora_targets(meta_models["Qwen2.5-VL-7B-Instruct"], ["mlp"])


def test_all_linear_skips_the_output_head(meta_models):
    model = meta_models["Qwen2.5-VL-7B-Instruct"]
    (selected,) = memory.lora_matches(model, "all-linear").values()
    linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert "lm_head" in linear and "lm_head" not in selected
    assert len(selected) == len(linear) - 1 == memory.check_lora_targets(model, "all-linear")


def test_single_targets_follow_trl_into_a_full_match_regex(meta_models):
    # TRL turns a one-element list into a string, which peft reads as a regex over the full module name.
    for targets in (["q_proj"], ["all-linear"], QKVO):
        assert memory.normalise_target_modules(targets) == ModelConfig(lora_target_modules=targets).lora_target_modules
    with pytest.raises(ValueError, match="match no module"):
        memory.check_lora_targets(meta_models["Qwen2.5-VL-7B-Instruct"], memory.normalise_target_modules(["q_proj"]))
    assert memory.check_lora_targets(meta_models["Qwen2.5-VL-7B-Instruct"], r".*language_model.*\.q_proj") == 28


class Toy(nn.Module):
    """420 parameters in two Linear layers, and a decoder config for the activation formula."""

    def __init__(self):
        super().__init__()
        self.config = Qwen2Config(
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=32,
        )
        self.up = nn.Linear(10, 20)  # 200 + 20
        self.down = nn.Linear(20, 10, bias=False)  # 200


GIB = 2**30
TOY = {"micro_batch": 1, "seq_len": 10}
# Activations by hand (bf16, 2 bytes), tokens T = 10, hidden 8, kv_dim 1 * (8 / 2) = 4, intermediate 16, vocab 32:
# one full layer T * (6 * 8 + 3 * 4 + 4 * 16) = 1240 values; checkpoints 2 layers * T * 8 = 160 values.
# TRL's fused LM head: a T x 32 bf16 tile, the scored hidden states in bf16 plus their fp32 gradient (T * 8 * 6 bytes)
# and the fp32 gradient of the 32 x 8 head; materialised logits instead: T * 32 * 8 bytes.
TOY_LOGITS_FUSED = 10 * 32 * 2 + 10 * 8 * 6 + 32 * 8 * 4
TOY_LOGITS_FULL = 10 * 32 * 8
TOY_ACT_CHECKPOINTED = 2 * (160 + 1240) + TOY_LOGITS_FUSED
TOY_ACT_FULL = 2 * 2 * 1240 + TOY_LOGITS_FUSED


def test_full_fine_tuning_bytes_by_hand():
    est = memory.estimate_memory(Toy(), **TOY)
    assert est["parameters"] * GIB == 420 * 2  # bf16 weights
    assert est["gradients"] * GIB == 420 * 2  # bf16 gradients
    assert est["optimizer_states"] * GIB == 420 * 2 * 2  # torch AdamW: exp_avg + exp_avg_sq like the weights
    assert est["activations"] * GIB == TOY_ACT_CHECKPOINTED
    assert est["total"] * GIB == 420 * 8 + TOY_ACT_CHECKPOINTED

    fp32_master = memory.estimate_memory(Toy(), master_weights_fp32=True, **TOY)
    assert fp32_master["optimizer_states"] * GIB == 420 * 12  # fp32 copy + two fp32 states
    no_ckpt = memory.estimate_memory(Toy(), gradient_checkpointing=False, **TOY)
    assert no_ckpt["activations"] * GIB == TOY_ACT_FULL
    unfused = memory.estimate_memory(Toy(), fused_lm_head=False, **TOY)
    assert unfused["activations"] * GIB == TOY_ACT_CHECKPOINTED - TOY_LOGITS_FUSED + TOY_LOGITS_FULL


def test_lora_bytes_by_hand():
    est = memory.estimate_memory(Toy(), trainable="lora", lora_r=2, lora_targets=["up"], **TOY)
    adapter = 2 * (10 + 20)  # A: 2 x 10, B: 20 x 2
    assert est["parameters"] * GIB == 420 * 2 + adapter * 4  # frozen bf16 base + fp32 adapters (peft's upcast)
    assert est["gradients"] * GIB == adapter * 4
    assert est["optimizer_states"] * GIB == adapter * 8
    # A frozen head needs no fp32 weight-gradient accumulator.
    assert est["activations"] * GIB == TOY_ACT_CHECKPOINTED - 32 * 8 * 4


def test_qlora_stores_linear_weights_in_four_bits():
    est = memory.estimate_memory(Toy(), trainable="lora", lora_r=2, lora_targets=["up"], load_in_4bit=True, **TOY)
    # 400 Linear weights at 0.5 byte + one fp32 absmax per 64; the 20 biases stay bf16.
    assert est["parameters"] * GIB == approx(
        400 * (0.5 + 4 / 64) + 20 * 2 + 60 * 4, FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    with pytest.raises(ValueError, match="4-bit"):
        memory.estimate_memory(Toy(), load_in_4bit=True, **TOY)


def test_zero_stages_shard_what_they_promise():
    base = memory.estimate_memory(Toy(), master_weights_fp32=True, **TOY)
    z2 = memory.estimate_memory(Toy(), zero_stage=2, num_gpus=4, **TOY)
    z3 = memory.estimate_memory(Toy(), zero_stage=3, num_gpus=4, **TOY)
    assert z2["parameters"] == base["parameters"]
    assert z2["gradients"] == base["gradients"] / 4 and z2["optimizer_states"] == base["optimizer_states"] / 4
    # ZeRO-3 also shards the weights, but gathers the module computing (here `up`, 220 parameters) in full.
    assert z3["parameters"] * GIB == 420 * 2 / 4 + 220 * 2
    assert z3["gradients"] == base["gradients"] / 4 and z3["optimizer_states"] == base["optimizer_states"] / 4
    assert z3["activations"] == z2["activations"] == base["activations"]


def test_zero_on_the_7b(meta_models):
    model = meta_models["Qwen2.5-VL-7B-Instruct"]
    one = memory.estimate_memory(model, master_weights_fp32=True)
    z2 = memory.estimate_memory(model, zero_stage=2, num_gpus=8)
    z3 = memory.estimate_memory(model, zero_stage=3, num_gpus=8)
    assert one["optimizer_states"] == pytest.approx(8.292e9 * 12 / GIB, rel=1e-3, abs=0)
    assert z2["parameters"] == one["parameters"] and z2["gradients"] == approx(
        one["gradients"] / 8, FLOAT64, terms=HAND_TERMS, scale=1.0
    )
    assert z3["optimizer_states"] == approx(one["optimizer_states"] / 8, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert z3["parameters"] < one["parameters"] / 4  # a shard plus the gathered embedding


def test_a_frozen_vision_tower_has_no_gradients_states_or_activations(meta_models):
    """SFT's default (`freeze_vision_tower`, `freeze_projector`): the tower's 676.55M parameters keep their bf16 weights
    but get no gradient or AdamW state, and no activation of the tower is kept for a backward pass. With only the
    projector training, its gradient and states come back and still no backward runs through the blocks."""
    model = meta_models["Qwen2.5-VL-7B-Instruct"]
    tower = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.visual."))
    merger = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.visual.merger."))
    # By hand: merger = RMSNorm 1280 + Linear 5120->5120 + Linear 5120->3584 (biased) = 44,574,464; a block = 2 norms
    # + qkv + proj + gate, up (1280->3420) + down = 19,702,200, x 32; patch embedding 3 x 2 x 14 x 14 x 1280 = 1,505,280.
    assert (tower, merger) == (32 * 19_702_200 + 1_505_280 + 44_574_464, 44_574_464)
    work = dict(micro_batch=2, seq_len=3328, image_tokens=2304)
    trained = memory.estimate_memory(model, **work)
    frozen = memory.estimate_memory(model, freeze_vision_tower=True, freeze_projector=True, **work)
    projector = memory.estimate_memory(model, freeze_vision_tower=True, **work)
    assert frozen["parameters"] == trained["parameters"]  # frozen weights are still stored
    assert frozen["gradients"] * GIB == (8_292_166_656 - tower) * 2
    assert frozen["optimizer_states"] * GIB == (8_292_166_656 - tower) * 2 * 2
    assert projector["gradients"] * GIB == (8_292_166_656 - tower + merger) * 2
    vision = memory.activation_bytes(model, **work)["vision"]
    assert vision > 2 * GIB  # what a backward pass through the tower keeps (recipes/README.md)
    assert frozen["activations"] * GIB == projector["activations"] * GIB == trained["activations"] * GIB - vision
    with pytest.raises(ValueError, match="has no model.visual"):
        memory.estimate_memory(Toy(), freeze_vision_tower=True, **TOY)


def test_the_h200_setup_weights_grads_and_adam_states(meta_models):
    # One H200, 7B shape, bf16 weights, plain torch AdamW (bf16 states): 8 bytes per parameter before activations.
    est = memory.estimate_memory(meta_models["Qwen2.5-VL-7B-Instruct"], micro_batch=8, seq_len=2048, image_tokens=1280)
    static = est["parameters"] + est["gradients"] + est["optimizer_states"]
    assert (
        static
        == approx(8_292_166_656 * 8 / GIB, FLOAT64, terms=HAND_TERMS, scale=1.0)
        == pytest.approx(61.8, abs=0.05)
    )


def test_cli_prints_the_table(capsys):
    est = memory.main(
        ["--model_config", str(CONFIGS / "Qwen2.5-VL-3B-Instruct"), "--lora_r", "8", "--micro_batch", "2"]
    )
    out = capsys.readouterr().out
    assert "LoRA r=8 on 144 modules" in out and "total" in out
    assert est["total"] == approx(sum(v for k, v in est.items() if k != "total"), FLOAT64, terms=HAND_TERMS, scale=1.0)
    with pytest.raises(ValueError, match="qkv_projj"):
        memory.main(
            [
                "--model_config",
                str(CONFIGS / "Qwen2.5-VL-3B-Instruct"),
                "--lora_r",
                "8",
                "--lora_target_modules",
                "qkv_projj",
                "o_proj",
            ]
        )


def test_cli_estimates_a_recipe_on_an_accelerate_config(capsys):
    recipe = "recipes/Qwen2.5-VL-3B-Instruct/rl/config_mapo_qlora.yaml"
    est = memory.main(["--recipe", recipe, "--accelerate", "single_gpu"])
    out = capsys.readouterr().out
    # 4 rollouts per GPU, each 1280 image + 450 prompt + 6144 completion tokens; 1280 + 5 crops x 512 through the ViT
    assert "LoRA r64, 4-bit base, 1 GPU" in out and "4 x 7874 tokens (3840 image, 6144 scored)" in out
    assert est["parameters"] < memory.main(["--recipe", recipe.replace("_qlora", "_lora")])["parameters"] / 2
    qwen3 = ["--recipe", "recipes/Qwen3-VL-8B-Instruct/rl/config_mapo.yaml", "--accelerate", "zero3"]
    one_node, two_nodes = (
        memory.main(qwen3),
        memory.main([*qwen3, "--num_gpus", "16"]),
    )  # ZeRO-3 over 8 or 16 GPUs
    assert two_nodes["optimizer_states"] == approx(
        one_node["optimizer_states"] / 2, FLOAT64, terms=HAND_TERMS, scale=1.0
    )


def test_a_qwen3_vl_is_read_by_the_fields_it_states(tiny_kit, tmp_path):
    """The tiny Qwen3-VL of the kit, built from its folder: the estimator reads its stated head size (2 KV heads of
    32, not hidden_size / heads = 16), its ungated vision MLP, and its 16-pixel patches merged 2 x 2 (a recipe's
    budgets in 32^2-pixel tokens: the 8B's 980 per image and 392 per crop); the deepstack mergers are counted."""
    model = memory.build_on_meta(tiny_kit["qwen3_vl"])
    assert memory.kv_width(model) == 2 * 32
    assert memory.generation_bytes(model, rollouts=2, context_len=100)["kv_cache"] == 2 * 100 * 2 * 2 * (2 * 32) * 2
    # 16 merged image tokens are 64 patches through 2 checkpointed vision blocks (hidden 32, MLP 64 ungated), bf16
    vision = memory.activation_bytes(model, micro_batch=1, seq_len=100, image_tokens=16)["vision"]
    assert vision == 2 * (2 * 64 * 32 + 64 * (6 * 32 + 3 * 32 + 2 * 64))
    assert any("deepstack_merger_list" in name for name, _ in model.named_parameters())
    recipe = tmp_path / "config_mapo.yaml"
    base = REPO_ROOT / "recipes" / "mapo_paper.yaml"
    recipe.write_text(f"base: {base}\nmodel_name_or_path: {tiny_kit['qwen3_vl']}\noutput_dir: {tmp_path}\n")
    workload = memory.recipe_workload(recipe, "zero3")
    assert workload.model_config == str(tiny_kit["qwen3_vl"])
    assert workload.generation["image_tokens"] == 980 + 5 * 392
    estimate, _ = memory.estimate_recipe(recipe, "zero3")
    assert 0 < estimate["total"] < 1  # GiB: a tiny model's weights at the 8B recipe's lengths


# ------------------------------------------------------------------------------------------------------ generation
def test_generation_bytes_by_hand(meta_models):
    """Qwen2.5-VL-7B: 28 layers, 4 KV heads of 128, hidden 3584, MLP 18944, vocab 152064; vision hidden 1280, MLP
    3420, patches merged 2 x 2. Two rollouts of 1,000 tokens in bf16."""
    model = meta_models["Qwen2.5-VL-7B-Instruct"]
    text_only = memory.generation_bytes(model, rollouts=2, context_len=1000)
    assert text_only["kv_cache"] == 2 * 1000 * 28 * 2 * (4 * 128) * 2 == 114_688_000
    assert text_only["prefill"] == 2 * 1000 * (3 * 3584 + 3 * 18944) * 2 == 270_336_000
    assert text_only["logits"] == 2 * 152064 * 4 and text_only["gathered_weights"] == 0
    # 1,280 merged image tokens a rollout are 5,120 patches: one vision block over all of them outweighs a text layer.
    with_images = memory.generation_bytes(
        model, rollouts=2, context_len=1000, image_tokens=1280, gather_full_weights=True
    )
    assert with_images["prefill"] == 2 * 1280 * 4 * (3 * 1280 + 3 * 3420) * 2 == 288_768_000
    assert with_images["gathered_weights"] == 2 * memory.parameter_count(model)


def test_the_generation_phase_adds_to_what_training_keeps_resident():
    training = {"parameters": 2.0, "gradients": 1.0, "optimizer_states": 4.0, "activations": 10.0, "total": 17.0}
    both = memory.with_generation(training, {"kv_cache": 3 * memory.GIB, "prefill": 0.5 * memory.GIB})
    assert both["total"] == 17.0 and both["generation_kv_cache"] == 3.0 and both["generation_prefill"] == 0.5
    assert both["generation_total"] == 2.0 + 1.0 + 4.0 + 3.0 + 0.5  # activations are freed between steps


def test_a_recipe_generates_its_micro_batch_with_zero3_gathering_the_weights():
    workload = memory.recipe_workload("recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo.yaml", "zero3")
    assert workload.generation == {
        "rollouts": 8,  # per_device_train_batch_size 8 x steps_per_generation 1
        "context_len": 1280 + memory.PROMPT_TEXT_TOKENS + 8192,
        "image_tokens": 1280 + 5 * 512,
        "dtype": "bfloat16",
        "gather_full_weights": True,
    }
    assert (
        memory.recipe_workload("recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo.yaml", "fsdp2").generation[
            "gather_full_weights"
        ]
        is False
    )
    assert (
        memory.recipe_workload("recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_vllm_server.yaml", "zero3").generation
        is None
    )
    assert memory.recipe_workload("recipes/Qwen2.5-VL-7B-Instruct/sft/config_sft.yaml", "zero3").generation is None


def test_an_sft_recipe_is_sized_by_its_measured_rows_else_by_its_max_length(tmp_path, capsys):
    """Issue 47, item 4: SFT never truncates and leaves out rows over max_length, so max_length bounds a row: 10,240
    tokens with the prompt image and 5 full crops (1,280 + 5 x 512, the RL limit data.convert holds rows to). An SFT
    run's measured lengths (data_stats.json) replace it; a recipe with neither falls back to a guessed row, said so."""
    recipe = "recipes/Qwen2.5-VL-7B-Instruct/sft/config_sft.yaml"
    bound = memory.recipe_workload(recipe, "zero3")
    assert (bound.kwargs["seq_len"], bound.kwargs["image_tokens"], bound.kwargs["logit_tokens"]) == (
        10240,
        3840,
        10240,
    )
    assert "max_length 10240" in bound.describe()
    lengths = tmp_path / "data_stats.json"
    lengths.write_text(json.dumps({"tokens": {"p50": 3100, "p90": 5200, "max": 6200}, "image_tokens": {"max": 2816}}))
    measured = memory.recipe_workload(recipe, "zero3", sft_lengths=lengths)
    assert (measured.kwargs["seq_len"], measured.kwargs["image_tokens"]) == (6200, 2816)
    assert (
        memory.estimate_recipe(recipe, "zero3", sft_lengths=lengths)[0]["total"]
        < memory.estimate_recipe(recipe, "zero3")[0]["total"]
    )
    memory.main(["--recipe", recipe, "--accelerate", "zero3", "--sft_lengths", str(lengths)])
    assert f"2 x 6200 tokens (2816 image, 6200 scored); rows measured in {lengths}: p50 3100, p90 5200" in (
        capsys.readouterr().out
    )
    unbounded = tmp_path / "config_sft.yaml"
    unbounded.write_text((REPO_ROOT / recipe).read_text().replace("max_length: 10240", "max_length: null"))
    guessed = memory.recipe_workload(unbounded, "zero3")
    assert guessed.kwargs["seq_len"] == 1280 + 2 * 512 + memory.SFT_TEXT_TOKENS and "guessed" in guessed.describe()


# ------------------------------------------------------------------------------------------ a colocated vLLM engine
def test_a_colocated_engine_takes_its_share_beside_training_unless_it_sleeps():
    """By hand: a 0.3 share of an 80 GiB GPU is 24 GiB. Awake, it stays through the backward pass (training's peak
    grows by it); asleep (TRL's level 2 after every generation), it is only there while generating."""
    training = {"parameters": 2.0, "gradients": 1.0, "optimizer_states": 4.0, "activations": 10.0, "total": 17.0}
    awake = memory.with_colocated_vllm(training, gpu_memory_utilization=0.3, gpu_gib=80, sleep_mode=False)
    assert awake["vllm_engine"] == 24.0
    assert awake["total"] == 17.0 + 24.0  # the engine keeps its memory while training steps
    assert awake["generation_total"] == 2.0 + 1.0 + 4.0 + 24.0  # activations are freed between steps
    asleep = memory.with_colocated_vllm(training, gpu_memory_utilization=0.3, gpu_gib=80, sleep_mode=True)
    assert asleep["total"] == 17.0 and asleep["generation_total"] == awake["generation_total"]
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        memory.with_colocated_vllm(training, gpu_memory_utilization=0.0, gpu_gib=80, sleep_mode=False)


def test_a_colocate_recipe_is_estimated_with_its_engine():
    """A recipe in colocate mode brings its `vllm_gpu_memory_utilization` and sleep mode; the server recipe brings no
    engine; `vllm_colocate` adds one to a recipe that generates with transformers, and then it has no transformers
    generation phase."""
    recipe = "recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_lora.yaml"
    plain, _ = memory.estimate_recipe(recipe, "single_gpu")
    colocated, setup = memory.estimate_recipe(recipe, "single_gpu", vllm_colocate=0.25, gpu_gib=141)
    assert colocated["vllm_engine"] == 0.25 * 141 and "colocated vLLM at 0.25 of 141 GiB" in setup
    resident = plain["parameters"] + plain["gradients"] + plain["optimizer_states"]
    assert colocated["generation_total"] == approx(resident + 0.25 * 141, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert colocated["total"] == approx(plain["total"] + 0.25 * 141, FLOAT64, terms=HAND_TERMS, scale=1.0)
    assert "generation_kv_cache" not in colocated  # vLLM's KV cache lives in its share
    sleeping, setup = memory.estimate_recipe(recipe, "single_gpu", vllm_colocate=0.25, vllm_sleep_mode=True)
    assert sleeping["total"] == plain["total"] and setup.endswith("sleep mode")
    server = memory.recipe_workload("recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_vllm_server.yaml", "zero3")
    assert server.engine is None and server.generation is None
    assert memory.recipe_workload(recipe, "single_gpu").engine is None


def test_a_recipe_in_colocate_mode_reads_its_engine_fields(tmp_path):
    recipe = tmp_path / "rl" / "config.yaml"
    recipe.parent.mkdir()
    base = (REPO_ROOT / "recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_lora.yaml").resolve()
    recipe.write_text(
        f"base: {base}\nmodel_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct\nuse_vllm: true\n"
        "vllm_gpu_memory_utilization: 0.4\nvllm_enable_sleep_mode: true\n"
    )
    workload = memory.recipe_workload(recipe, "single_gpu")
    assert workload.engine == {"gpu_memory_utilization": 0.4, "sleep_mode": True}  # vllm_mode's default: colocate
    assert memory.recipe_workload(recipe, "single_gpu", vllm_sleep_mode=False).engine["sleep_mode"] is False


def readme_colocate_rows() -> list[tuple[list[str], float, float]]:
    """(scripts.memory arguments, generation GiB, training GiB) of recipes/README.md's colocated-engine table."""
    rows = []
    pattern = r"`python -m scripts\.memory ([^`]+--vllm_colocate[^`]*)` \| ([\d.]+) \| ([\d.]+)"
    for line in (REPO_ROOT / "recipes" / "README.md").read_text().splitlines():
        if found := re.search(pattern, line):
            rows.append((found[1].split(), float(found[2]), float(found[3])))
    return rows


def test_the_readme_colocate_rows_are_memory_py_estimates(capsys):
    rows = readme_colocate_rows()
    assert len(rows) == 6 and sum("--vllm_enable_sleep_mode" in args for args, _, _ in rows) == 3
    for args, generation, training in rows:
        estimate = memory.main(args)
        assert estimate["generation_total"] == pytest.approx(generation, abs=0.01), args
        assert estimate["total"] == pytest.approx(training, abs=0.01), args


def test_a_qwen3_5_keeps_a_kv_cache_in_its_attention_layers_and_a_state_in_its_linear_ones(tiny_kit):
    """Issue 62: a hybrid's generation keeps a KV cache in its full-attention layers only, and in each Gated DeltaNet
    layer a state per rollout whatever the context: worked by hand on the tiny Qwen3.5 (1 layer of each kind; 2 KV
    heads of 32; 2 value heads of 128 x 128 keys, a conv over 2 x 128 + 256 channels of kernel 4, bf16 as its config
    names no `mamba_ssm_dtype`) and on Qwen3.5-9B's shipped config (24 linear layers, 32 heads of 128 x 128 in float32:
    ~49 MiB a rollout). Its linear layers' training activations are their own (`utils.hybrid.linear_saved_elements`).
    Planted: the KV cache over every layer, the state grown with the context (each fails)."""
    model = memory.build_on_meta(tiny_kit["qwen3_5"])
    for context in (100, 1000):
        parts = memory.generation_bytes(model, rollouts=2, context_len=context)
        assert parts["kv_cache"] == 2 * context * 1 * 2 * (2 * 32) * 2
        assert parts["linear_state"] == 2 * 1 * (2 * 128 * 128 * 2 + 512 * 3 * 2) == 137_216
    nine = memory.build_on_meta(Path("recipes/model_configs/Qwen3.5-9B"))
    parts = memory.generation_bytes(nine, rollouts=1, context_len=1)
    assert parts["linear_state"] == 24 * (32 * 128 * 128 * 4 + 8192 * 3 * 2) == 51_511_296
    assert parts["kv_cache"] == 8 * 2 * (4 * 256) * 2
    # checkpointed: every layer's input, and one layer recomputed, the larger kind (here the Gated DeltaNet's)
    text = memory.activation_bytes(model, micro_batch=1, seq_len=10, gradient_checkpointing=True)["text"]
    linear = 10 * (2 * 64 + (2 * 512 + 3 * 256 + 4 * 2 + 2 * 2 * 128 * 128 / 64) + 4 * 128)
    assert text == 2 * (2 * 10 * 64 + linear)
