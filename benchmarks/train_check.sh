#!/usr/bin/env bash
# Issue 12 on one machine, as one command: the held-out tasks sampled from the starting model,
# SFT, held-out again, GRPO for TRAIN_GRPO_SECONDS, held-out again; then the metrics, the reward
# curve and a summary with the step-time split (benchmarks/bench_train.py). Local Ray, the local
# evaluator (this machine's sandbox), one Ray Train worker on the GPU when there is one.
#
#   bash benchmarks/train_check.sh                         # cuda family on this GPU
#   TRAIN_FAMILY=cpp TRAIN_DEVICE=cpu TRAIN_GRPO_SECONDS=30 bash benchmarks/train_check.sh   # a CPU dry run
#
# Everything goes to $OUT/train (default OUT=/tmp/gpu_check): config.yaml, *.log, heldout-*.json,
# metrics-{sft,grpo}.jsonl, reward_curve.png, summary.{md,json}. Each step has its own time limit
# (`timeout`), so the whole check ends within about
#   3 x TRAIN_HELDOUT_TIMEOUT + TRAIN_SFT_TIMEOUT + TRAIN_GRPO_SECONDS + TRAIN_GRPO_GRACE
# seconds (defaults: 3 x 60 + 240 + 180 + 90 = 690; about 8 minutes when SFT's two source builds and
# the samples' builds are cold), and a step that fails or
# runs out of time is named in the summary while the later steps still run where they can.
# Knobs (environment):
#   TRAIN_FAMILY (cuda)  TRAIN_DEVICE (cuda if torch sees a GPU, else cpu)  TRAIN_MODEL ("" = SmolLM2-135M)
#   TRAIN_TASKS, TRAIN_HELDOUT_TASKS (comma-separated task ids; defaults below)
#   TRAIN_SFT_STEPS (30)  TRAIN_GRPO_SECONDS (180)  TRAIN_GENERATIONS (4)  TRAIN_MAX_NEW_TOKENS (384)
#   TRAIN_HELDOUT_SAMPLES (4 per held-out task; 0 skips the held-out checks)
#   TRAIN_HELDOUT_TIMEOUT (60)  TRAIN_SFT_TIMEOUT (240)  TRAIN_GRPO_GRACE (90: the step in flight at the limit)
#   TRAIN_EVALUATION (local | service)  TRAIN_RUN (run name, default train-check)
#   TRAIN_BUILD_WORKERS (half the cores, at most 8: a step's builds overlap, the runs that time go one by one)
#   TRAIN_PHASES ("before sft grpo after summary"): the phases to run. A machine whose commands have a
#     time limit runs them over several calls, e.g. "before sft", then "grpo", then "after summary";
#     the run's store, logs and step times stay in $OUT/train between them. The before phase starts
#     a fresh run; so does the sft phase without it (keeping the "before" figures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
dir=$OUT/train
mkdir -p "$dir"
family=${TRAIN_FAMILY:-cuda}
device=${TRAIN_DEVICE:-$($PY -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)}
tasks=${TRAIN_TASKS:-$family/add_relu_scale,$family/silu_scale}
heldout=${TRAIN_HELDOUT_TASKS:-$family/sum_squares}
samples=${TRAIN_HELDOUT_SAMPLES:-4}
grpo_s=${TRAIN_GRPO_SECONDS:-180}
run=${TRAIN_RUN:-train-check}
use_gpu=false
[ "${device%%:*}" = cuda ] && use_gpu=true
cpus=$(( $(nproc) > 4 ? 4 : 1 ))  # torch threads of the Ray Train worker (the rest: builds and sandboxes)
builders=${TRAIN_BUILD_WORKERS:-$(( $(nproc) / 2 > 8 ? 8 : $(nproc) / 2 ))}
yaml_list() { echo "[$(echo "$1" | sed 's/[^,][^,]*/"&"/g; s/,/, /g')]"; }

