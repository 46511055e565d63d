"""Recipes and accelerate configs, validated without weights or GPUs: recipe bases and the merged `recipe.yaml`, every recipe
parsing into its entry script's dataclasses, start-up errors that name the field, every accelerate config loading,
and the recipes/README.md memory table matching `scripts/memory.py`."""

import logging
import os
import re
import shutil
import subprocess
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_multi_gpu_env
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizers_utils import should_convert_module
from trl import ModelConfig

from configs import ScriptArguments, SFTConfig
from data.trajectories import TrajectoryArguments
from mapo_trainer import MAPOConfig
from scripts import memory
from tools import ToolConfig
from utils import checks, policy, recipes
from utils.recipes import flag_values, load_recipe, parse_args_and_record
from utils.trainable import quantized_linear_modules

REPO = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO / "recipes"
RL_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
SFT_TYPES = (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig)
# Launchable recipes: recipes/<Model or tiny>/<stage>/<recipe>.yaml. The files directly under recipes/ are bases.
RECIPES = sorted(p.relative_to(REPO).as_posix() for p in RECIPES_DIR.glob("*/*/*.yaml"))
REAL = [r for r in RECIPES if not r.startswith("recipes/tiny/")]
ACCELERATE_CONFIGS = sorted((RECIPES_DIR / "accelerate_configs").glob("*.yaml"))


# bf16 cannot be instantiated on a CPU-only machine, nor vLLM without vLLM installed; everything else is as written.
CPU_FLAGS = {False: ["--bf16", "false"], True: ["--bf16", "false", "--use_vllm", "false"]}


def types_of(recipe: str) -> tuple:
    return SFT_TYPES if "/sft/" in recipe else RL_TYPES


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------------- base: files
def test_bases_merge_in_order_and_the_recipe_wins(tmp_path):
    write(tmp_path / "common.yaml", "seed: 1\nbf16: false\nreport_to: none\n")
    write(tmp_path / "lora.yaml", "use_peft: true\nlora_r: 8\nseed: 2\n")
    write(tmp_path / "paper.yaml", "base: common.yaml\nlearning_rate: 1.0e-6\nsemantic_beta: 0.4\n")
    recipe = write(tmp_path / "m" / "rl" / "r.yaml", "base: [../../paper.yaml, ../../lora.yaml]\nlora_r: 16\n")
    loaded = load_recipe(recipe)
    # a chain (paper -> common), a list (later bases win: seed 2), the recipe's own key last (lora_r 16)
    assert loaded.values == {
        "seed": 2,
        "bf16": False,
        "report_to": "none",
        "learning_rate": 1e-6,
        "semantic_beta": 0.4,
        "use_peft": True,
        "lora_r": 16,
    }
    assert loaded.origin["seed"].name == "lora.yaml" and loaded.origin["lora_r"] == recipe
    assert [p.name for p in loaded.files] == ["common.yaml", "paper.yaml", "lora.yaml", "r.yaml"]
    _, config, model_args, _ = parse_args_and_record(RL_TYPES, ["--config", str(recipe), "--output_dir", "x"])
    assert (config.seed, config.learning_rate, config.semantic_beta, model_args.lora_r) == (2, 1e-6, 0.4, 16)
    _, config, _, _ = parse_args_and_record(RL_TYPES, ["--config", str(recipe), "--output_dir", "x", "--seed", "5"])
    assert config.seed == 5  # the command line still wins over every file


def test_a_missing_base_names_the_file_and_who_named_it(tmp_path):
    recipe = write(tmp_path / "r.yaml", "base: nope.yaml\nseed: 1\n")
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml does not exist \(named by `base:` in .*r\.yaml\)"):
        load_recipe(recipe)
    with pytest.raises(FileNotFoundError, match="missing.yaml does not exist"):
        parse_args_and_record(RL_TYPES, ["--config", str(tmp_path / "missing.yaml")])


