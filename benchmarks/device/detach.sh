#!/usr/bin/env bash
# There: detach.sh NAME COMMAND...: runs COMMAND detached from the call (setsid), so that it
# outlives the call's 10-minute limit while later calls wait for it (await.sh NAME) on the same warm
# machine. Its output goes to /tmp/gc/NAME.log and its exit status, once it ends, to /tmp/gc/NAME.rc.
# PYTHONPATH gets /tmp/site (install.sh's packages); NVLink multicast stays off (KINDS.md).
#   bash benchmarks/device/detach.sh multigpu bash benchmarks/gpu_check.sh multigpu
set -u
[ $# -ge 2 ] || { echo "usage: detach.sh NAME COMMAND..." >&2; exit 2; }
name=$1; shift
mkdir -p /tmp/gc && rm -f "/tmp/gc/$name.rc"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SPEEDFORGE_CACHE=${SPEEDFORGE_CACHE:-/tmp/speedforge-cache} \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
setsid nohup bash -c '"$@"; echo $? >"/tmp/gc/'"$name"'.rc"' detached "$@" >"/tmp/gc/$name.log" 2>&1 </dev/null &
echo "detached $name (pid $!): $*"
