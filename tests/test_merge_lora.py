"""`python -m scripts.merge_lora`: a LoRA adapter merged into its base computes what the adapter on the base computes,
and the merged folder holds what RL and evaluation read (processor, tool record)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoProcessor

from scripts import merge_lora
from tests.tolerance import TINY_POLICY_FORWARD, assert_close, tolerance, transformer_terms
from tools import read_record, write_record
from utils.models import load_model, load_processor


@pytest.fixture(scope="module")
def adapter(tiny_kit, tmp_path_factory):
    """A LoRA adapter on the tiny policy with random (non-zero) B, saved as sft.py saves one."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("sft-lora")
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(load_model(str(tiny_kit["policy"]), dtype=torch.float32), config)
    peft_model.save_pretrained(folder)
    load_processor(tiny_kit["policy"]).save_pretrained(folder)
    write_record(folder, {"max_label_words": 5})
    return folder, peft_model.eval()


def test_the_merged_model_computes_what_the_adapter_does(adapter, tiny_kit, tmp_path):
    folder, peft_model = adapter
    out = tmp_path / "merged"
    merge_lora.main(["--adapter", str(folder), "--output_dir", str(out), "--dtype", "float32"])
    merged = load_model(str(out), dtype=torch.float32).eval()
    base = load_model(str(tiny_kit["policy"]), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        expected, got, unmerged = (m(input_ids=ids).logits for m in (peft_model, merged, base))
    # W + BA merged (rank 4) against x W + (x A) B: another association of the same float32 sums, then the same
    # forward over 6 tokens, at the logits' size.
    terms, size = transformer_terms(64, 128, 2, 6, 1088) + 4, float(expected.abs().max())
    assert_close(got, expected, terms=terms, scale=size)
    # the adapter changed something, so the check above can fail
    assert float((got - unmerged).abs().max()) > tolerance(terms=terms, scale=size)["abs"]
    assert read_record(out)["tool"]["max_label_words"] == 5
    assert AutoProcessor.from_pretrained(out).chat_template == AutoProcessor.from_pretrained(folder).chat_template


def test_bad_folders_are_named(adapter, tmp_path):
    folder, _ = adapter
    with pytest.raises(FileNotFoundError, match=f"--adapter {tmp_path}: no adapter_config.json"):
        merge_lora.merge_lora(tmp_path, tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="already holds a model"):
        merge_lora.merge_lora(folder, tmp_path / "full")
    assert not (tmp_path / "out").exists()


def test_a_relative_base_is_read_against_the_adapters_run_not_the_working_directory(
    adapter, tiny_kit, tmp_path, monkeypatch
):
    """An RL LoRA run started in `run/` from `outputs/sft` saves an adapter naming that relative base. Merged from
    another folder that happens to hold an `outputs/sft` of its own (here the tiny Qwen3-VL), the merge takes the run's
    base: the merged model computes what the adapter does. Without a record of the run, the lookalike is refused."""
    folder, peft_model = adapter
    run = tmp_path / "run"
    shutil.copytree(tiny_kit["policy"], run / "outputs" / "sft")
    shutil.copytree(folder, run / "outputs" / "rl-lora")
    adapter_config = run / "outputs" / "rl-lora" / "adapter_config.json"
    config = json.loads(adapter_config.read_text())
    adapter_config.write_text(json.dumps(config | {"base_model_name_or_path": "outputs/sft"}))
    (run / "outputs" / "rl-lora" / "recipe.yaml").write_text(
        "# Command line: rl.py --config recipes/x.yaml --output_dir outputs/rl-lora\noutput_dir: outputs/elsewhere\n"
    )
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tiny_kit["qwen3_vl"], elsewhere / "outputs" / "sft")  # a lookalike base in the working directory
    monkeypatch.chdir(elsewhere)
    assert merge_lora.run_root(run / "outputs" / "rl-lora") == run.resolve()
    merge_lora.main(
        ["--adapter", str(run / "outputs" / "rl-lora"), "--output_dir", str(tmp_path / "m"), "--dtype", "float32"]
    )
    merged = load_model(str(tmp_path / "m"), dtype=torch.float32).eval()
    assert merged.config.model_type == "qwen2_5_vl"
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        # the merged weight W + BA against W x + B(A x): one forward of the tiny policy in float32
        assert_close(
            merged(input_ids=ids).logits, peft_model(input_ids=ids).logits, terms=TINY_POLICY_FORWARD, scale=1.0
        )
    (run / "outputs" / "rl-lora" / "recipe.yaml").unlink()
    with pytest.raises(FileNotFoundError, match="relative path not found.*give --base"):
        merge_lora.merge_lora(run / "outputs" / "rl-lora", tmp_path / "m2")