def test_a_cycle_of_bases_fails_with_the_chain(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\nseed: 1\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ValueError, match=r"cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_recipe(tmp_path / "a.yaml")
    write(tmp_path / "self.yaml", "base: self.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        load_recipe(tmp_path / "self.yaml")


def test_a_malformed_base_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="`base:` must be a recipe file or a list of them"):
        load_recipe(write(tmp_path / "r.yaml", "base: {a: 1}\n"))
    with pytest.raises(ValueError, match="must be a YAML mapping"):
        load_recipe(write(tmp_path / "list.yaml", "- 1\n- 2\n"))


def test_an_unknown_key_in_a_base_is_named_with_its_file(tmp_path):
    write(tmp_path / "common.yaml", "seed: 1\nsemantik_beta: 0.3\n")
    recipe = write(tmp_path / "r.yaml", "base: common.yaml\nuse_cpu: true\n")
    with pytest.raises(ValueError, match=r"semantik_beta \(set in .*common\.yaml\)"):
        parse_args_and_record(RL_TYPES, ["--config", str(recipe)])


def test_the_resolved_recipe_is_saved_and_reruns_alike(tmp_path):
    """A run records the recipe it really used (bases merged) in output_dir: rerunning that file with the same
    command line gives the same values, with no base file needed."""
    recipe = "recipes/Qwen2.5-VL-3B-Instruct/rl/config_mapo_qlora.yaml"
    argv = ["--config", recipe, "--bf16", "false", "--output_dir", str(tmp_path / "run"), "--semantic_beta", "0.2"]
    first = parse_args_and_record(RL_TYPES, argv, save_recipe=True)
    saved = tmp_path / "run" / recipes.RESOLVED_RECIPE_NAME
    text = saved.read_text()
    assert "base:" not in yaml.safe_load(text) and "--semantic_beta 0.2" in text
    assert "# from recipes/mapo_paper.yaml" in text
    assert "# from recipes/Qwen2.5-VL-3B-Instruct/rl/config_mapo_qlora.yaml" in text
    rerun = parse_args_and_record(RL_TYPES, ["--config", str(saved), *argv[2:]])
    assert [asdict(p) for p in rerun] == [asdict(p) for p in first]
    assert first[1].semantic_beta == 0.2 and first[2].load_in_4bit and first[2].lora_r == 64
    parse_args_and_record(RL_TYPES, [*argv[:5], str(tmp_path / "quiet")])
    assert not (tmp_path / "quiet").exists()  # only the entry scripts' command line writes it (save_recipe=True)


# ------------------------------------------------------------------------------------------- every real recipe
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_parses_through_its_bases(recipe, monkeypatch):
    # bf16 recipes cannot be instantiated on a CPU-only machine; everything else is parsed as written
    monkeypatch.setattr(checks, "installed_version", lambda name: checks.SUPPORTED_VLLM[1])  # a GPU extra
    parsed = parse_args_and_record(types_of(recipe), ["--config", recipe, *CPU_FLAGS[types_of(recipe) is RL_TYPES]])
    values = load_recipe(recipe).values
    model_args = next(p for p in parsed if isinstance(p, ModelConfig))
    assert model_args.model_name_or_path == values["model_name_or_path"]
    if recipe in REAL:
        tool = parsed[-1]
        assert (tool.max_pixels, tool.crop_max_pixels) == (
            1003520,
            401408,
        )  # SFT and RL agree (tests/test_recipe_layout.py)
        assert values["output_dir"].startswith("outputs/" + Path(recipe).parts[1])


def test_one_place_per_shared_value():
    """No real recipe repeats a value its base already sets: the paper's values live in mapo_paper.yaml."""
    for recipe in REAL:
        own = yaml.safe_load(Path(recipe).read_text())
        bases = own.pop("base", None)
        if bases is None:
            continue
        base_values = {}
        for base in [bases] if isinstance(bases, str) else bases:
            base_values |= load_recipe(Path(recipe).parent / base).values
        repeated = {k: v for k, v in own.items() if base_values.get(k) == v}
        assert not repeated, f"{recipe} repeats {repeated} from its bases"


def test_qwen3_vl_budgets_fit_its_32_pixel_grid():
    """Qwen3-VL's processor resizes to multiples of 16-pixel patches merged 2 x 2, so its pixel budgets are whole
    numbers of 32 x 32 tokens (980 per image, 392 per crop), as well as of Qwen2.5-VL's 28 x 28."""
    values = load_recipe("recipes/Qwen3-VL-8B-Instruct/rl/config_mapo.yaml").values
    config = transformers.AutoConfig.from_pretrained(RECIPES_DIR / "model_configs" / "Qwen3-VL-8B-Instruct")
    factor = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    assert factor == 32
    assert values["max_pixels"] % factor**2 == 0 and values["max_pixels"] // factor**2 == 980
    assert values["crop_max_pixels"] % factor**2 == 0 and values["crop_max_pixels"] // factor**2 == 392
    assert values["max_pixels"] % 28**2 == 0 and values["crop_max_pixels"] % 28**2 == 0


# ------------------------------------------------------------------------------ start-up errors (utils.checks)
def tiny_args(tiny_kit, **fields) -> ModelConfig:
    return ModelConfig(model_name_or_path=str(tiny_kit["policy"]), **fields)


def test_an_unsupported_model_family_names_the_field_and_the_families(tmp_path):
    folder = write(tmp_path / "llava" / "config.json", '{"model_type": "llava", "architectures": ["Llava"]}').parent
    with pytest.raises(ValueError) as err:
        checks.check_model(ModelConfig(model_name_or_path=str(folder)))
    message = str(err.value)
    assert message.startswith("model_name_or_path:") and "'llava'" in message
    assert "Qwen2.5-VL (model_type qwen2_5_vl)" in message and "Qwen3-VL (model_type qwen3_vl)" in message


def test_supported_families_pass_from_local_folders_and_shipped_configs(tiny_kit):
    assert checks.check_model(tiny_args(tiny_kit)).model_type == "qwen2_5_vl"
    for name in ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"):
        config = checks.check_model(ModelConfig(model_name_or_path=name))  # offline: the shipped copy
        assert config.model_type in checks.SUPPORTED_FAMILIES, name


def test_a_hub_model_with_no_shipped_config_is_not_checked_offline(caplog):
    with caplog.at_level(logging.WARNING, logger="utils.checks"):
        assert checks.check_model(ModelConfig(model_name_or_path="someorg/some-vlm")) is None
    assert "someorg/some-vlm" in caplog.text and "not checked" in caplog.text


def test_a_lora_target_the_model_lacks_names_the_field_and_the_modules_on_offer(tiny_kit):
    args = tiny_args(tiny_kit, use_peft=True, lora_target_modules=["q_proj", "qkv_projj"])
    with pytest.raises(ValueError) as err:
        checks.check_model(args)
    message = str(err.value)
    assert message.startswith("lora_target_modules:") and "['qkv_projj']" in message
    assert "'gate_proj'" in message and "'qkv'" in message  # the Linear suffixes the model does have
    checks.check_model(tiny_args(tiny_kit, use_peft=True, lora_target_modules=["q_proj", "v_proj"]))


MINI_O3_ROWS_PER_STEP = 1 * 4 * 8  # its sft_configs/qwen2.5-vl.yaml: 1 row x 4 accumulated, on one 8-GPU node


@pytest.mark.parametrize("name", [n for n in yaml.safe_load((RECIPES_DIR / "reproduce.yaml").read_text())["sets"]])
def test_every_sft_recipe_makes_mini_o3s_rows_per_step_on_its_processes(name):
    """The rows per optimizer step of each set's SFT recipe on the processes its launch uses (recipes/README.md, "SFT
    schedule"): Mini-o3's 32 for the real sets, full and LoRA alike, over its 3 epochs, its vision tower frozen."""
    launch = yaml.safe_load((RECIPES_DIR / "reproduce.yaml").read_text())["sets"][name]
    values = load_recipe(REPO / launch["sft"]).values
    rows = (
        values["per_device_train_batch_size"] * values.get("gradient_accumulation_steps", 1) * launch["num_processes"]
    )
    if name == "tiny":
        assert rows == 8 and values["max_steps"] == 600  # the offline kit's own calibration
        return
    assert (rows, values["num_train_epochs"]) == (MINI_O3_ROWS_PER_STEP, 3), name
    assert values["freeze_vision_tower"] and values["freeze_projector"], name


@pytest.mark.parametrize("recipe", [r for r in REAL if "/rl/" in r and load_recipe(r).values.get("use_peft")])
def test_every_rl_lora_recipe_samples_rollouts_without_dropout(recipe):
    """TRL generates rollouts in train mode: a LoRA recipe with `lora_dropout` must turn dropout off
    (`disable_dropout`), or sample from a noised policy (`tests/test_mapo_trainer.py` counts the live calls)."""
    values = load_recipe(recipe).values
    assert values.get("lora_dropout", 0.05) == 0 or values.get("disable_dropout") is True


@pytest.mark.parametrize("recipe", [r for r in REAL if load_recipe(r).values.get("use_peft")])
def test_every_lora_recipe_passes_the_start_up_check_on_its_architecture(recipe):
    """The RL recipes start from an SFT output that does not exist here: the check runs on the recipe's model family
    (its folder's shipped config) instead."""
    values = load_recipe(recipe).values
    lora = {k: values[k] for k in ("use_peft", "lora_r", "lora_target_modules")}
    assert checks.check_model(ModelConfig(model_name_or_path=Path(recipe).parts[1], **lora)).model_type in (
        checks.SUPPORTED_FAMILIES
    )


def test_quantization_needs_lora(tiny_kit):
    with pytest.raises(ValueError, match="load_in_4bit/load_in_8bit: .*use_peft: true"):
        checks.check_model(tiny_args(tiny_kit, load_in_4bit=True))


NOT_DISTRIBUTED = SimpleNamespace(deepspeed=None, fsdp="", report_to=[])  # the training arguments `load_policy` reads


def test_qlora_loads_through_bitsandbytes_with_the_recipes_settings(tiny_kit, monkeypatch):
    """bitsandbytes needs a GPU: the load itself is intercepted, the kwargs it would get are checked."""
    seen = {}
    monkeypatch.setattr(policy, "load_model", lambda path, **kwargs: seen.update(kwargs) or torch.nn.Module())
    values = load_recipe("recipes/Qwen2.5-VL-3B-Instruct/rl/config_mapo_qlora.yaml").values
    quant = {k: values[k] for k in ("load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant")}
    args = tiny_args(tiny_kit, dtype="bfloat16", use_peft=True, lora_target_modules=["q_proj", "v_proj"], **quant)
    policy.load_policy(args, ToolConfig(), NOT_DISTRIBUTED)
    config = seen["quantization_config"]
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.bfloat16 and seen["device_map"] == {"": 0}
    assert config.llm_int8_skip_modules == ["lm_head", "model.visual"]  # the next test reads them as transformers does
    seen.clear()
    policy.load_policy(tiny_args(tiny_kit), ToolConfig(), NOT_DISTRIBUTED)
    assert "quantization_config" not in seen and "device_map" not in seen


def test_qlora_leaves_the_vision_tower_and_the_head_unquantised():
    """Which Linear layers a 4-bit load of the 3B stores in NF4, by transformers' own rule (bitsandbytes itself needs a
    GPU): with the skip list the loader sets, every language-model Linear but none of the vision tower's, its merger's
    or the output head's, which is the set `scripts.memory` counts at 4 bits; TRL's config alone (no list) quantises
    the tower and merger too. The memory estimate pays the difference: the tower's bf16 weights (~+0.9 GiB)."""
    model = memory.build_on_meta("Qwen/Qwen2.5-VL-3B-Instruct")
    linear = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]

    def converted(skip):
        kept = HfQuantizer.get_modules_to_not_convert(model, skip, model._keep_in_fp32_modules)
        return {name for name in linear if should_convert_module(name, kept)}

    skip = policy.quantization_config(ModelConfig(model_name_or_path="m", load_in_4bit=True)).llm_int8_skip_modules
    ours, trl_alone = converted(skip), converted(None)
    assert ours == quantized_linear_modules(model)
    vision = {name for name in linear if name.startswith("model.visual.")}
    assert vision and not ours & vision and "lm_head" not in ours
    assert ours == set(linear) - vision - {"lm_head"}
    assert trl_alone == set(linear) - {"lm_head"}  # TRL's get_quantization_config: the tower in NF4 too
    kwargs = dict(trainable="lora", lora_targets=["q_proj"], load_in_4bit=True, nested_quant=True)
    kept = memory.estimate_memory(model, **kwargs)["parameters"]
    with pytest.MonkeyPatch.context() as patch:  # the estimate as it was, the tower in NF4 (TRL's config alone)
        patch.setattr(memory, "quantized_linear_modules", lambda _: trl_alone)
        quantised = memory.estimate_memory(model, **kwargs)["parameters"]
    # The tower's Linear weights at bf16's 2 bytes instead of nested NF4's; its biases and norms are bf16 either way.
    # Byte sizes are sums of multiples of powers of two below 2**53: exact in float64 but for the final / 2**30.
    tower_linear = sum(m.weight.numel() for name, m in model.named_modules() if name in vision)
    assert (kept - quantised) * memory.GIB == pytest.approx(
        tower_linear * (2 - memory.QUANT_4BIT_NESTED_BYTES), rel=1e-12, abs=0
    )
    assert 0.85 < kept - quantised < 1.0  # GiB: recipes/README.md's "+0.9 GiB"


