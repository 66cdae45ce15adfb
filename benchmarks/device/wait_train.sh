#!/usr/bin/env bash
# There: wait_train.sh SECONDS: wait while the detached train_check.sh runs (at most SECONDS of this
# call, or until a step fails), a progress line every 30 s, then its small results (no checkpoints:
# logs, metrics, held-out JSON and samples) into $OUT/train.tgz, which comes back with the call.
until=${1:-540}; dir=/tmp/gc/train
while pgrep -f '[t]rain_check.sh' >/dev/null && [ $SECONDS -lt "$until" ] && ! [ -s $dir/failed.txt ]; do
  sleep 30
  echo "[$(date +%H:%M:%S)] steps: $(paste -sd' ' $dir/times.txt 2>/dev/null)"
  grep -h '^grpo ' $dir/grpo.log 2>/dev/null | tail -n 1
done
pgrep -f '[t]rain_check.sh' >/dev/null && echo "train_check.sh: still running" || echo "train_check.sh: finished"
[ -s $dir/failed.txt ] && echo "failed: $(paste -sd' ' $dir/failed.txt)"
[ -d $dir ] || exit 0
for stage in sft grpo; do for f in $dir/work/*/$stage/metrics.jsonl; do [ -f "$f" ] && cp "$f" $dir/metrics-$stage.jsonl; done; done
cp /tmp/gc/train.log $dir/ 2>/dev/null
(cd /tmp/gc && tar czf "${OUT:-/tmp}/train.tgz" --exclude=train/store --exclude=train/work train)
tail -n 3 $dir/*.log 2>/dev/null | cut -c1-300 | tail -n 40
