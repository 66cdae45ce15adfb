#!/usr/bin/env bash
# The ANN benchmark at scale, for the 16-core host: every ANN library (sfann, hnswlib, faiss HNSW, ScaNN,
# USearch, GLASS, NGT ONNG, VSAG, DiskANN; NGT-QG is noted as unbuildable) in one run per data
# set, single-threaded and on all cores, at least 3 interleaved repeats per point, at 1,000,000
# SIFT- and GloVe-shaped vectors and the largest GIST-shaped size whose data and indexes fit in
# memory (bench_ann.py --n gist=auto). Run from the repository root:
#
#   bash benchmarks/ann_scale_check.sh [sift] [glove] [gist] [report]     (no arguments: all)
#
# Each data set is its own stage (one bench_ann.py run, all libraries, its own --budget-s), so a
# machine whose commands are cut after some minutes can take one stage per call; `report` merges
# the stages' JSON files found in $OUT and prints the table, the ratios to the best other library
# (QPS at recall 0.90 and AUC over [0.85, 0.95], per thread count), and the targets (bench_ann.verdict).
# gpu_check.sh's `ann-scale` stage runs this after installing the carried wheels. The host has no
# package index and runs Python 3.12: fetch its wheels here first, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 \
#     -d wheels pyglass-portable==2.1.0 ngt==2.8.0.post1 pyvsag==0.18.5
# (with hnswlib, faiss-cpu, scann and usearch). diskannpy has no Python 3.12
# wheel and no sdist on the index, so DiskANN is skipped there with a note unless built from source.
#
# Knobs (environment): OUT (default /tmp/ann_scale), PY, ANN_SCALE_N (SIFT and GloVe, default
# 1000000), ANN_SCALE_GIST_N (default auto), ANN_SCALE_DATA (default clustered; clustered,uniform
# for both kinds), ANN_SCALE_QUERIES (1000), ANN_SCALE_REPEATS (3), ANN_SCALE_THREADS (0: all
# cores), ANN_SCALE_LIBS (default: all), ANN_SCALE_BUDGET_S (per stage, default 3000; the stage
# is killed at that + 1800 s, so a build started just before the budget ends still finishes),
# ANN_SCALE_ARGS (more bench_ann.py options; `--build-grid` builds GLASS, VSAG and DiskANN at
# every point of their ann-benchmarks build ladders: about 20 more builds).
# A stage at 1M vectors builds about 13 indexes (the slowest, NGT's ONNG and VSAG's hnsw, take
# minutes each): expect 30-60 min per stage on 16 cores. Where one command may not run that long,
# start a stage detached and read $OUT/ann_scale_<stage>.log later:
#   nohup bash benchmarks/ann_scale_check.sh sift >/tmp/ann_scale_sift.out 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ann_scale}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(sift glove gist report)
budget=${ANN_SCALE_BUDGET_S:-3000}
libs=${ANN_SCALE_LIBS:-}

run_stage() {  # $1: shape, $2: size
  local shape=$1 n=$2
  echo "== $shape: n=$n, data ${ANN_SCALE_DATA:-clustered}, budget ${budget}s, $(date -u +%H:%M) UTC" >&2
  timeout $((budget + 1800)) $PY benchmarks/bench_ann.py --shapes "$shape" --n "$shape=$n" \
    --data "${ANN_SCALE_DATA:-clustered}" --queries "${ANN_SCALE_QUERIES:-1000}" \
    --repeats "${ANN_SCALE_REPEATS:-3}" --threads "${ANN_SCALE_THREADS:-0}" --budget-s "$budget" \
    ${libs:+--libs "$libs"} ${ANN_SCALE_ARGS:-} --json "$OUT/ann_scale_$shape.json" \
    >"$OUT/ann_scale_$shape.txt" 2>"$OUT/ann_scale_$shape.log"
  local rc=$?
  echo "== $shape: exit $rc ($OUT/ann_scale_$shape.txt, .log, .json)" >&2
  tail -n 30 "$OUT/ann_scale_$shape.txt"
  return $rc
}

status=0
for stage in "${stages[@]}"; do
  case $stage in
    sift|glove) run_stage "$stage" "${ANN_SCALE_N:-1000000}" || status=1 ;;
    gist) run_stage gist "${ANN_SCALE_GIST_N:-auto}" || status=1 ;;
    report)
      files=()
      for shape in sift glove gist; do
        [ -s "$OUT/ann_scale_$shape.json" ] && files+=("$OUT/ann_scale_$shape.json")
      done
      if [ ${#files[@]} -eq 0 ]; then
        echo "report: no ann_scale_*.json in $OUT yet; run the sift, glove and gist stages first" >&2
        status=1
      else
        $PY benchmarks/bench_ann.py --merge "${files[@]}" | tee "$OUT/ann_scale_report.txt" || status=1
      fi
      ;;
    *) echo "unknown stage $stage (sift, glove, gist, report)" >&2; exit 2 ;;
  esac
done
exit $status