def test_qlora_adapters_go_back_to_fp32(tiny_kit):
    """TRL casts a quantized model's adapters to bf16, which `check_master_weights` would refuse."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        transformers.AutoModelForImageTextToText.from_pretrained(tiny_kit["policy"]),
        LoraConfig(r=2, target_modules=["q_proj"]),
    )
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)  # what TRL 1.16 does for QLoRA
    assert checks.keep_adapters_in_fp32(model) == 0  # not quantized: left alone
    model.get_base_model().is_loaded_in_4bit = True
    assert checks.keep_adapters_in_fp32(model) == 2 * 2  # A and B of 2 layers
    checks.check_master_weights(model.named_parameters(), checks.DistributedType.NO)


# ------------------------------------------------------------------------------------------ accelerate configs
@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_every_accelerate_config_loads_with_known_keys(path):
    config = load_config_from_file(str(path))  # accelerate's own reader: unknown top-level keys fail here
    assert config.num_processes >= 1 and config.num_machines == 1
    launch_args = {action.dest for action in launch_command_parser()._actions}
    raw = yaml.safe_load(path.read_text())
    nested = [k for section in ("fsdp_config", "deepspeed_config") for k in raw.get(section, {})]
    # accelerate copies these onto its launch arguments without checking them: a misspelt key would be ignored
    assert not [k for k in nested if k not in launch_args], path.name


def test_fsdp2_config_resolves_to_fsdp2_with_per_layer_shards():
    """What `accelerate launch` hands the processes, as the FSDP plugin reads it (no GPU needed to check)."""
    args = launch_command_parser().parse_args(["--config_file", "recipes/accelerate_configs/fsdp2.yaml", "rl.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    fsdp_env = {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in fsdp_env.items():
            patch.setenv(key, value)
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.state_dict_type.name == "FULL_STATE_DICT" and plugin.cpu_ram_efficient_loading
    # No class names: each family's `_no_split_modules` (decoder layers, vision blocks) are wrapped.
    assert plugin.transformer_cls_names_to_wrap is None and plugin.auto_wrap_policy.__name__ == (
        "transformer_auto_wrap_policy"
    )
    for family in ("Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration"):
        assert len(getattr(transformers, family)._no_split_modules) == 2, family


# ------------------------------------------------------------------------------------- the recipes README table
def readme_rows() -> list[tuple[str, str, int | None, float | None, float]]:
    """(recipe, accelerate config, NUM_PROCESSES if given, estimated generation GiB or None, estimated training GiB)
    of each row of recipes/README.md's table."""
    rows = []
    pattern = r"RECIPE=(\S+)\s+ACCELERATE=(\w+)(?:\s+NUM_PROCESSES=(\d+))?.*\|\s*([^|]+?)\s*\|\s*([\d.]+)\s*\|\s*$"
    for line in (RECIPES_DIR / "README.md").read_text().splitlines():
        found = re.search(pattern, line)
        if found:
            generation = float(found[4]) if re.fullmatch(r"[\d.]+", found[4]) else None
            rows.append((found[1], found[2], int(found[3]) if found[3] else None, generation, float(found[5])))
    return rows