phases=" ${TRAIN_PHASES:-before sft grpo after summary} "
phase() { [[ $phases == *" $1 "* ]]; }
if phase before; then  # a fresh run (the build cache in SPEEDFORGE_CACHE is kept)
  rm -rf "$dir/store" "$dir/work" "$dir/times.txt" "$dir/failed.txt" "$dir"/heldout-*.json "$dir"/*.log
elif phase sft; then
  rm -rf "$dir/store" "$dir/work" "$dir/heldout-sft.json" "$dir/heldout-grpo.json" "$dir/sft.log" "$dir/grpo.log"
fi
cat >"$dir/config.yaml" <<EOF
policy:
  model: "${TRAIN_MODEL:-}"
  device: $device
  max_new_tokens: ${TRAIN_MAX_NEW_TOKENS:-384}
train:
  run: $run
  store: $dir/store
  work_dir: $dir/work
  family: $family
  tasks_uri: builtin:$family
  tasks: $(yaml_list "$tasks,$heldout")
  heldout: $(yaml_list "$heldout")
  train_count: 0
  evaluation: ${TRAIN_EVALUATION:-local}
  max_stage_s: 0
  build_workers: $builders
  eval_retries: 1
  ray: {workers: 1, use_gpu: $use_gpu, cpus_per_worker: $cpus}
  sft: {sources: [builtin], steps: ${TRAIN_SFT_STEPS:-30}, learning_rate: 5.0e-5, exemplars: 0, save_every: 10}
  grpo: {steps: 100000, prompts_per_step: 1, generations: ${TRAIN_GENERATIONS:-4}, max_new_tokens: ${TRAIN_MAX_NEW_TOKENS:-384}, learning_rate: 1.0e-6, save_every: 5}
EOF
# GRPO: the same run with a time limit (the step in flight at the limit is its last)
sed "s/^  max_stage_s: 0$/  max_stage_s: $grpo_s/" "$dir/config.yaml" >"$dir/config-grpo.yaml"
sf=($PY -m speedforge.cli --config "$dir/config.yaml")  # arrays: `timeout` runs commands, not functions
sf_grpo=($PY -m speedforge.cli --config "$dir/config-grpo.yaml")
touch "$dir/times.txt" "$dir/failed.txt"  # step times and failures of every phase, over several calls
step() {  # step NAME SECONDS COMMAND...: run it with its own time limit, log to NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=15 "$limit" "$@" >"$dir/$name.log" 2>&1
  local rc=$?
  echo "   $name: exit $rc after $(( SECONDS - t0 )) s"
  echo "$name $(( SECONDS - t0 ))s" >>"$dir/times.txt"
  [ $rc -eq 0 ] || { echo "$name (exit $rc$([ $rc -eq 124 ] && echo ', time limit'))" >>"$dir/failed.txt"; tail -n 5 "$dir/$name.log"; }
  return $rc
}
heldout_check() {  # heldout_check LABEL [MODEL]
  [ "$samples" -gt 0 ] || return 0
  step "heldout-$1" "${TRAIN_HELDOUT_TIMEOUT:-60}" "${sf[@]}" train heldout --samples "$samples" --json ${2:+--model "$2"} \
    && sed -n '/^{/,$p' "$dir/heldout-$1.log" >"$dir/heldout-$1.json"
}
final() { sed -n 's/^ *"final_checkpoint": "\(.*\)",*$/\1/p' "$dir/$1.log" | head -1; }

if phase before; then heldout_check before; fi
if phase sft; then
  step sft "${TRAIN_SFT_TIMEOUT:-240}" "${sf[@]}" train --stage sft --json
  sft_model=$(final sft)
  [ -n "$sft_model" ] && heldout_check sft "$sft_model"
fi
if phase grpo; then step grpo $(( grpo_s + ${TRAIN_GRPO_GRACE:-90} )) "${sf_grpo[@]}" train --stage grpo --json; fi
if phase after; then
  grpo_model=$([ -f "$dir/grpo.log" ] && final grpo)
  [ -n "$grpo_model" ] && heldout_check grpo "$grpo_model"
fi
phase summary || exit 0
for stage in sft grpo; do
  [ -f "$dir/work/$run/$stage/metrics.jsonl" ] && cp "$dir/work/$run/$stage/metrics.jsonl" "$dir/metrics-$stage.jsonl"
done
steps_taken=$(paste -sd' ' "$dir/times.txt")
failures=$(paste -sd' ' "$dir/failed.txt")
note="family $family, device $device, $(nproc) cores, steps: $steps_taken"
[ -n "$failures" ] && note="$note; failed: $failures"
args=()
for label in before sft grpo; do [ -f "$dir/heldout-$label.json" ] && args+=(--heldout "$label=$dir/heldout-$label.json"); done
$PY benchmarks/bench_train.py "$dir/metrics-sft.jsonl" "$dir/metrics-grpo.jsonl" "${args[@]}" --out "$dir" \
  --device "$($PY -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")' 2>/dev/null)" \
  --note "$note" | tee "$dir/bench_train.txt"
echo "train check: $note"
[ -z "$failures" ]
