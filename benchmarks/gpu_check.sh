#!/usr/bin/env bash
# The GPU path, proven in one script (CI has no GPU). Run from the repository root on the GPU
# machine:  bash benchmarks/gpu_check.sh [env] [evaluator] [tests] [fidelity] [service] [benchbound] [generation] [ann]
#           [portability] [train] [ann-scale] [multigpu]
# (no arguments: all but ann-scale, which takes an hour or more, and multigpu, for a 2-GPU host: name them). It installs what the machine lacks from wheels/ (carried with the tree),
# runs the gpu-marked tests and the benchmarks, and prints a short table at the end. The training and
# multigpu stages need more than wheels/ carries in one call: install with benchmarks/device/install.sh
# over several calls first, then `export PYTHONPATH=/tmp/site` before this script.
# Full logs and JSON figures go to $OUT (default /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SPEEDFORGE_CACHE=${SPEEDFORGE_CACHE:-/tmp/speedforge-cache}
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env evaluator tests fidelity service benchbound generation ann portability train)
summary=()
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
note() { summary+=("$(printf '%-12s %s' "$1" "$2")"); }

# Wheels over the carry limit travel in pieces (<wheel>.part-aa, -ab, ...): join them first.
for first in wheels/*.part-aa; do
  [ -e "$first" ] || continue
  whole=${first%.part-aa}
  cat "$whole".part-* >"$whole" && rm -f "$whole".part-*
done
# A package too big to carry even in pieces travels as an unpacked tree, trimmed and xz-compressed
# (ray without its Java jars, rllib, serve and llm: 31 MB instead of 79): unpack it on the path.
for tree in wheels/*.tar.xz; do
  [ -e "$tree" ] || continue
  mkdir -p /tmp/site && xz -dc "$tree" | tar xf - -C /tmp/site && export PYTHONPATH="$PYTHONPATH:/tmp/site"
done
if [ -d wheels ] && ls wheels/*.whl >/dev/null 2>&1; then
  {
    $PY -m pip install --no-index --find-links wheels --no-deps wheels/*.whl
    for sdist in wheels/*.tar.gz; do
      [ -e "$sdist" ] || continue
      $PY -m pip install --no-index --no-build-isolation --no-deps "$sdist"
    done
  } >"$OUT/pip.log" 2>&1 && note wheels "installed $(ls wheels/*.whl wheels/*.tar.gz 2>/dev/null | wc -l) carried packages" \
    || note wheels "pip failed (see pip.log)"
fi
# The native ANN engine is built by the package build.
$PY -m pip install --no-index --no-deps --no-build-isolation -e . >"$OUT/build.log" 2>&1 \
  && note build "speedforge installed (native engine built)" || note build "package build failed (see build.log)"

if want env; then
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
    $PY -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
    nvcc --version | tail -1
    nproc
    unshare --net --pid --fork --kill-child true && echo "namespaces: ok"
    $PY -c 'from speedforge.evaluator import landlock; print("landlock abi", landlock.abi_version())'
  } >"$OUT/env.txt" 2>&1
  note env "$(head -1 "$OUT/env.txt" | cut -c1-60); $(grep -c ok "$OUT/env.txt") checks ok"
fi

if want evaluator; then
  $PY benchmarks/bench_evaluator.py --device cuda --out "$OUT/bench_evaluator.json" >"$OUT/bench_evaluator.txt" 2>&1
  note evaluator "exit $? (bench_evaluator.txt)"
fi

if want tests; then
  files=${GPU_TEST_FILES:-$(grep -l "mark.gpu" tests/test_*.py | tr '\n' ' ')}
  $PY -m pytest -m gpu -p no:cacheprovider -q $files ${GPU_TEST_ARGS:-} >"$OUT/gpu_tests.txt" 2>&1
  note tests "$(tail -1 "$OUT/gpu_tests.txt")"
  # the CPU tricks under the CUDA build of torch (its libraries' address space once failed them)
  $PY -m pytest -p no:cacheprovider -q -n ${CPU_TEST_WORKERS:-8} tests/test_evaluator_sabotage.py \
    tests/test_evaluator_adversarial.py tests/test_sandbox_address_space.py >"$OUT/cpu_tricks.txt" 2>&1
  note cpu-tricks "$(tail -1 "$OUT/cpu_tricks.txt")"
fi

if want fidelity; then  # CUDA-L1's published kernels, its harness vs speedforge (needs ../shared/data or FIDELITY_ARGS)
  fid=${FIDELITY_OUT:-$OUT/fidelity}
  # levels 1-3 by default; FIDELITY_ARGS="--direct ..." evaluates without Ray (a machine without it)
  for step in ${FIDELITY_STEPS:-cuda-l1 speedforge repeat report}; do
    $PY benchmarks/bench_fidelity.py "$step" --out "$fid" ${FIDELITY_ARGS:-} >>"$OUT/fidelity.txt" 2>&1 \
      || { note fidelity "$step failed (fidelity.txt)"; break; }
  done
  note fidelity "$(grep -m1 'kernels: accepted by both' "$OUT/fidelity.txt" || echo 'no report')"
  # where a launch-bound kernel's time goes under each harness's regime (the short-call outliers);
  # SHORT_CALL_ARGS e.g. "--jsonl .fid/a100.jsonl --kernel level2/14 --kernel level1/44"
  $PY benchmarks/bench_short_call.py ${SHORT_CALL_ARGS:-} >"$OUT/short_call.txt" 2>&1
  note short-call "exit $? (short_call.txt)"
fi

if want service && [ -f benchmarks/bench_service.py ]; then
  $PY benchmarks/bench_service.py --device cuda ${SERVICE_ARGS:-} >"$OUT/bench_service.txt" 2>&1
  note service "exit $? (bench_service.txt)"
fi

if want benchbound; then  # needs 2+ GPUs: 1 bench worker vs one per GPU on a warm cache
  if [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ]; then
    $PY benchmarks/bench_service.py --bench-bound ${BENCHBOUND_ARGS:---n 24 --repeats 2} >"$OUT/bench_bound.txt" 2>&1
    note benchbound "exit $? (bench_bound.txt)"
  else
    note benchbound "skipped: one GPU"
  fi
fi

if want generation && [ -f benchmarks/bench_generation.py ]; then
  # batch 1 (one search sample at a time) and batch 8 (a round's samples in one call)
  for batch in ${GENERATION_BATCHES:-1 8}; do
    $PY benchmarks/bench_generation.py --device cuda --batch "$batch" >"$OUT/bench_generation_b$batch.txt" 2>&1
    note generation "batch $batch: exit $? (bench_generation_b$batch.txt)"
  done
  # GRPO's one generate call per step against plain batched generation, same model and batch
  $PY benchmarks/bench_grpo_generation.py --device cuda --batch 16 --new-tokens 256 --variants default \
    >"$OUT/bench_grpo_generation.txt" 2>&1
  note generation "grpo: $(grep -m1 'ratio plain / grpo' "$OUT/bench_grpo_generation.txt" || echo "exit $? (bench_grpo_generation.txt)")"
  # GRPO's decode with train.grpo.static_cache (CUDA graphs) against speedforge's default
  # (autocast), at the multigpu stage's batch of 128 and at a rank's half of it; the eager decode
  # took as long a token step at 64 as at 128 (host-bound), so this says what a second GPU can give;
  # static_sync: the same without the deferred stop check (the host waits for the device every token);
  # one more step each, profiled: a token step's device kernel time against the rest (generation-profile/)
  for batch in ${GRPO_STATIC_BATCHES-128 64}; do
    timeout 500 $PY benchmarks/bench_grpo_generation.py --device cuda --batch "$batch" --generations 8 --new-tokens 256 \
      --prompt-tokens 800 --steps 4 --modes grpo --variants autocast,static_sync,static --profile "$OUT/generation-profile" \
      >"$OUT/bench_grpo_static_b$batch.txt" 2>&1
    note generation "grpo batch $batch: $(grep 'ratio grpo static' "$OUT/bench_grpo_static_b$batch.txt" | xargs || echo "exit $? (bench_grpo_static_b$batch.txt)")"
  done
  # the weights' dtype at the training check's batch and length (bf16 read slower than
  # float32 there on an H100); GENERATION_LONG="32 3072" by default, "" skips it
  # on the default model saved as a plain checkpoint, as SFT saves it (no packed GGUF weights)
  set -- ${GENERATION_LONG-32 3072}
  plain=/tmp/gpu_check_plain_model
  if [ $# -eq 2 ] && { [ -f $plain/config.json ] || $PY -c "import sys, torch, transformers
from speedforge.policy.backends import resolve_model
from speedforge.train.weights import plain_weights, training_tokenizer
folder, gguf, name = resolve_model('')
model = plain_weights(transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32), name)
model.save_pretrained(sys.argv[1]); training_tokenizer(folder, gguf).save_pretrained(sys.argv[1])" $plain >"$OUT/plain_model.txt" 2>&1; }; then
    for dtype in float32 bfloat16; do
      timeout 400 $PY benchmarks/bench_generation.py --model $plain --device cuda --batch "$1" --new-tokens "$2" --runs 2 --dtype $dtype \
        >"$OUT/bench_generation_long_$dtype.txt" 2>&1
      note generation "batch $1 x $2 tokens, $dtype: $(grep -m1 'decode tokens/s' "$OUT/bench_generation_long_$dtype.txt" || echo "exit $?")"
    done
  fi
fi

if want ann && [ -f benchmarks/bench_ann.py ]; then
  # every library (sfann, hnswlib, faiss HNSW, ScaNN, USearch f32/i8; a missing one is
  # skipped with a note) on clustered and uniform data, 1 thread and all threads, in one run that
  # stops sweeping after ANN_BUDGET_S seconds (default 270; killed at ANN_BUDGET_S + 60). ANN_ARGS
  # replaces the sizes below. Then the ann reward's CV over 6 sandboxes (ANN_REWARD_BUDGET_S, default 80).
  ann_budget=${ANN_BUDGET_S:-270}
  timeout $((ann_budget + 60)) $PY benchmarks/bench_ann.py \
    ${ANN_ARGS:---n sift=50000,glove=50000,gist=20000 --queries 500 --repeats 3} \
    --budget-s "$ann_budget" --json "$OUT/bench_ann.json" >"$OUT/bench_ann.txt" 2>"$OUT/bench_ann.log"
  note ann "exit $? (bench_ann.txt, bench_ann.log, bench_ann.json)"
  reward_budget=${ANN_REWARD_BUDGET_S:-80}
  timeout $((reward_budget + 60)) $PY benchmarks/bench_ann_reward.py --repeats 6 --budget-s "$reward_budget" \
    >"$OUT/bench_ann_reward.txt" 2>&1
  note ann-reward "exit $? (bench_ann_reward.txt: $(tail -n 1 "$OUT/bench_ann_reward.txt" | grep -o 'CV [0-9.]*%'))"
fi

if want portability; then  # the built-in CUDA suite + CUDA-L1's A100 kernels (levels 1-2) on this GPU's pool
  pool=${PORTABILITY_POOL:-$($PY -c 'from speedforge.cluster.pools import local_gpu_pool; print(local_gpu_pool() or "")')}
  jsonl=${PORTABILITY_JSONL:-../shared/data/cuda-l1/a100.jsonl}  # or carried: PORTABILITY_JSONL=.speedforge/a100.jsonl
  port=$OUT/portability-$pool  # builtin/, level1/, level2/ and report/
  if [ -z "$pool" ]; then
    note portability "skipped: no configured pool names this GPU"
  elif [ ! -f "$jsonl" ]; then
    note portability "skipped: $jsonl not found (set PORTABILITY_JSONL)"
  else
    # One results store per step (a step cut short leaves no lease in the way of the next); run
    # the stage again on a warm cache to finish one. The report merges the stores; merge another
    # machine's with more --results (docs/benchmarks/portability.md).
    measure_portability() {
      $PY -m speedforge.cli portability --variants builtin:cuda --pools "$pool" --out "$port/builtin" || return 1
      for level in 1 2; do  # the first PORTABILITY_TASKS kernels of each level (CUDA-L1 publishes 87 and 94)
        $PY -m speedforge.cli portability --variants "$jsonl" --skip-bad --levels $level \
          --limit "${PORTABILITY_TASKS:-30}" --pools "$pool" --out "$port/level$level" || return 1
      done
      $PY -m speedforge.cli report --results "$port/builtin" --results "$port/level1" --results "$port/level2" \
        --out "$port/report"
    }
    measure_portability >"$OUT/portability.txt" 2>&1
    note portability "exit $? ($(basename "$port")/report/report.md; portability.txt)"
  fi
fi

if want train; then  # held-out check, SFT of SmolLM2-135M, held-out, GRPO for TRAIN_GRPO_SECONDS, held-out
  # (cuda family, local Ray and evaluator, one Ray Train worker on the GPU); knobs: benchmarks/train_check.sh
  OUT="$OUT" PY="$PY" bash benchmarks/train_check.sh >"$OUT/train.txt" 2>&1
  note train "exit $? (train/summary.md, train/reward_curve.png, train/metrics-*.jsonl; train.txt)"
fi

if want ann-scale; then  # every ANN library at 1M vectors (SIFT, GloVe) and the largest GIST that fits;
  # stages and knobs: benchmarks/ann_scale_check.sh (ANN_SCALE_STAGES, default all, one data set each)
  OUT="$OUT/ann_scale" PY="$PY" bash benchmarks/ann_scale_check.sh ${ANN_SCALE_STAGES:-sift glove gist report} \
    >"$OUT/ann_scale.txt" 2>&1
  note ann-scale "exit $? (ann_scale/ann_scale_report.txt; ann_scale.txt)"
fi

if want multigpu; then  # on a host with 2 GPUs (nvidia-h200-x2): GRPO on 1 against 2 Ray Train workers
  # (steps/s, tokens/s, checkpoint resumed on both, every rank in the logs), bench-bound 1 against 2 bench
  # workers, portability over two pools of one GPU each; fewer GPUs: it says so and runs what it can.
  # Parts and knobs: benchmarks/multigpu_check.sh (MULTIGPU_DEVICE=cpu: the CPU dry run)
  OUT="$OUT" PY="$PY" bash benchmarks/multigpu_check.sh >"$OUT/multigpu.txt" 2>&1
  note multigpu "exit $? ($(tail -n 1 "$OUT/multigpu.txt" | cut -c1-80); multigpu.txt)"
fi

for f in "$OUT"/*.txt; do echo "===== $(basename "$f")"; tail -n 25 "$f"; done
echo "===== summary"
printf '%s\n' "${summary[@]}"