def test_the_readme_table_lists_every_real_recipe():
    assert {row[0] for row in readme_rows()} == set(REAL)


@pytest.mark.parametrize("row", readme_rows(), ids=lambda row: f"{row[0]}:{row[1]}")
def test_the_readme_table_numbers_are_memory_py_estimates(row):
    recipe, accelerate, num_gpus, generation, total = row
    estimate, _ = memory.estimate_recipe(recipe, accelerate, num_gpus)
    assert estimate["total"] == pytest.approx(total, abs=0.01)
    assert estimate.get("generation_total") == (None if generation is None else pytest.approx(generation, abs=0.01))
    if "/rl/" in recipe and generation is not None:  # every RL recipe on transformers generation fits its training
        assert estimate["generation_total"] < estimate["total"]


def test_fields_of_the_dataclasses_do_not_collide():
    """`base` names a recipe's bases, so no dataclass of an entry script may have a field called that."""
    for types in (RL_TYPES, SFT_TYPES):
        assert all(recipes.BASE_KEY not in {f.name for f in fields(t)} for t in types)


# ------------------------------------------------------------------------------------------------------- Makefile
def make_dry_run(*args: str) -> str:
    """The command `make` would run last for `args` (prerequisites, if out of date, print before it)."""
    # Run as a top-level make: under `make test` the inherited MAKELEVEL/MAKEFLAGS make it print "Leaving directory".
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    command = ["make", "--no-print-directory", "-n", *args]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True, env=env).stdout
    return out.strip().splitlines()[-1]


