"""The recipe layout: a recipe reads in at most two files, itself and one flat base. The RL recipes name
recipes/mapo_paper.yaml (the paper's MAPO values); the SFT recipes and the tiny ones are flat. So a value several
recipes must share (the pixel budgets SFT and RL agree on, precision, the LoRA block) is written in each of them, and
these tests keep the copies equal."""

import json
import os
from pathlib import Path

import pytest
import yaml

from tools import ToolConfig
from tools.config import FAMILY_TOOL_SETTINGS
from utils.recipes import load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO / "recipes"
# Launchable recipes: recipes/<Model or tiny>/<stage>/config_<variant>.yaml; every other YAML outside
# accelerate_configs/ is a base file, but reproduce.yaml (make reproduce's recipe sets, no recipe).
RECIPES = sorted(RECIPES_DIR.glob("**/config_*.yaml"))
REAL = [r for r in RECIPES if r.relative_to(RECIPES_DIR).parts[0].startswith("Qwen")]
TINY = [r for r in RECIPES if r.relative_to(RECIPES_DIR).parts[0] == "tiny"]
BASES = sorted(
    p
    for p in RECIPES_DIR.glob("**/*.yaml")
    if not p.name.startswith("config_")
    and "accelerate_configs" not in p.relative_to(RECIPES_DIR).parts
    and p.name != "reproduce.yaml"
)
# What SFT and RL must agree on: SFT writes its gold boxes in the frame max_pixels (and min_pixels) gives, RL's
# bbox_2d lives in it, crops cost crop_max_pixels tokens in both, and both limit the label the same way.
TOOL_KEYS = ("max_pixels", "min_pixels", "crop_max_pixels", "max_label_words")
# And the crops' floor, set by every real recipe; the tiny SFT recipe sets it, its RL recipes take its record.
REAL_TOOL_KEYS = (*TOOL_KEYS, "crop_min_pixels")
LORA_KEYS = ("use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def named_bases(recipe: Path) -> list:
    """The `base:` entries of a recipe as written (a string or a list of them), read with yaml directly."""
    base = (yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}).get("base")
    return [] if base is None else [base] if isinstance(base, str) else base


def disagreements(recipes: list[Path], keys: tuple[str, ...]) -> dict:
    """For each key the recipes do not all give the same merged value: {key: {value: [recipes]}}."""
    values = {r: load_recipe(r).values for r in recipes}
    found = {}
    for key in keys:
        by_value = {}
        for recipe, merged in values.items():
            by_value.setdefault(repr(merged.get(key)), []).append(rel(recipe))
        if len(by_value) > 1:
            found[key] = by_value
    return found


def test_the_recipe_lists_are_not_empty():
    assert REAL and TINY and BASES
    assert {r.parent.name for r in REAL} == {"sft", "rl"} and {r.parent.name for r in TINY} == {"sft", "rl"}


# ------------------------------------------------------------------------------------ at most two files a recipe
@pytest.mark.parametrize("recipe", RECIPES, ids=rel)
def test_a_recipe_names_at_most_one_base_and_that_base_is_flat(recipe):
    bases = named_bases(recipe)
    assert len(bases) <= 1, f"{rel(recipe)} names {len(bases)} bases {bases}: at most one"
    for base in bases:
        assert isinstance(base, str), f"{rel(recipe)}: `base:` must name a file, got {base!r}"
        path = Path(os.path.normpath(recipe.parent / base))
        assert path.is_file(), f"{rel(recipe)} names base {base}, which does not exist"
        assert not named_bases(path), f"{rel(recipe)}'s base {base} names a base itself: bases must be flat"


def test_every_base_file_is_named_by_a_recipe():
    named = {Path(os.path.normpath(r.parent / b)).resolve() for r in RECIPES for b in named_bases(r)}
    orphans = [rel(b) for b in BASES if b.resolve() not in named]
    assert not orphans, f"base files no recipe names (delete them or name them): {orphans}"


# ------------------------------------------------------------------------------- values written in several files
def test_every_real_recipe_sets_the_same_pixel_budgets_and_label_limit():
    """Every real SFT and RL recipe, every model: the same max_pixels, crop_max_pixels, crop_min_pixels,
    max_label_words and (where any sets it) min_pixels, each set explicitly."""
    assert not disagreements(REAL, REAL_TOOL_KEYS)
    for recipe in REAL:
        values = load_recipe(recipe).values
        unset = [
            k for k in ("max_pixels", "crop_max_pixels", "crop_min_pixels", "max_label_words") if values.get(k) is None
        ]
        assert not unset, f"{rel(recipe)} does not set {unset}"


def test_the_tiny_sft_and_rl_recipes_agree_on_the_pixel_budgets_and_label_limit():
    """The tiny recipes set none of them today (the RL run takes the SFT checkpoint's tool_config.json); a key set in
    one must be set alike in the other."""
    assert not disagreements(TINY, TOOL_KEYS)


