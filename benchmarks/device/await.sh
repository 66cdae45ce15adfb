#!/usr/bin/env bash
# There: await.sh NAME SECONDS [FOLDER]: waits while the detached NAME (detach.sh) runs, at most
# SECONDS of this call, with its log's last line every 20 s; then says whether it ended (and its
# exit status) and packs FOLDER's small files (no stores, checkpoints or weights) into
# $OUT/NAME.tgz, which comes back with the call. AWAIT_LOG: the file whose last line shows progress
# (default the detached command's own log, /tmp/gc/NAME.log).
set -u
name=$1; until=${2:-540}; folder=${3:-}; progress=${AWAIT_LOG:-/tmp/gc/$name.log}
while [ ! -f "/tmp/gc/$name.rc" ] && [ $SECONDS -lt "$until" ]; do
  sleep 20
  echo "[$(date +%H:%M:%S)] $(tail -n 1 "$progress" 2>/dev/null | cut -c1-200)"
done
if [ -f "/tmp/gc/$name.rc" ]; then echo "$name: ended, exit $(cat "/tmp/gc/$name.rc")"; else echo "$name: still running"; fi
tail -n 40 "/tmp/gc/$name.log" 2>/dev/null | cut -c1-300
if [ -n "$folder" ] && [ -d "$folder" ]; then
  cp "/tmp/gc/$name.log" "$folder/" 2>/dev/null
  tar czf "${OUT:-/tmp}/$name.tgz" -C "$(dirname "$folder")" --exclude=store --exclude='checkpoint-*' --exclude=resume \
    --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='*.pth' --exclude='*.so' --exclude='*.o' \
    "$(basename "$folder")" && echo "packed $folder into $name.tgz ($(du -h "${OUT:-/tmp}/$name.tgz" | cut -f1))"
fi
