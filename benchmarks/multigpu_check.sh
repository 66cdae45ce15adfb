#!/usr/bin/env bash
# GRPO on one host with two GPUs (nvidia-h200-x2): gpu_check.sh's `multigpu` stage.
#
#   bash benchmarks/gpu_check.sh multigpu                      # on the 2-GPU machine (wheels installed first)
#   MULTIGPU_DEVICE=cpu bash benchmarks/multigpu_check.sh      # the CPU dry run: the same script, tiny settings
#
# Parts (MULTIGPU_PARTS, default "grpo benchbound portability"):
#   grpo         GRPO with train.ray.workers 1, then 2 (use_gpu; the same config otherwise: the
#                builtin suite, MULTIGPU_STEPS steps, no time limit), steps/s and generation
#                tokens/s of each and the ratio against 1.7x (benchmarks/bench_multigpu.py); the
#                2-worker run is interrupted once its checkpoint at step MULTIGPU_STEPS is in the
#                store and resumed (--resume) for one more step on both workers; each metrics
#                line's `ranks` shows what every rank did in the step.
#   benchbound   benchmarks/bench_service.py --bench-bound: 1 bench worker against 2 on a warm cache,
#                the ratio against 1.8x.
#   portability  `speedforge portability` over two pools of one host, one GPU each (two pools of
#                the same GPU type, each workers: 1 and num_gpus: 1, so Ray hands each worker its own
#                GPU through CUDA_VISIBLE_DEVICES), merged in one report.
# With fewer than 2 GPUs it says so and runs what it can: with 1 GPU the 1-worker GRPO run and the
# portability run on one pool; with none, MULTIGPU_DEVICE=cpu (the default there): GRPO on 2 gloo
# CPU workers against 1 on the builtin cpp suite, bench-bound on 1 against 2 CPU bench workers,
# portability over two CPU pools. CPU figures prove the path, not the speed (2 workers share the cores).
# Knobs: MULTIGPU_DEVICE (cuda | cpu)  MULTIGPU_STEPS (cuda 8, cpu 2)  MULTIGPU_PROMPTS (cuda 32, cpu 1)
#   MULTIGPU_GENERATIONS (cuda 8, cpu 2)  MULTIGPU_NEW_TOKENS (cuda 256, cpu 16)
#   (on cuda, 256 samples a step, 128 a rank on 2 workers: the batch of the figures in docs/benchmarks/multigpu.md;
#   at 16 prompts, 64 a rank, a step's fixed costs weigh more and the ratio is lower, 1.34x on two H200s)  MULTIGPU_MODEL ("" = SmolLM2-135M)
#   MULTIGPU_CORPUS (builtin:cuda | builtin:cpp; or a CUDA-L1 .jsonl)  MULTIGPU_GRPO_TIMEOUT (cuda 1200, cpu 1500 s per run)
#   BENCHBOUND_ARGS (cuda "--n 24 --repeats 2", cpu "--n 4 --repeats 1")  PORTABILITY_VARIANTS (builtin:cuda | builtin:cpp)
#   PORTABILITY_LIMIT (the first N tasks; cuda 0 = all, cpu 4)
#   MULTIGPU_RESUME (true: the 2-worker run is stopped at its checkpoint and resumed; false: it runs its steps to
#     the end, for a run that measures steps/s alone)
#   MULTIGPU_STATIC_CACHE (cuda true, cpu false: train.grpo.static_cache, the decode compiled with CUDA graphs;
#     2.3-3x the decode's tokens/s on an H100, docs/benchmarks/generation.md; false: the eager decode)
# Everything goes to $OUT/multigpu (default OUT=/tmp/gpu_check): grpo-w{1,2}/, *.log, *.txt, portability/.
# On cuda, gpu-samples-w1.txt, -w2.txt and -w2-resume.txt: nvidia-smi every 2 s during each GRPO run, which
#   process is on which GPU (pid, gpu_uuid, used_memory) and each GPU's load (index, uuid, utilization.gpu,
#   clocks.sm, power.draw); after each run a line per GPU (benchmarks/gpu_samples.py): its UUID's first 8
#   characters (as a rank's `gpu`), the PIDs seen on it and its utilization.gpu while the run held it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast off in NCCL, PyTorch and NVSHMEM, for the Ray workers too (a shared host's GPUs)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dir=$OUT/multigpu
mkdir -p "$dir"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
device=${MULTIGPU_DEVICE:-$([ "$gpus" -gt 0 ] && echo cuda || echo cpu)}
parts=" ${MULTIGPU_PARTS:-grpo benchbound portability} "
part() { [[ $parts == *" $1 "* ]]; }
failed=()
if [ "$device" = cuda ]; then
  family=cuda; use_gpu=true; workers_max=$(( gpus >= 2 ? 2 : gpus ))
  steps=${MULTIGPU_STEPS:-8}; prompts=${MULTIGPU_PROMPTS:-32}; generations=${MULTIGPU_GENERATIONS:-8}
  new_tokens=${MULTIGPU_NEW_TOKENS:-256}; grpo_limit=${MULTIGPU_GRPO_TIMEOUT:-1200}
  static_cache=${MULTIGPU_STATIC_CACHE:-true}; cpus=4
  echo "multigpu: $gpus GPU(s) here: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
  [ "$gpus" -ge 2 ] || echo "multigpu: fewer than 2 GPUs: only the 1-worker GRPO run and portability on one pool run (no bench-bound, no 2-worker run)"
