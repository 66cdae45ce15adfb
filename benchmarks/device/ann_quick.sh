#!/usr/bin/env bash
# The ANN benchmark in one short window on the 16-core GPU host (Python 3.12, no package
# index): SIFT-shaped clustered data at 1,000,000 vectors, 1,000 queries, 3 repeats, every library
# single-threaded and on all cores (bench_ann.py sweeps one thread and --threads in one run;
# --threads is nproc, not 0: 0 takes os.cpu_count(), which ignores a container's CPU set), in
# about ANN_QUICK_S (900 s) from the detached run's start. Not the full run (ann_scale_check.sh: three
# data sets, 30-60 min each); the same bench_ann.py, one data set, fewer libraries per run.
#
#   ann_quick.sh pack          here: .ann, the carried Python 3.12 x86-64 wheels (ignored; at most
#                              60 MiB, the working tree travels beside it), and .ann/manifest.txt
#   ann_quick.sh start         there: installs .ann's wheels to /tmp/site (once per machine), builds
#                              hnswlib (sdist, -march=native) and sfann (pip install -e .) side by
#                              side, checks the imports, then detaches the run (detach.sh ann-quick)
#   ann_quick.sh wait SECONDS  there: await.sh ann-quick (a log line every 20 s) for at most SECONDS;
#                              the results come back as $OUT/ann-quick.tgz and, once the run has
#                              ended, the merged table is printed (report)
#   ann_quick.sh report [DIR]  the merged table of the run's JSON files (bench_ann.py --merge), also
#                              to $OUT/ann_quick_report.txt; works here too on an unpacked tgz
#
# One window, each call at most 10 minutes, the machine kept ~30 s between calls:
#   run(command="bash benchmarks/device/ann_quick.sh start && bash benchmarks/device/ann_quick.sh wait 480",
#       carry=[".ann"], timeout_s=600)
#   run(command="bash benchmarks/device/ann_quick.sh wait 560", timeout_s=600)   # until "ended"
#
# What runs: one bench_ann.py run per stage (each makes the same seeded data, ~15 s; bench_ann.py
# builds all of a run's libraries before it sweeps any, and a --budget-s spent while building
# leaves that run no sweep at all, so the slow engines get runs of their own rather than a place
# at the end of one run for the budget to cut). A stage starts only while the time it needs is
# left of the window, and its --budget-s is what is left; a run still going at the window's end
# + ANN_QUICK_GRACE_S (120) is stopped (and leaves no JSON). Estimated at 1M on 16 threads from
# the 2-core box (100k vectors, 2 threads: sfann 7.5 s, hnswlib 9.6, glass 10.1, scann 7.7,
# usearch-f32 17.4, vsag-hgraph 18.7, vsag 32.3, ngt-onng 157; x 23 for 1M (hnswlib: 452 s on one
# thread at 1M), / 6.5 for 16 threads: about x 3.5), each +-50%:
#   core         sfann, glass, glass-sq4, hnswlib, usearch-i8   builds ~3 min, stage ~4 min (always)
#   more         scann, usearch-f32, sfann-fp32                builds ~2 min, stage ~3 min (>= 200 s left)
#   vsag-hgraph                                                build ~1 min, stage ~2 min (>= 180 s)
#   vsag         (hnsw)                                        build ~2 min, stage ~3 min (>= 240 s)
#   ngt-onng                                                   build ~9 min, stage ~10 min (>= 600 s):
#                                                              with the default 900 s window it is not run
# so the run ends after ~11-12 min (the window's 900 s at most, + 120 s grace). Results in
# ANN_QUICK_DIR (/tmp/ann-quick): ann_quick_<stage>.json, .txt (tables), .log (progress), and
# ann_quick_report.txt (all stages merged). faiss's 19 MB wheel would take .ann over 60 MiB, so it
# travels in a call of its own before `start` (`ann_quick.sh pack-faiss` here, then there
# `ann_quick.sh stash .ann-faiss` with carry [".ann-faiss"]): `start` installs what is stashed in
# /tmp/ann-stash too. Not here: diskann (no Python 3.12 wheel or sdist), ngt-qg (no package builds it).
#
# Knobs: ANN_QUICK_SHAPE (sift; glove or gist: bench_ann.py's --shapes, one a window), ANN_QUICK_N
# (1000000; a GIST-shaped million is 3.8 GB of vectors), ANN_QUICK_S (900), ANN_QUICK_GRACE_S, ANN_QUICK_THREADS (nproc),
# ANN_QUICK_STAGES (name:libraries:least seconds left[:shape[:n]], e.g. "core:sfann,glass:0 ngt:ngt-onng:600"
# or, two data sets in one window, "all:sfann,glass:0 gist:sfann,glass:300:gist:1000000"),
# ANN_QUICK_DIR, ANN_QUICK_SITE (/tmp/site), ANN_QUICK_CARRY (.ann), PY (python3; `pack`: .venv/bin/python).
set -u
cd "$(dirname "$0")/../.."
carry=${ANN_QUICK_CARRY:-.ann}
dir=${ANN_QUICK_DIR:-/tmp/ann-quick}
site=${ANN_QUICK_SITE:-/tmp/site}
name=ann-quick

