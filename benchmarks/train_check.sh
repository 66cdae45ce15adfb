#!/usr/bin/env bash
# Training on one machine: stage 1 as CUDA-L1 did it, on the real corpus. The held-out tasks of
# CUDA-L1's released kernels (a100.jsonl, levels 1-3, split by task; 16 held out, never seen by
# any stage) sampled from the starting model, SFT on the training tasks' published kernels
# (train.sft.trust_source: their source's validation stands in for measuring each), held-out
# again, GRPO for TRAIN_GRPO_SECONDS (resumable over several calls), held-out again; then the
# metrics, the reward curve with the valid fraction, a summary with the step-time split, and
# generation tokens/s inside GRPO against benchmarks/bench_generation.py (same model, batch and
# device). Local Ray, the local evaluator (this machine's sandbox), one Ray Train worker on the GPU.
#
#   bash benchmarks/train_check.sh                              # every phase, cuda family on this GPU
#   TRAIN_PHASES="before" bash benchmarks/train_check.sh        # one phase per call on a machine whose
#   TRAIN_PHASES="sft" ...; TRAIN_PHASES="grpo" ...;            # commands have a time limit; a grpo phase
#   TRAIN_PHASES="grpo" TRAIN_RESUME=1 ...; TRAIN_PHASES="after bench summary" ...   # cut short goes on with TRAIN_RESUME=1
#   TRAIN_CORPUS=builtin:cpp TRAIN_FAMILY=cpp TRAIN_DEVICE=cpu TRAIN_GRPO_SECONDS=30 bash benchmarks/train_check.sh  # a CPU dry run
#
# Everything goes to $OUT/train (default OUT=/tmp/gpu_check): config.yaml, *.log, heldout-*.json (and
# every held-out sample in heldout-*-samples.jsonl),
# metrics-{sft,grpo}.jsonl, reward_curve.png, bench_generation.txt, summary.{md,json}. Each step
# has its own time limit (`timeout`); a step that fails or runs out of time is named in the
# summary while the later steps still run where they can.
# Knobs (environment):
#   TRAIN_CORPUS (../shared/data/cuda-l1/a100.jsonl; builtin:FAMILY for the built-in suite)
#   TRAIN_FAMILY (cuda)  TRAIN_DEVICE (cuda if torch sees a GPU, else cpu)  TRAIN_MODEL ("" = SmolLM2-135M)
#   TRAIN_HELDOUT_COUNT (16)  TRAIN_HELDOUT_SAMPLES (8 per held-out task; 0 skips the checks)
#   TRAIN_MAX_NEW_TOKENS (1024: held-out samples and GRPO completions)  TRAIN_SFT_STEPS (100)
#   TRAIN_SFT_BATCH (4)  TRAIN_SFT_MAX_LENGTH (4096)  TRAIN_GRPO_SECONDS (240)  TRAIN_PROMPTS (2)  TRAIN_GENERATIONS (8)
#   TRAIN_HELDOUT_TIMEOUT (300)  TRAIN_SFT_TIMEOUT (300)  TRAIN_GRPO_GRACE (120: the step in flight at the limit)
#   TRAIN_EVALUATION (local | service)  TRAIN_RUN (run name, default train-check)  TRAIN_RESUME (1: grpo goes on)
#   TRAIN_BUILD_WORKERS (half the cores, at most 8)  TRAIN_BENCH_RUNS (3: bench_generation.py runs after GRPO)
#   TRAIN_OVERLAP (0; 1: each held-out check runs beside the next stage, see below)  TRAIN_GRPO_LR (1.0e-6)
#   TRAIN_GENERATE_ONLY (labels, e.g. "grpo": those checks only generate, to heldout-LABEL-generated.jsonl; the
#     `evaluate` phase, here or on another GPU machine with the file, evaluates them: a machine whose time runs out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
dir=$OUT/train
mkdir -p "$dir"
family=${TRAIN_FAMILY:-cuda}
device=${TRAIN_DEVICE:-$($PY -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)}
corpus=${TRAIN_CORPUS:-$(cd .. && pwd)/shared/data/cuda-l1/a100.jsonl}
samples=${TRAIN_HELDOUT_SAMPLES:-8}
grpo_s=${TRAIN_GRPO_SECONDS:-240}
run=${TRAIN_RUN:-train-check}
new_tokens=${TRAIN_MAX_NEW_TOKENS:-1024}
use_gpu=false
[ "${device%%:*}" = cuda ] && use_gpu=true
cpus=$(( $(nproc) > 4 ? 4 : 1 ))  # torch threads of the Ray Train worker (the rest: builds and sandboxes)
builders=${TRAIN_BUILD_WORKERS:-$(( $(nproc) / 2 > 8 ? 8 : $(nproc) / 2 ))}
case $corpus in
  builtin:*) tasks_uri=$corpus; sources="[builtin]"; trust=false ;;
  *) [ -f "$corpus" ] || { echo "train check: no corpus at $corpus (set TRAIN_CORPUS)"; exit 2; }
     tasks_uri="cuda-l1:$corpus"; sources="[\"cuda-l1:$corpus\"]"; trust=true ;;
esac