else
  family=cpp; use_gpu=false; workers_max=2
  steps=${MULTIGPU_STEPS:-2}; prompts=${MULTIGPU_PROMPTS:-1}; generations=${MULTIGPU_GENERATIONS:-2}
  new_tokens=${MULTIGPU_NEW_TOKENS:-16}; grpo_limit=${MULTIGPU_GRPO_TIMEOUT:-1500}
  static_cache=${MULTIGPU_STATIC_CACHE:-false}; cpus=1
  echo "multigpu: CPU dry run ($gpus GPU(s) here, $(nproc) cores): gloo workers, CPU bench workers and CPU pools;" \
       "it proves the path, its figures are no measurement of the GPUs"
fi
resume=${MULTIGPU_RESUME:-true}
corpus=${MULTIGPU_CORPUS:-builtin:$family}
case $corpus in
  builtin:*) tasks_uri=$corpus ;;
  *) tasks_uri="cuda-l1:$corpus" ;;
esac

grpo_config() {  # grpo_config WORKERS STEPS: the one config of every GRPO run, differing only in these
  cat <<EOF
policy: {model: "${MULTIGPU_MODEL:-}", device: $device, max_new_tokens: $new_tokens}
train:
  run: multigpu
  store: $dir/grpo-w$1/store
  work_dir: $dir/grpo-w$1/work
  family: $family
  tasks_uri: "$tasks_uri"
  heldout_count: 1
  train_count: 0
  evaluation: local
  max_stage_s: 0
  eval_retries: 1
  ray: {workers: $1, use_gpu: $use_gpu, cpus_per_worker: $cpus}
  grpo: {steps: $2, prompts_per_step: $prompts, generations: $generations, max_new_tokens: $new_tokens, learning_rate: 1.0e-6, save_every: $steps, static_cache: $static_cache}
EOF
}
state_step() {  # the step of the latest checkpoint in run store $1 (0: none yet)
  $PY -c 'import json, sys
try: print(json.load(open(sys.argv[1])).get("step", 0))
except Exception: print(0)' "$1/runs/multigpu/grpo/state.json"
}
sampler=  # the GPU sampler's process group while a GRPO run goes ("": none)
gpu_sampler_start() {  # gpu_sampler_start FILE: on cuda, nvidia-smi every 2 s into FILE, each line after a timestamp
  sampler=
  [ "$device" = cuda ] && command -v nvidia-smi >/dev/null 2>&1 || return 0
  : >"$1"
  # its own process group (setsid, as the 2-worker run), so that one kill ends the loop, nvidia-smi and sleep;
  # timeout --foreground keeps a hung nvidia-smi in that group; $ts is the loop's own
  # shellcheck disable=SC2016
  setsid bash -c 'while :; do
      ts=$(date +%FT%T)
      timeout --foreground -k 5 10 nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader 2>&1 | sed "s/^/$ts app, /"
      timeout --foreground -k 5 10 nvidia-smi --query-gpu=index,uuid,utilization.gpu,clocks.sm,power.draw --format=csv,noheader 2>&1 | sed "s/^/$ts gpu, /"
      sleep 2
    done' >>"$1" 2>&1 </dev/null &
  sampler=$!
}
gpu_sampler_stop() {  # gpu_sampler_stop FILE: ends the sampler, then prints a line per GPU seen in FILE
  [ -n "$sampler" ] || return 0
  kill -KILL -- -"$sampler" "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  sampler=
  $PY benchmarks/gpu_samples.py "$1" | sed 's/^/   /'  # named as a rank's `gpu`; utilization while the run held the GPU
}
trap '[ -n "$sampler" ] && kill -KILL -- -"$sampler" "$sampler" 2>/dev/null' EXIT  # never leave a sampler behind

