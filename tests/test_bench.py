"""`bench.py`'s paired GRPO/MAPO step benchmark, on CPU with a small tiny shape: the code path `--shape 7b` runs on a
GPU (random-weight policy built from a config, one policy shared by both trainers, alternating steps on the same
batches, verifier timing), only smaller. The 7B architecture itself is checked on the meta device."""

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from data import convert
from scripts import bench
from tools import ToolConfig

REPO = Path(__file__).resolve().parents[1]


def test_paired_step_time_on_the_tiny_shape(tiny_kit, tmp_path, monkeypatch):
    """`make bench`'s command line, shrunk: 2 rollouts, 112 new tokens per turn, one timed pair, the tiny CLIP."""
    monkeypatch.chdir(REPO)  # bench.py reads the kit from outputs/tiny, as `make bench` runs it
    argv = [
        "--batch",
        "2",
        "--num_generations",
        "2",
        "--max_completion_length",
        "112",
        "--pairs",
        "1",
        "--warmup",
        "0",
    ]
    output = tmp_path / "bench.json"
    argv += ["--hpo_sizes", "4", "16", "--hpo_steps", "1", "--rollouts", "0", "--convert_rows"]  # vLLM's: test_vllm
    results = bench.main([*argv, "--clip_models", str(tiny_kit["clip"]), "--clip_crops", "2", "--output", str(output)])
    assert json.loads(output.read_text()) == results
    step = results["step_time"]
    assert step["settings"]["batch"] == 2 and step["settings"]["max_completion_length"] == 112
    assert len(step["step_s"]["grpo"]) == len(step["step_s"]["mapo"]) == 1
    assert step["ratio_mapo_over_grpo"] > 0
    assert step["crops_scored_per_mapo_step"] == [2]  # forced calls: every rollout's crop is scored
    assert 0 < step["verifier_share_of_mapo_step"] < 1 and len(step["semantic_reward_s"]) == 1
    hpo = results["hpo"]
    assert [p["n"] for p in hpo["potentials"]] == [4, 16] and all(p["seconds"] > 0 for p in hpo["potentials"])
    tiny = hpo["tiny_step"]
    assert 0 < tiny["text_encoder_share_of_step"] < tiny["hpo_share_of_step"] < 1
    assert tiny["groups_transported"] == 1.0  # HPO's path really ran: no group fell back
    assert results["clip_throughput"][str(tiny_kit["clip"])]["crops_per_s"] > 0


def test_7b_shape_is_qwen2_5_vl_7b_with_the_kit_token_ids(tiny_kit):
    kit = {k: str(v) for k, v in tiny_kit.items()}
    config = bench.policy_config(bench.SHAPES["7b"], kit)
    kit_config = bench.policy_config(bench.SHAPES["tiny"], kit)
    text = config.get_text_config()
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (3584, 28, 152064)
    assert config.vision_config.depth == 32
    assert all(getattr(config, key) == getattr(kit_config, key) for key in bench.TOKEN_IDS)
    assert text.eos_token_id == kit_config.get_text_config().eos_token_id
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 8_292_166_656  # recipes/model_configs/README.md


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_7b_shape_needs_a_gpu(tiny_kit):
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.bench_step_time({k: str(v) for k, v in tiny_kit.items()}, "7b", pairs=1)


def test_the_converter_benchmark_writes_a_release_the_converter_reads_whole(tmp_path):
    """`make bench`'s converter memory figures are only worth reading if every row of its release converts."""
    release = bench.write_coldstart_release(tmp_path / "release", 3, size=(800, 600))
    trajectories, stats = convert.convert("mini_o3_coldstart", release, ToolConfig())
    assert stats["rows_read"] == stats["rows_converted"] == 3 and len({t.image_bytes for t in trajectories}) == 3


@pytest.mark.process
def test_peak_memory_sees_what_a_process_holds():
    peak, seconds, out = bench.peak_memory(
        [sys.executable, "-c", "import time; x = b'x' * 200_000_000; print('held'); time.sleep(0.5)"]
    )
    assert out == "held\n" and seconds > 0
    assert peak["RssAnon"] >= 190 and peak["VmRSS"] >= peak["RssAnon"]  # MB: the 200 MB array, sampled live