@pytest.mark.process
@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_keeps_offline_to_the_tiny_kit_and_forwards_multi_node_flags():
    assert make_dry_run("rl").startswith("HF_HUB_OFFLINE=1 ")  # the tiny recipe
    assert make_dry_run("eval").startswith("HF_HUB_OFFLINE=1 ")  # the tiny model and CLIP
    real = make_dry_run("rl", "RECIPE=recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo.yaml", "ACCELERATE=zero3")
    assert "OFFLINE" not in real and "--num_machines" not in real  # a real recipe reaches the hub
    assert "OFFLINE" not in make_dry_run("eval", "MODEL=outputs/Qwen2.5-VL-7B-Instruct-MAPO", "CLIP=ViT-L-14")
    nodes = ["NUM_MACHINES=2", "NUM_PROCESSES=16", "MACHINE_RANK=1", "MAIN_PROCESS_IP=10.0.0.1"]
    sft = make_dry_run(
        "sft", "SFT_RECIPE=recipes/Qwen3-VL-8B-Instruct/sft/config_sft.yaml", "ACCELERATE=zero3", *nodes
    )
    assert "--num_processes 16 --num_machines 2 --machine_rank 1 --main_process_ip 10.0.0.1" in sft
    assert sft.endswith("sft.py --config recipes/Qwen3-VL-8B-Instruct/sft/config_sft.yaml")