@pytest.mark.parametrize("model", sorted({r.relative_to(RECIPES_DIR).parts[0] for r in REAL}))
def test_a_models_recipes_speak_its_own_box_convention(model):
    """SFT writes gold boxes in the convention RL and evaluation read them in, so a model's recipes agree on it and on
    the tool's arguments, and they are the model's own (`tools.config.FAMILY_TOOL_SETTINGS`, by the model_type of its
    shipped config): the released model's boxes land where it means them, and its `img_idx` is understood."""
    recipes = [r for r in REAL if r.relative_to(RECIPES_DIR).parts[0] == model]
    model_type = json.loads((RECIPES_DIR / "model_configs" / model / "config.json").read_text())["model_type"]
    defaults = ToolConfig()
    for recipe in recipes:
        values = load_recipe(recipe).values
        for name, own in FAMILY_TOOL_SETTINGS[model_type].items():
            assert values.get(name, getattr(defaults, name)) == own, (rel(recipe), name)


def test_every_real_recipe_sets_the_same_precision_attention_and_seed():
    assert not disagreements(REAL, ("dtype", "attn_implementation", "seed"))


def test_every_real_lora_recipe_has_the_same_adapters():
    """The same adapters everywhere, but their targets, which a hybrid's layers need more of: every Qwen3.5 recipe
    names its Gated DeltaNet projections beside the attention's (`utils.lora.check_hybrid_layers`), and each family's
    LoRA recipes name the same list."""
    lora = [r for r in REAL if load_recipe(r).values.get("use_peft")]
    assert len(lora) >= 2 and not disagreements(lora, tuple(k for k in LORA_KEYS if k != "lora_target_modules"))
    by_family = {}
    for recipe in lora:
        model = recipe.relative_to(RECIPES_DIR).parts[0]
        model_type = json.loads((RECIPES_DIR / "model_configs" / model / "config.json").read_text())["model_type"]
        by_family.setdefault(model_type.startswith("qwen3_5"), []).append(recipe)
    for recipes in by_family.values():
        assert not disagreements(recipes, ("lora_target_modules",))
    hybrid = load_recipe(by_family[True][0]).values["lora_target_modules"]
    assert set(load_recipe(by_family[False][0]).values["lora_target_modules"]) < set(hybrid)


@pytest.mark.parametrize(
    ("first", "second", "differ"),
    [
        (
            "Qwen2.5-VL-7B-Instruct/sft/config_sft.yaml",
            "Qwen3-VL-8B-Instruct/sft/config_sft.yaml",
            ("box_convention", "accept_img_idx"),
        ),
        (
            "Qwen2.5-VL-7B-Instruct/sft/config_sft.yaml",
            "Qwen2.5-VL-7B-Instruct/sft/config_sft_lora.yaml",
            ("learning_rate", "gradient_accumulation_steps", *LORA_KEYS),  # the same 32 rows a step on 1 GPU, not 8
        ),
        ("Qwen2.5-VL-7B-Instruct/sft/config_sft_lora.yaml", "Qwen2.5-VL-3B-Instruct/sft/config_sft_lora.yaml", ()),
        ("Qwen3-VL-8B-Instruct/sft/config_sft.yaml", "Qwen3.5-9B/sft/config_sft.yaml", ()),
        ("Qwen3-VL-8B-Instruct/rl/config_mapo.yaml", "Qwen3.5-9B/rl/config_mapo.yaml", ()),
        (
            "Qwen2.5-VL-3B-Instruct/sft/config_sft_lora.yaml",
            "Qwen3.5-4B/sft/config_sft_lora.yaml",
            ("box_convention", "accept_img_idx", "lora_target_modules"),  # Qwen3.5's frame, its hybrid layers
        ),
        (
            "Qwen2.5-VL-3B-Instruct/rl/config_mapo_lora.yaml",
            "Qwen3.5-4B/rl/config_mapo_lora.yaml",
            ("box_convention", "accept_img_idx", "lora_target_modules"),
        ),
        ("Qwen2.5-VL-7B-Instruct/rl/config_mapo_lora.yaml", "Qwen2.5-VL-3B-Instruct/rl/config_mapo_lora.yaml", ()),
        (
            "Qwen2.5-VL-3B-Instruct/rl/config_mapo_lora.yaml",
            "Qwen2.5-VL-3B-Instruct/rl/config_mapo_qlora.yaml",
            ("load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant"),
        ),
    ],
)
def test_sibling_recipes_differ_only_where_their_headers_say(first, second, differ):
    """Recipes that once shared a base file (sft.yaml, sft_lora.yaml, mapo_lora.yaml) and now repeat its values:
    besides the model and output folder, they differ only in `differ`."""
    a, b = (load_recipe(RECIPES_DIR / r).values for r in (first, second))
    allowed = {"model_name_or_path", "output_dir", *differ}
    different = sorted(k for k in a.keys() | b.keys() if k not in allowed and a.get(k) != b.get(k))
    assert not different, f"{first} and {second} differ in {different}"