# pinned as pyproject's ann-bench extra (faiss travels apart, see above); usearch loads numkong's
# library, ScaNN's protos need protobuf
libs=(scann==1.4.2 usearch==2.26.6 numkong==7.8.6 pyglass-portable==2.1.0 ngt==2.8.0.post1 pyvsag==0.18.5
      protobuf==6.33.6)
# installed there only where the image lacks them: bench_ann.py's psutil, usearch's tqdm, pyvsag's
# packaging, and the builds' pybind11 and setuptools
fillins=(psutil==7.2.2 tqdm==4.70.1 packaging==26.4 pybind11==3.1.0 setuptools==84.2.1)
always=(scann usearch numkong pyglass_portable ngt pyvsag protobuf)  # wheel name prefixes

pack() {
  local py=${PY:-.venv/bin/python}
  [ -x "$py" ] || py=python3
  if [ -s "$carry/manifest.txt" ] && (cd "$carry" && sha256sum -c --quiet manifest.txt >/dev/null 2>&1); then
    echo "pack: $carry is complete ($(du -sh "$carry" | cut -f1))"; return 0
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  local plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
              --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
              --platform manylinux2014_x86_64 --platform any)
  "$py" -m pip download -q "${plat[@]}" -d "$work" "${libs[@]}" "${fillins[@]}" || return 1
  # hnswlib has no wheel: its sdist, built there (pip reads its metadata with this Python's numpy
  # and pybind11)
  "$py" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$work" hnswlib==0.8.0 || return 1
  local bytes; bytes=$(du -cb "$work"/* | tail -1 | cut -f1)
  if [ "$bytes" -gt $(( 60 * 1024 * 1024 )) ]; then
    echo "pack: $bytes bytes, over 60 MiB: leave a library out"; ls -lS "$work"; return 1
  fi
  rm -rf "$carry" && mkdir "$carry" && cp "$work"/* "$carry"/
  (cd "$carry" && sha256sum -- * >"$work/manifest.txt") && cp "$work/manifest.txt" "$carry/"
  grep -qx "/${carry#./}/" .git/info/exclude 2>/dev/null || echo "/${carry#./}/" >>.git/info/exclude
  ls -lS "$carry" | awk 'NR > 1 {printf "%10d %s\n", $5, $9}'
  echo "pack: $carry $(du -cb "$carry"/* | tail -1 | cut -f1) bytes"
}

faiss_pin=faiss-cpu==1.15.1
stash_dir=/tmp/ann-stash

pack_faiss() {  # here: .ann-faiss, faiss's wheel alone (its own call's carry)
  local py=${PY:-.venv/bin/python}
  [ -x "$py" ] || py=python3
  rm -rf .ann-faiss && mkdir .ann-faiss
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    -d .ann-faiss "$faiss_pin" || return 1
  grep -qx "/.ann-faiss/" .git/info/exclude 2>/dev/null || echo "/.ann-faiss/" >>.git/info/exclude
  ls -l .ann-faiss
}

stash() {  # there: keep a carried folder's wheels for `start`, which installs them with .ann's
  local from=${1:?usage: ann_quick.sh stash FOLDER}
  ls "$from"/*.whl >/dev/null 2>&1 || { echo "stash: no wheel in $from (carry it on this call)"; return 1; }
  mkdir -p "$stash_dir" && cp "$from"/*.whl "$stash_dir"/ && echo "stash: $(ls "$stash_dir" | xargs)"
}

start() {
  local py=${PY:-python3}
  [ -s "$carry/manifest.txt" ] || { echo "start: no $carry/manifest.txt: run \`ann_quick.sh pack\` here and carry $carry"; return 1; }
  (cd "$carry" && sha256sum -c --quiet manifest.txt) || { echo "start: $carry does not match its manifest"; return 1; }
  if [ -f "/tmp/gc/$name.log" ] && [ ! -f "/tmp/gc/$name.rc" ]; then
    echo "start: $name is running already (ann_quick.sh wait SECONDS)"; return 0
  fi
  mkdir -p "$site" /tmp/gc
  export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
  if [ ! -f "$site/.ann-quick-installed" ]; then
    local t0=$SECONDS wheels=() spec mod
    for spec in "${always[@]}"; do wheels+=("$carry/$spec"-*.whl); done
    for spec in "$stash_dir"/*.whl; do [ -f "$spec" ] && wheels+=("$spec"); done  # faiss, when stashed
    for spec in "${fillins[@]}"; do
      mod=${spec%%==*}
      "$py" -c "import $mod" 2>/dev/null || wheels+=("$carry/$mod"-*.whl)
    done
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[@]}" \
      >/tmp/gc/ann-pip.log 2>&1 || { echo "start: installing the wheels failed"; tail -20 /tmp/gc/ann-pip.log; return 1; }
    echo "start: installed ${wheels[*]##*/} in $((SECONDS - t0)) s"
    "$py" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$site" \
      "$carry"/hnswlib-*.tar.gz >/tmp/gc/ann-hnswlib.log 2>&1 &
    local hnsw=$!
    if ! "$py" -c 'import speedforge._annengine' 2>/dev/null; then
      "$py" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/gc/ann-build.log 2>&1 \
        || { echo "start: building speedforge (sfann) failed"; tail -20 /tmp/gc/ann-build.log; wait $hnsw; return 1; }
    fi
    wait $hnsw || { echo "start: building hnswlib failed"; tail -20 /tmp/gc/ann-hnswlib.log; return 1; }
    echo "start: hnswlib and sfann built in $((SECONDS - t0)) s"
    touch "$site/.ann-quick-installed"
  fi
  "$py" - <<'EOF' || return 1