@pytest.mark.process
@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_builds_the_tiny_kit_for_tiny_recipes_only():
    def builds_kit(*args: str) -> bool:
        env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
        command = ["make", "--no-print-directory", "-n", "-B", *args]  # -B: as on a fresh clone, nothing built yet
        out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True, env=env).stdout
        return "scripts.build_tiny_kit" in out

    assert builds_kit("rl") and builds_kit("sft") and builds_kit("eval")  # the tiny recipes and model
    assert not builds_kit("rl", "RECIPE=recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo.yaml", "ACCELERATE=zero3")
    assert not builds_kit("sft", "SFT_RECIPE=recipes/Qwen2.5-VL-3B-Instruct/sft/config_sft_lora.yaml")
    assert not builds_kit("eval", "MODEL=outputs/Qwen2.5-VL-7B-Instruct-MAPO", "CLIP=ViT-L-14")


def test_flag_values_types_a_command_line_as_the_recipe_parser_reads_it():
    flags = ["--learning_rate", "2e-6", "--use_vllm", "true", "--dataset_path", "a.parquet", "b.parquet",
             "--report_to=none", "--bf16", "--max_steps", "3"]  # fmt: skip
    assert flag_values(flags) == {
        "learning_rate": 2e-6, "use_vllm": True, "dataset_path": ["a.parquet", "b.parquet"], "report_to": "none",
        "bf16": True, "max_steps": 3,
    }  # fmt: skip


@pytest.mark.parametrize("recipe", [r for r in REAL if "/model_configs/" not in r])
def test_every_real_recipe_keeps_two_checkpoints_to_resume_from(recipe):
    """A run of hours saves checkpoints and keeps at least 2: the trainer deletes old ones after a save completes,
    so a save killed half-way leaves the one before it, which resume takes (repairs.resume.last_complete_checkpoint)."""
    values = load_recipe(REPO / recipe).values
    assert values["save_strategy"] == "steps" and values["save_total_limit"] >= 2, recipe