if part grpo; then
  for w in 1 2; do
    [ "$w" -le "$workers_max" ] || { echo "== grpo on $w workers: skipped, $gpus GPU(s)"; continue; }
    rm -rf "$dir/grpo-w$w"; mkdir -p "$dir/grpo-w$w"
    # the 2-worker run is configured for one step more; it is stopped once step $steps's checkpoint
    # is in the store (as a machine's time limit stops a run), then resumed for that last step
    total=$steps; [ "$w" = 2 ] && [ "$resume" = true ] && total=$(( steps + 1 ))
    grpo_config "$w" "$total" >"$dir/grpo-w$w/config.yaml"
    sf=($PY -m speedforge.cli --config "$dir/grpo-w$w/config.yaml" train --stage grpo --json)
    echo "== grpo on $w worker(s), $steps steps: ${sf[*]}"
    t0=$SECONDS
    if [ "$w" = 1 ] || [ "$resume" != true ]; then
      gpu_sampler_start "$dir/gpu-samples-w$w.txt"
      timeout --kill-after=15 "$grpo_limit" "${sf[@]}" >"$dir/grpo-w$w.log" 2>&1 || failed+=("grpo-w$w (exit $?)")
      gpu_sampler_stop "$dir/gpu-samples-w$w.txt"
    else
      gpu_sampler_start "$dir/gpu-samples-w2.txt"
      setsid "${sf[@]}" >"$dir/grpo-w2.log" 2>&1 &
      pid=$!
      while kill -0 "$pid" 2>/dev/null && [ "$(state_step "$dir/grpo-w2/store")" -lt "$steps" ] \
            && [ $(( SECONDS - t0 )) -lt "$grpo_limit" ]; do sleep 2; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "   checkpoint of step $(state_step "$dir/grpo-w2/store") in the store: stopping the run (its group $pid)"
        kill -TERM -- -"$pid"; sleep 10; kill -KILL -- -"$pid" 2>/dev/null
      fi
      wait "$pid" 2>/dev/null
      gpu_sampler_stop "$dir/gpu-samples-w2.txt"
      cp "$dir/grpo-w2/work/multigpu/grpo/metrics.jsonl" "$dir/grpo-w2/metrics-before-resume.jsonl" 2>/dev/null
      [ "$(state_step "$dir/grpo-w2/store")" -ge "$steps" ] || failed+=("grpo-w2 (no checkpoint of step $steps)")
      echo "== grpo on 2 workers, resumed (--resume) for step $(( steps + 1 ))"
      gpu_sampler_start "$dir/gpu-samples-w2-resume.txt"
      timeout --kill-after=15 "$grpo_limit" "${sf[@]}" --resume >"$dir/grpo-w2-resume.log" 2>&1 || failed+=("grpo-w2-resume (exit $?)")
      gpu_sampler_stop "$dir/gpu-samples-w2-resume.txt"
    fi
    echo "   exit after $(( SECONDS - t0 )) s; log $dir/grpo-w$w.log"
  done
  m1=$dir/grpo-w1/work/multigpu/grpo/metrics.jsonl
  m2=$dir/grpo-w2/work/multigpu/grpo/metrics.jsonl
  two=$m2; resumed=()  # without the resume, the 2-worker run's own lines
  [ "$resume" = true ] && { two=$dir/grpo-w2/metrics-before-resume.jsonl; resumed=(--resumed "$m2" --resumed-step $(( steps + 1 ))); }
  if [ -f "$m1" ] && [ -f "$two" ]; then
    $PY benchmarks/bench_multigpu.py --one "$m1" --two "$two" "${resumed[@]}" \
      --target 1.7 | tee "$dir/grpo.txt" || failed+=("grpo ranks/resume")
  elif [ -f "$m1" ]; then
    echo "1 worker only: $(tail -n 1 "$m1" | cut -c1-300)" | tee "$dir/grpo.txt"
  else
    failed+=("grpo (no metrics)"); tail -n 5 "$dir/grpo-w1.log"
  fi
