#!/usr/bin/env bash
# There: one 10-minute call (timeout_s 600) of the evaluator's GPU figures, bench_fidelity.py --help's plan
# in two calls on one-GPU machines. Carry .fid (here: `bash benchmarks/device/fidelity.sh pack`),
# which holds Ray (trimmed), the wheels it needs, CUDA-L1's a100.jsonl and eval_cuda.py, and the
# result files of earlier calls (copy each call's returned fid-*.tgz contents into .fid/results/).
#   fidelity.sh pack       here: .fid from the carry folders of benchmarks/device/pack.sh
#   fidelity.sh 1          speedforge cold; CUDA-L1 cold on the kernels speedforge accepted until
#                          470 s; CUDA-L1 again on those both accepted until 550 s (both on one machine)
#   fidelity.sh 2          CUDA-L1's run 1 on the rest until REST_UNTIL (250 s); the repeat step (GPU CV,
#                          REPEATS sandboxes, 5) until REPEAT_UNTIL (500 s); the report
#   fidelity.sh l2off      speedforge cold again with evaluator.l2_flush_mb: 0 (CUDA-L1 flushes no L2),
#                          its own report against the CUDA-L1 runs so far: how much of a ratio the flush is
#   fidelity.sh wall       speedforge cold again with evaluator.min_timed_span: wall (min_timed_s counts the
#                          pairs' wall time: a short kernel stops at its interval's target, not at 200 pairs),
#                          its own report against the CUDA-L1 runs so far: throughput and agreement
#   fidelity.sh span       after call 1 on the same machine, min_timed_span's A/B: speedforge cold with
#                          `wall` (/tmp/fid-wall); CUDA-L1's run 1 on the rest until L1_UNTIL (400 s); its
#                          run 2 on the kernels both accepted until L2_UNTIL (560 s); both folders' reports
#   fidelity.sh span2      the A/B's second leg, the other order: speedforge cold run 2 with `wall`, then
#                          with `work` (the default); both folders' reports (reports: throughput per run)
#   fidelity.sh ab         bench_overhead.py on AB_OLD's speedforge and this tree's, alternated, one cache
#   fidelity.sh overhead   bench_overhead.py on CUDA-L1's kernels (OVERHEAD_ARGS, e.g. "--n 12 --profile")
#   fidelity.sh tests      the GPU tests alone (test_evaluator_gpu.py), to $OUT/gpu_tests.txt
#   fidelity.sh session    a whole warm machine's run, to be detached (detach.sh) and awaited (await.sh
#                          fid SECONDS /tmp/fidpack): the GPU tests (test_evaluator_gpu.py); speedforge
#                          cold; CUDA-L1 on the kernels speedforge accepted until L1_UNTIL (1250 s); the
#                          repeat step until REPEAT_UNTIL (1550 s); the report. Files in /tmp/fidpack.
#   fidelity.sh batch      the verdict channel's GPU figures, a whole warm machine's run to be detached
#                          (detach.sh) and awaited (await.sh fid SECONDS /tmp/fidpack): the GPU tests; a GRPO-sized
#                          batch cold (FID_EVERY=2: 113 kernels of levels 1-3, VARIANTS (16) near-copies of some of
#                          them: 129 candidates), with each result's latency from submission and the GPU's busy
#                          share; CUDA-L1 serially on the sample (levels interleaved) until L1_UNTIL (1000 s), its
#                          pace per kernel scaled to the batch; warm sweeps over the batch's builds (run labels 2,
#                          3) while WARM_UNTIL (1500 s) leaves room: the tripwire's false positives over every
#                          evaluation. Files in /tmp/fidpack.
# FID_EVERY (9: every 9th kernel of levels 1-3, 25 kernels), FID_OFFSET (0: the sample's first kernel;
# another offset takes kernels no earlier sample of the same FID_EVERY took). Results: $OUT/fid-N.tgz
# and report.txt.
# On a machine of more GPUs and cores, keep to one of each kind's: `CUDA_VISIBLE_DEVICES=0 taskset -c 0-15
# bash benchmarks/device/fidelity.sh 1` (an install by install.sh serves: .fid needs only a100.jsonl and eval_cuda.py).
set -u
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
  rm -rf .fid && mkdir -p .fid/results
  for f in ray-*-trimmed.tar.xz msgpack-*.whl pydantic-*.whl pydantic_core-*.whl annotated_types-*.whl \
           typing_inspection-*.whl jsonschema-*.whl jsonschema_specifications-*.whl referencing-*.whl rpds_py-*.whl \
           attrs-*.whl a100.jsonl eval_cuda.py; do
    cp .carry[0-9]*/$f .fid/ 2>/dev/null || { echo "pack: $f not in .carry*/ (run benchmarks/device/pack.sh)"; exit 1; }
  done
  grep -qx '/.fid/' .git/info/exclude || echo '/.fid/' >>.git/info/exclude
  du -sh .fid; exit 0
