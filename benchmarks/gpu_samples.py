#!/usr/bin/env python3
"""A line per GPU from a file of nvidia-smi samples, as benchmarks/multigpu_check.sh's sampler
writes them during a GRPO run: which processes were on the GPU, and how busy it was while the run
held it.

    python3 benchmarks/gpu_samples.py /tmp/gpu_check/multigpu/gpu-samples-w2.txt [--held-mib 1024]

Each sample is two kinds of line, each after a timestamp:
    2026-11-27T05:49:42 app, 7525, GPU-85283b1f-..., 14524 MiB      (--query-compute-apps=pid,gpu_uuid,used_memory)
    2026-11-27T05:49:42 gpu, 0, GPU-85283b1f-..., 12 %, 1980 MHz, 120.5 W   (--query-gpu=index,uuid,utilization.gpu,...)

A GPU is named as a rank's `gpu` field names it (speedforge.train.stages.model_device): its UUID
without "GPU-", first 8 characters. "held" samples are those where some process had at least
--held-mib MiB on the GPU: the run's model was loaded there, so they leave out start-up and the
idle time between runs. Their median utilization.gpu is what says whether the GPU or the host
bounded the run (a decode loop that launches kernels faster than the GPU runs them keeps it near
100%; one bound by the host leaves it idle most of the time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field


@dataclass
class GpuSamples:
    index: str = "?"
    pids: set[str] = field(default_factory=set)
    utilization: dict[str, float] = field(default_factory=dict)  # timestamp -> utilization.gpu %
    held_at: set[str] = field(default_factory=set)  # timestamps where a process held >= held_mib


def _number(text: str) -> float | None:
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def read(lines: list[str], held_mib: float = 1024) -> dict[str, GpuSamples]:
    """GPU (UUID's first 8 characters, lower case) -> its samples; lines of other shapes (an
    nvidia-smi error, a cut line) are skipped."""
    gpus: dict[str, GpuSamples] = {}
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        head = f[0].split()
        if len(f) < 4 or len(head) != 2 or not f[2].startswith("GPU-"):
            continue
        stamp, kind = head
        gpu = gpus.setdefault(f[2][4:12].lower(), GpuSamples())
        if kind == "app":
            gpu.pids.add(f[1])
            mib = _number(f[3])
            if mib is not None and mib >= held_mib:
                gpu.held_at.add(stamp)
        elif kind == "gpu":
            gpu.index = f[1]
            util = _number(f[3])
            if util is not None:
                gpu.utilization[stamp] = util
    return gpus


def summary(gpus: dict[str, GpuSamples]) -> list[str]:
    lines = []
    for name, gpu in sorted(gpus.items(), key=lambda kv: (len(kv[1].index), kv[1].index)):
        pids = " ".join(sorted(gpu.pids, key=lambda p: (len(p), p))) or "none"
        all_util = list(gpu.utilization.values())
        held = [u for stamp, u in gpu.utilization.items() if stamp in gpu.held_at]
        load = f"{len(all_util)} samples"
        if held:
            load += (
                f", {len(held)} while the run held it: utilization.gpu median {statistics.median(held):.0f}%, "
                f"mean {statistics.mean(held):.0f}%"
            )
        elif all_util:
            load += ", none while a process held it"
        lines.append(f"gpu {gpu.index} ({name}): pids {pids}; {load}")
    return lines or ["gpu samples: none"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", help="the sampler's output (gpu-samples-*.txt)")
    parser.add_argument(
        "--held-mib",
        type=float,
        default=1024,
        help="a sample counts as held when a process had at least this many MiB on the GPU (1024)",
    )
    args = parser.parse_args(argv)
    try:
        with open(args.file, errors="replace") as f:
            lines = f.readlines()
    except OSError as exc:
        print(f"gpu samples: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    print("\n".join(summary(read(lines, args.held_mib))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