import importlib
for mod in ("speedforge._annengine", "hnswlib", "glass", "usearch.index", "scann.scann_ops.py.scann_ops_pybind",
            "ngtpy", "pyvsag", "faiss", "psutil"):
    try:
        m = importlib.import_module(mod)
        print(f"  {mod}: {getattr(m, '__file__', '?')}")
    except Exception as exc:  # bench_ann.py skips it with a note; say so now
        print(f"  {mod}: NOT importable ({type(exc).__name__}: {exc})")
importlib.import_module("speedforge._annengine")  # no run without our engine
EOF
  rm -rf "$dir"
  bash benchmarks/device/detach.sh "$name" bash benchmarks/device/ann_quick.sh run
}

run() {  # the detached part: the stages, while the window lasts
  local py=${PY:-python3} end=$(( $(date +%s) + ${ANN_QUICK_S:-900} )) status=0 shape=${ANN_QUICK_SHAPE:-sift}
  export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
  mkdir -p "$dir"
  stage() {  # $1: stage name, $2: --libs, $3: shape, $4: n; --budget-s is the time left in the window
    local left=$(( end - $(date +%s) )) shape=$3
    echo "== $1 ($2, $shape, n $4): $left s of the window left, $(date -u +%H:%M:%S) UTC"
    # the tables to .txt; the progress (stderr) to .log and to this run's log, which `wait` shows
    timeout $(( left + ${ANN_QUICK_GRACE_S:-120} )) "$py" benchmarks/bench_ann.py --shapes "$shape" --data clustered \
      --n "$4" --queries 1000 --repeats 3 --threads "${ANN_QUICK_THREADS:-$(nproc)}" --libs "$2" --budget-s "$left" \
      --json "$dir/ann_quick_${shape}_$1.json" 2>&1 >"$dir/ann_quick_${shape}_$1.txt" | tee "$dir/ann_quick_${shape}_$1.log"
    local rc=${PIPESTATUS[0]}
    echo "== $1: exit $rc$( [ "$rc" = 124 ] && echo ' (stopped at the end of the window; no JSON)')"
    grep '^# note' "$dir/ann_quick_${shape}_$1.txt"
    sed -n '/^# all data sets/,/^$/p' "$dir/ann_quick_${shape}_$1.txt"
    return $rc
  }
  # name:libraries:the least time left (s) to start it[:shape[:n]] (estimates at 1M on 16 threads in the header)
  local stages=${ANN_QUICK_STAGES:-"core:sfann,glass,glass-sq4,hnswlib,usearch-i8:0 more:scann,usearch-f32,sfann-fp32:200
    vsag-hgraph:vsag-hgraph:180 vsag:vsag:240 ngt-onng:ngt-onng:600"} spec stage_name libs need stage_shape stage_n
  for spec in $stages; do
    IFS=: read -r stage_name libs need stage_shape stage_n <<<"$spec"
    if [ $(( end - $(date +%s) )) -lt "$need" ]; then
      echo "== $stage_name ($libs): not run, under $need s of the window left"; continue
    fi
    stage "$stage_name" "$libs" "${stage_shape:-$shape}" "${stage_n:-${ANN_QUICK_N:-1000000}}" || status=1
  done
  OUT="" report "$dir" >/dev/null  # the report beside the JSON files (start's $OUT is gone by now)
  echo "== ended, $(date -u +%H:%M:%S) UTC"
  return $status
}

report() {
  local from=${1:-$dir} files=()
  local py=${PY:-python3}
  [ -x .venv/bin/python ] && [ -z "${PY:-}" ] && py=.venv/bin/python  # here
  for f in "$from"/ann_quick_*.json; do [ -s "$f" ] && files+=("$f"); done
  [ ${#files[@]} -gt 0 ] || { echo "report: no ann_quick_*.json in $from yet"; return 1; }
  PYTHONPATH="$site:$PWD" "$py" benchmarks/bench_ann.py --merge "${files[@]}" | tee "${OUT:-$from}/ann_quick_report.txt"
}

case ${1:-} in
  pack) pack ;;
  pack-faiss) pack_faiss ;;
  stash) stash "${2:-}" ;;
  start) start ;;
  run) run ;;
  wait)
    bash benchmarks/device/await.sh "$name" "${2:-540}" "$dir"
    if [ -f "/tmp/gc/$name.rc" ]; then report "$dir"; fi
    ;;
  report) report "${2:-}" ;;
  *) echo "usage: ann_quick.sh pack | pack-faiss | stash FOLDER | start | wait SECONDS | report [DIR]"; exit 2 ;;
esac
