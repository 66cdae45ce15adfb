#!/usr/bin/env bash
# There: benchmarks/train_check.sh detached from the call (through detach.sh), so that it outlives the
# call's 10-minute limit while later calls wait for it (wait_train.sh) on the same warm machine. Output
# in /tmp/gc (train_check.sh's OUT), its log in /tmp/gc/train.log. The settings of the last recorded runs
# (docs/benchmarks/training.md) are the defaults; every TRAIN_* knob of train_check.sh passes through, and:
#   TRAIN_CORPUS (default /tmp/stash/a100.jsonl, as install.sh stashed it)
#   GENERATE_DTYPE (e.g. float32: the held-out checks' weights, written into config.yaml once it exists;
#                   float32 generated 1.6x the tokens/s of bf16 at batch 128 on the H100)
cd "$(dirname "$0")/../.."
OUT=/tmp/gc TRAIN_CORPUS=${TRAIN_CORPUS:-/tmp/stash/a100.jsonl} TRAIN_MAX_NEW_TOKENS=${TRAIN_MAX_NEW_TOKENS:-3072} \
  TRAIN_BUILD_WORKERS=${TRAIN_BUILD_WORKERS:-12} TRAIN_OVERLAP=${TRAIN_OVERLAP:-1} TRAIN_PROMPTS=${TRAIN_PROMPTS:-4} \
  TRAIN_GRPO_LR=${TRAIN_GRPO_LR:-1.0e-5} TRAIN_HELDOUT_TIMEOUT=${TRAIN_HELDOUT_TIMEOUT:-900} \
  TRAIN_SFT_TIMEOUT=${TRAIN_SFT_TIMEOUT:-600} TRAIN_GRPO_SECONDS=${TRAIN_GRPO_SECONDS:-1170} \
  TRAIN_GRPO_GRACE=${TRAIN_GRPO_GRACE:-480} bash benchmarks/device/detach.sh train bash benchmarks/train_check.sh
if [ -n "${GENERATE_DTYPE:-}" ]; then
  for _ in $(seq 60); do [ -f /tmp/gc/train/config.yaml ] && break; sleep 1; done
  sed -i "s/^policy:\$/policy:\n  dtype: $GENERATE_DTYPE/" /tmp/gc/train/config.yaml && grep -A1 '^policy:' /tmp/gc/train/config.yaml
fi
echo "train_check.sh launched: $(pgrep -f '[t]rain_check.sh' | paste -sd' ')"