fi

if part benchbound; then  # 1 bench worker against 2 on a warm cache (the service's pool of this device)
  if [ "$device" = cuda ] && [ "$gpus" -lt 2 ]; then
    echo "== benchbound: skipped, $gpus GPU(s) (it compares 1 GPU with 2)"
  else
    pool_args=(); [ "$device" = cpu ] && pool_args=(--pools cpu)
    default_args="--n 24 --repeats 2"; [ "$device" = cpu ] && default_args="--n 4 --repeats 1"
    echo "== benchbound: bench_service.py --bench-bound ${pool_args[*]} ${BENCHBOUND_ARGS:-$default_args}"
    $PY benchmarks/bench_service.py --bench-bound "${pool_args[@]}" ${BENCHBOUND_ARGS:-$default_args} \
      --json "$dir/bench_bound.json" >"$dir/bench_bound.txt" 2>"$dir/bench_bound.log" || failed+=("benchbound (exit $?)")
    cat "$dir/bench_bound.txt"
    ratio=$(grep 'steady state' "$dir/bench_bound.txt" | grep -o 'ratio of medians [0-9.]*' | grep -o '[0-9.]*$')
    [ -n "$ratio" ] && echo "bench-bound steady-state ratio ${ratio}x against the target 1.8x:" \
      "$($PY -c "print('met' if $ratio >= 1.8 else 'not met')")"
  fi
fi

if part portability; then  # two pools of one host, one GPU (or, dry, one CPU bench slot) each, one report
  if [ "$device" = cuda ]; then
    gpu_type=$($PY -c 'from speedforge.cluster.pools import local_gpu_pool; print(local_gpu_pool() or "")')
    arch=$($PY -c "from speedforge.config import GPU_POOLS; print(GPU_POOLS.get('$gpu_type', ''))")
    [ -n "$gpu_type" ] || { echo "== portability: skipped, no configured pool names this GPU"; failed+=("portability (unknown GPU)"); }
    names=("$gpu_type-a" "$gpu_type-b"); [ "$gpus" -ge 2 ] || names=("$gpu_type-a")
    pool_yaml() { echo "    $1: {device: cuda, workers: 1, num_gpus: 1, num_cpus: 0, cuda_arch: \"$arch\", resources: {\"accelerator_type:$gpu_type\": 0.001}}"; }
    slots=1
  else
    gpu_type=cpu; names=(cpu-a cpu-b)
    # half a CPU each: both pools' bench workers and a build worker fit on 2 cores
    pool_yaml() { echo "    $1: {device: cpu, workers: 1, num_gpus: 0, num_cpus: 0.5, resources: {speedforge_cpu_bench: 1}}"; }
    slots=2
  fi
  if [ -n "$gpu_type" ]; then
    { echo "service:"; echo "  local_cpu_bench_slots: $slots"; echo "  pools:"; for n in "${names[@]}"; do pool_yaml "$n"; done; } \
      >"$dir/pools.yaml"
    pools=$(IFS=,; echo "${names[*]}")
    variants=${PORTABILITY_VARIANTS:-builtin:$family}
    limit=${PORTABILITY_LIMIT:-$([ "$device" = cpu ] && echo 4 || echo 0)}  # the first N tasks (0: all)
    rm -rf "$dir/portability"
    echo "== portability over pools $pools (config $dir/pools.yaml), variants $variants"
    cat "$dir/pools.yaml"
    { $PY -m speedforge.cli --config "$dir/pools.yaml" portability --variants "$variants" --pools "$pools" \
        --limit "$limit" --out "$dir/portability/results" \
      && $PY -m speedforge.cli --config "$dir/pools.yaml" report --results "$dir/portability/results" \
        --out "$dir/portability/report"; } >"$dir/portability.txt" 2>&1 || failed+=("portability (exit $?)")
    tail -n 15 "$dir/portability.txt"
    [ -f "$dir/portability/report/report.md" ] && { echo "-- report.md (head)"; head -n 30 "$dir/portability/report/report.md"; }
  fi
fi

echo "== multigpu ($device, $gpus GPU(s)): ${failed[*]:-every part ran}"
[ ${#failed[@]} -eq 0 ]
