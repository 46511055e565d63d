# Thinking-with-images agents trained with MAPO. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
TINY        := outputs/tiny
ACCELERATE  ?= cpu
RECIPE      ?= recipes/tiny/rl/config_mapo.yaml
SFT_RECIPE  ?= recipes/tiny/sft/config_sft.yaml
ARGS        ?=
MODEL       ?= $(TINY)/qwen2_5_vl
BENCH       ?= synthetic
DATA        ?=
CLIP        ?= $(TINY)/clip
LAUNCH      := $(VENV)/bin/accelerate launch --config_file recipes/accelerate_configs/$(ACCELERATE).yaml
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRL_EXPERIMENTAL_SILENCE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: help install tiny demo sft rl eval clip test lint bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch and torchvision come from files on these machines; PyPI's torchvision does not import beside 2.13 CPU.
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the pinned stack (CPU; GPU extras: requirements-gpu.txt)

$(TINY)/.built: $(STAMP) tiny_models.py task.py
	$(PY) tiny_models.py --output_dir $(TINY)
	touch $@

tiny: $(TINY)/.built ## Build the tiny offline models (Qwen2.5-VL, tokenizer, CLIP, text encoder) into outputs/tiny

demo: tiny ## The main job on tiny models, CPU: train CLIP verifier, SFT, MAPO RL, evaluate before/after (outputs/demo)
	$(PY) demo.py $(ARGS)

sft: tiny ## SFT cold start: SFT_RECIPE=<recipe.yaml> ACCELERATE=<cpu|single_gpu|ddp|zero2|zero3> ARGS="--field value ..."
	$(LAUNCH) sft.py --config $(SFT_RECIPE) $(ARGS)

rl: tiny ## MAPO RL: RECIPE=<recipe.yaml> ACCELERATE=<cpu|single_gpu|ddp|zero2|zero3> ARGS="--field value ..."
	$(LAUNCH) rl.py --config $(RECIPE) $(ARGS)

eval: tiny ## Score MODEL on BENCH (vstar|hrbench|mme_realworld|synthetic); DATA: its files (empty: generated synthetic test split); ARGS="--limit 20"
	$(PY) evaluate.py --model_name_or_path $(MODEL) --benchmark $(BENCH) $(if $(DATA),--data_path $(DATA)) --clip_model $(CLIP) $(ARGS)

clip: $(TINY)/clip_trained/training_metrics.json ## Train the tiny CLIP verifier on synthetic crops (~1 min CPU)

$(TINY)/clip_trained/training_metrics.json: $(TINY)/.built clip_training.py data/synthetic.py
	$(PY) clip_training.py --output_dir $(TINY)/clip_trained --steps 300

test: $(STAMP) ## Run the offline test suite (builds the tiny models it needs)
	$(PY) -m pytest -q tests

lint: $(STAMP) ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: tiny ## Benchmarks: MAPO/GRPO step-time ratio, CLIP crops/s (results: docs/benchmarks.md)
	$(PY) bench.py $(ARGS)

clean: ## Remove outputs/ (checkpoints, tiny models, generated data)
	rm -rf outputs