fi
call=${1:?usage: fidelity.sh pack|1|2|l2off|wall|span|span2|session|overhead|ab|tests}
if { [ "$call" = session ] || [ "$call" = batch ]; } && [ "$PWD" != /tmp/fidrepo ]; then  # later calls re-send the tree
  rm -rf /tmp/fidrepo && cp -a . /tmp/fidrepo && exec bash /tmp/fidrepo/benchmarks/device/fidelity.sh "$call"
fi
if [ "$call" = session ] || [ "$call" = batch ]; then export OUT=/tmp/fidpack; mkdir -p $OUT; fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
if [ ! -d /tmp/site/ray ]; then
  mkdir -p /tmp/site && xz -dc .fid/ray-*-trimmed.tar.xz | tar xf - -C /tmp/site \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .fid/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/build.log 2>&1 \
    || { echo "install failed"; tail /tmp/build.log; exit 1; }
fi
python3 -c 'import ray; print("ray", ray.__version__)' || exit 1
fid=/tmp/fid; mkdir -p $fid; cp -n .fid/results/* $fid/ 2>/dev/null
FARGS=(--jsonl .fid/a100.jsonl --harness .fid/eval_cuda.py --every "${FID_EVERY:-9}" --offset "${FID_OFFSET:-0}")
fidw=/tmp/fid-wall  # span, span2 (and wall): min_timed_span's A/B, `wall` in a folder of its own
Fw=(python3 benchmarks/bench_fidelity.py --out $fidw "${FARGS[@]}")
printf 'evaluator:\n  min_timed_span: wall\n' >/tmp/fid-wall.yaml
if [ "$call" = l2off ] || [ "$call" = wall ]; then  # a folder of its own, with the CUDA-L1 runs so far
  mkdir -p /tmp/fid-$call && cp -n $fid/cuda_l1*.jsonl /tmp/fid-$call/ 2>/dev/null
  fid=/tmp/fid-$call
fi
F=(python3 benchmarks/bench_fidelity.py --out $fid "${FARGS[@]}")
L1=("${F[@]}" cuda-l1 --timeout-s 150 --budget-s)
save() {  # save [FOLDER [NAME]]: the result files of FOLDER ($fid) to $OUT/NAME.tgz (fid-$call)
  (cd "${1:-$fid}" && tar czf "${OUT:-/tmp}/${2:-fid-$call}.tgz" --exclude=corpus*.jsonl ./*.json* 2>/dev/null); true
}
left() { echo $(( $1 - SECONDS )); }
gpu_tests() {
  timeout 480 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_evaluator_gpu.py >"${OUT:-/tmp}/gpu_tests.txt" 2>&1
  echo "pytest exit $? after $SECONDS s" >>"${OUT:-/tmp}/gpu_tests.txt"; tail -n 3 "${OUT:-/tmp}/gpu_tests.txt"
}
OVERHEAD=(python3 benchmarks/bench_overhead.py --device cuda --source cuda-l1 --corpus .fid/a100.jsonl)
if [ "$call" = tests ]; then
  gpu_tests; grep -E "passed|failed|error" "${OUT:-/tmp}/gpu_tests.txt" | tail -n 5; exit 0
elif [ "$call" = ab ]; then  # bench_overhead.py on AB_OLD (a folder with another revision's speedforge package)
  # and on this tree, alternated AB_ROUNDS (2) times on one cache (warm runs: the harness's own time)
  mkdir -p /tmp/ab-cache
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for side in old new; do
      path=$PWD; [ $side = old ] && path=$PWD/${AB_OLD:?AB_OLD: a folder holding the other speedforge package}
      (cd /tmp && PYTHONPATH=$path:/tmp/site python3 -c 'import speedforge; print("speedforge from", speedforge.__file__)')
      PYTHONPATH=$path:/tmp/site "${OVERHEAD[@]}" --cache-dir /tmp/ab-cache ${OVERHEAD_ARGS:-} \
        >"$OUT/ab-$side-$round.txt" 2>&1
      grep -A30 "frequent calls" "$OUT/ab-$side-$round.txt" | head -12
    done
  done
  exit 0
elif [ "$call" = overhead ]; then  # where a run's time goes on the GPU (bench_overhead.py), OVERHEAD_ARGS added
  "${OVERHEAD[@]}" ${OVERHEAD_ARGS:-} >"${OUT:-/tmp}/overhead.txt" 2>&1; tail -n 60 "${OUT:-/tmp}/overhead.txt"; exit 0
elif [ "$call" = span ] || [ "$call" = span2 ]; then
  mkdir -p $fidw
  if [ "$call" = span ]; then
    [ -s $fidw/speedforge.jsonl ] || "${Fw[@]}" speedforge --config /tmp/fid-wall.yaml
    b=$(left "${L1_UNTIL:-400}"); [ "$b" -gt 30 ] && "${L1[@]}" "$b" --only sf-accepted
    b=$(left "${L2_UNTIL:-560}"); [ "$b" -gt 20 ] && "${L1[@]}" "$b" --run-label 2 --only accepted
  else
    [ -s $fidw/speedforge.2.jsonl ] || "${Fw[@]}" speedforge --config /tmp/fid-wall.yaml --run-label 2
    [ -s $fid/speedforge.2.jsonl ] || "${F[@]}" speedforge --run-label 2
  fi
  cp $fid/cuda_l1*.jsonl $fidw/ 2>/dev/null
  save; save $fidw fid-$call-wall
  "${Fw[@]}" report >"${OUT:-/tmp}/report-wall.txt" 2>&1; grep -E "^throughput|within" "${OUT:-/tmp}/report-wall.txt"
elif [ "$call" = l2off ]; then
  printf 'evaluator:\n  l2_flush_mb: 0\n' >/tmp/fid-l2off.yaml
  [ -s $fid/speedforge.jsonl ] || "${F[@]}" speedforge --config /tmp/fid-l2off.yaml; save
elif [ "$call" = wall ]; then
  [ -s $fid/speedforge.jsonl ] || "${F[@]}" speedforge --config /tmp/fid-wall.yaml; save
elif [ "$call" = 1 ]; then
  [ -s $fid/speedforge.jsonl ] || "${F[@]}" speedforge; save
  b=$(left 470); [ "$b" -gt 30 ] && "${L1[@]}" "$b" --only sf-accepted; save
  b=$(left 550); [ "$b" -gt 20 ] && "${L1[@]}" "$b" --run-label 2 --only accepted; save
elif [ "$call" = batch ]; then
  [ "${SESSION_GPU_TESTS:-1}" = 1 ] && gpu_tests
  [ -s $fid/speedforge.jsonl ] || "${F[@]}" speedforge --variants "${VARIANTS:-16}"; save
  b=$(left "${L1_UNTIL:-1000}"); [ "$b" -gt 30 ] && "${L1[@]}" "$b"; save
  for label in 2 3; do
    [ "$(left "${WARM_UNTIL:-1500}")" -gt "${WARM_SWEEP_S:-300}" ] || break
    [ -s $fid/speedforge.$label.jsonl ] || "${F[@]}" speedforge --variants "${VARIANTS:-16}" --run-label $label --warm-from 1
    save
  done
elif [ "$call" = session ]; then
  [ "${SESSION_GPU_TESTS:-1}" = 1 ] && gpu_tests
  [ -s $fid/speedforge.jsonl ] || "${F[@]}" speedforge; save
  b=$(left "${L1_UNTIL:-1250}"); [ "$b" -gt 30 ] && "${L1[@]}" "$b" --only sf-accepted; save
  b=$(left "${REPEAT_UNTIL:-1550}"); [ "$b" -gt 30 ] && "${F[@]}" repeat --repeats "${REPEATS:-3}" --budget-s "$b"; save
else
  b=$(left "${REST_UNTIL:-250}"); [ "$b" -gt 30 ] && "${L1[@]}" "$b"; save
  b=$(left "${REPEAT_UNTIL:-500}"); [ "$b" -gt 30 ] && "${F[@]}" repeat --repeats "${REPEATS:-5}" --budget-s "$b"; save
fi
"${F[@]}" report >"${OUT:-/tmp}/report.txt" 2>&1; tail -n 40 "${OUT:-/tmp}/report.txt"
