#!/usr/bin/env bash
# One prepared GPU check (issue 11, item 10), for a machine with ONE CUDA GPU, this repo and the GPU extras
# (requirements.txt + requirements-gpu.txt; torch with CUDA). Run from the repo root:
#
#   OUT=gpu-out bash scripts/gpu_check.sh          # ~6-8 min on one H200; BUDGET=<s> caps the whole run
#
# Stages, each under its own time limit so one hang cannot eat the budget (a stage that would start with less than
# 30 s of the budget left is skipped and reported as such):
#   bench7b  scripts/bench.py --shape 7b: GRPO and MAPO steps alternated on ONE random-weight Qwen2.5-VL-7B policy (bf16)
#            and the same batches; median step times, their ratio, the verifier's share of a MAPO step, peak memory;
#            CLIP throughput (ViT-B-32, ViT-L-14, fp16)
#   zero2, zero3, fsdp2
#            the tiny MAPO recipe (recipes/tiny/rl/config_mapo.yaml) through rl.py with forced tool calls
#            (scripts/rl_forced.py), `accelerate launch --num_processes 1` with
#            recipes/accelerate_configs/<stage>.yaml:
#            per-step wall time and peak GPU memory (torch.cuda.max_memory_allocated), and whether R_sem was computed
# Then scripts/gpu_check_summary.py writes $OUT/gpu_check.md (the section for docs/benchmarks.md) and
# $OUT/gpu_check.json. Logs: $OUT/<stage>.log.
#
# Packages the machine lacks can come as wheels in .whl/ (cp312, as on this workplace's GPU machines): they are
# installed into /tmp/site first and put on PYTHONPATH.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET=${BUDGET:-470}   # seconds for the whole check; the summary needs a few more
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
export TOKENIZERS_PARALLELISM=false
T0=$SECONDS
: > "$OUT/stages.tsv"

if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | tail -2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, transformers, trl, accelerate, open_clip, peft; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'trl', trl.__version__, 'accelerate', accelerate.__version__, \
'open_clip', open_clip.__version__, 'peft', peft.__version__)"
  $PY -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# stage NAME LIMIT_S COMMAND...: run under min(LIMIT_S, budget left), log to $OUT/NAME.log, record rc and seconds.
stage() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - (SECONDS - T0)))
  ((limit > left)) && limit=$left
  if ((limit < 30)); then
    echo "=== $name skipped: ${left}s of the budget left"
    printf '%s\t%s\t%s\n' "$name" 200 0 >> "$OUT/stages.tsv"
    return 200
  fi
  echo "=== $name (limit ${limit}s) at $((SECONDS - T0))s"
  local t=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - t)) >> "$OUT/stages.tsv"
  echo "=== $name rc=$rc in $((SECONDS - t))s"
  grep -aE "RL_FORCED|ratio_mapo|verifier_share|Error|error:" "$OUT/$name.log" | grep -v Warning | tail -5 |
    cut -c1-400
  return $rc
}

if [[ ! -e outputs/tiny/.built ]]; then
  stage tiny_kit 90 $PY -m scripts.build_tiny_kit --output_dir outputs/tiny && touch outputs/tiny/.built
fi

# 128 new tokens per turn keeps the 7B stage near 3 min (generation dominates a step); 2 timed pairs after 1 warm-up.
stage bench7b 210 $PY -m scripts.bench --shape 7b --pairs 2 --warmup 1 --max_completion_length 128 \
  --clip_models ViT-B-32 ViT-L-14 --clip_crops 64 --output "$OUT/bench7b.json"

TINY=(--config recipes/tiny/rl/config_mapo.yaml --model_name_or_path outputs/tiny/qwen2_5_vl --use_cpu false
      --bf16 true --max_steps 3 --save_strategy no --report_to none)
for config in zero2 zero3 fsdp2; do
  export GPU_CHECK_JSON="$OUT/$config.json"   # where rl_forced.py writes its summary
  stage "$config" 80 \
    $PY -m accelerate.commands.launch --num_processes 1 --config_file "recipes/accelerate_configs/$config.yaml" \
    -m scripts.rl_forced "${TINY[@]}" --output_dir "/tmp/gpu-check-$config"
done

$PY -m scripts.gpu_check_summary "$OUT"
echo "=== total $((SECONDS - T0))s"