phases=" ${TRAIN_PHASES:-before sft grpo after evaluate bench summary} "
phase() { [[ $phases == *" $1 "* ]]; }
if phase before; then  # a fresh run (the build cache in SPEEDFORGE_CACHE is kept)
  rm -rf "$dir/store" "$dir/work" "$dir/times.txt" "$dir/failed.txt" "$dir"/heldout-*.json "$dir"/heldout-*.jsonl "$dir"/*.log
elif phase sft; then
  rm -rf "$dir/store" "$dir/work" "$dir/heldout-sft.json" "$dir/heldout-grpo.json" "$dir"/heldout-{sft,grpo}-{samples,generated}.jsonl "$dir/sft.log" "$dir/grpo.log"
fi
cat >"$dir/config.yaml" <<EOF
policy:
  model: "${TRAIN_MODEL:-}"
  device: $device
  max_new_tokens: $new_tokens
train:
  run: $run
  store: $dir/store
  work_dir: $dir/work
  family: $family
  tasks_uri: "$tasks_uri"
  heldout_count: ${TRAIN_HELDOUT_COUNT:-16}
  train_count: 0
  evaluation: ${TRAIN_EVALUATION:-local}
  max_stage_s: 0
  build_workers: $builders
  eval_retries: 1
  ray: {workers: 1, use_gpu: $use_gpu, cpus_per_worker: $cpus}
  sft: {sources: $sources, trust_source: $trust, steps: ${TRAIN_SFT_STEPS:-100}, batch_size: ${TRAIN_SFT_BATCH:-4}, max_length: ${TRAIN_SFT_MAX_LENGTH:-4096}, learning_rate: 5.0e-5, exemplars: 0, save_every: 1000}
  grpo: {steps: 2000, prompts_per_step: ${TRAIN_PROMPTS:-2}, generations: ${TRAIN_GENERATIONS:-8}, max_new_tokens: $new_tokens, learning_rate: ${TRAIN_GRPO_LR:-1.0e-6}, save_every: 2}
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
  if [[ " ${TRAIN_GENERATE_ONLY:-} " == *" $1 "* ]]; then  # generate here, evaluate in the `evaluate` phase
    step "generate-$1" "${TRAIN_HELDOUT_TIMEOUT:-300}" "${sf[@]}" train heldout --samples "$samples" ${2:+--model "$2"} \
      --generate-only --samples-out "$dir/heldout-$1-generated.jsonl"
    return
  fi
  heldout_step "$1" --samples "$samples" ${2:+--model "$2"}
}
heldout_step() {  # heldout_step LABEL ARGS...: `train heldout ARGS` evaluated, its report in heldout-LABEL.json
  local label=$1; shift
  step "heldout-$label" "${TRAIN_HELDOUT_TIMEOUT:-300}" "${sf[@]}" train heldout --json "$@" \
    --samples-out "$dir/heldout-$label-samples.jsonl" \
    && sed -n '/^{/,$p' "$dir/heldout-$label.log" >"$dir/heldout-$label.json"
}
final() { sed -n 's/^ *"final_checkpoint": "\(.*\)",*$/\1/p' "$dir/$1.log" | head -1; }

# TRAIN_OVERLAP=1: a held-out check runs beside the next stage (before beside SFT, after-SFT beside
# GRPO) on a machine whose time is short; their compiled and correct fractions are unaffected, but
# the checks' speedups, and GRPO's first steps, are then timed on a shared device.
overlap=${TRAIN_OVERLAP:-0}
beside_pid=""  # the background held-out check, waited for before the next stage that needs quiet
beside() {  # beside NEXT LABEL [MODEL]: heldout_check LABEL [MODEL], in the background when overlapping and phase NEXT follows
  local next=$1; shift
  if [ "$overlap" = 1 ] && phase "$next"; then heldout_check "$@" & beside_pid=$!; else heldout_check "$@"; fi
}
wait_beside() { [ -z "$beside_pid" ] || wait "$beside_pid"; beside_pid=""; }
if phase before; then beside sft before; fi
if phase sft; then
  step sft "${TRAIN_SFT_TIMEOUT:-300}" "${sf[@]}" train --stage sft --json
  wait_beside
  sft_model=$(final sft)
  [ -n "$sft_model" ] && beside grpo sft "$sft_model"
fi
if phase grpo; then
  resume=(); [ "${TRAIN_RESUME:-0}" = 1 ] && resume=(--resume)
  step grpo $(( grpo_s + ${TRAIN_GRPO_GRACE:-120} )) "${sf_grpo[@]}" train --stage grpo "${resume[@]}" --json
  wait_beside
fi
if phase after; then
  grpo_model=$([ -f "$dir/grpo.log" ] && final grpo)
  [ -n "$grpo_model" ] && heldout_check grpo "$grpo_model"
fi
if phase evaluate; then  # held-out samples generated with TRAIN_GENERATE_ONLY (here or on another machine), evaluated
  for generated in "$dir"/heldout-*-generated.jsonl; do
    [ -e "$generated" ] || continue
    label=${generated#"$dir"/heldout-}; label=${label%-generated.jsonl}
    [ -s "$dir/heldout-$label.json" ] && continue
    heldout_step "$label" --samples-in "$generated"
  done
fi
if phase bench; then  # the plain batched figure for GRPO's model, batch (prompts x generations), tokens and device
  timeout "${TRAIN_BENCH_TIMEOUT:-240}" $PY benchmarks/bench_generation.py ${TRAIN_MODEL:+--model "$TRAIN_MODEL"} --device "$device" --batch $(( ${TRAIN_PROMPTS:-2} * ${TRAIN_GENERATIONS:-8} )) \
    --new-tokens "$new_tokens" --runs "${TRAIN_BENCH_RUNS:-3}" >"$dir/bench_generation.txt" 2>&1 || echo "bench_generation (exit $?)" >>"$dir/failed.txt"
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
