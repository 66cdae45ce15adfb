"""Benchmark: staging 250 tasks + 250 candidates to the embedded S3, against a plain upload.

Generates a KernelBench-style checkout (250 reference programs over level1..level4) and 250
candidate files, starts SeaweedFS on 127.0.0.1, then times, in the same run and interleaved:

  plain-seq     boto3 put_object of every file, one object per file, one after another
  plain-par     the same with a pool of --threads uploads in flight (what staging uses)
  stage         import the checkout and candidates, stage them as a new data set version
  restage       stage the same content again (writes nothing: one list, one manifest read)

and prints the median and range over --reps repetitions, and the ratios of the medians to
plain-seq and plain-par.

    .venv/bin/python benchmarks/bench_staging.py [--tasks 250] [--reps 5] [--threads 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from speedforge.config import StoreConfig
from speedforge.records import Candidate
from speedforge.store.s3server import SeaweedServer
from speedforge.store.staging import stage_dataset
from speedforge.store import open_store
from speedforge.tasks.importers import import_source

REFERENCE = '''"""Generated task {i}: {op} over a {n}x{n} tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float = {scale}):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.{op}(x) * self.scale


def get_inputs():
    return [torch.randn({n}, {n})]


def get_init_inputs():
    return [{scale}]
{padding}'''
CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
{kernel}
"""
module = load_inline(name="gen_{i}", cpp_sources="torch::Tensor run(torch::Tensor x, double s);",
                     cuda_sources=cuda_source, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, scale: float = {scale}):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return module.run(x, self.scale)
'''
KERNEL_LINE = "__global__ void k{j}(const float* x, float* y, float s, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] * s + {j}; }}"  # noqa: E501
OPS = ("relu", "tanh", "sigmoid", "exp", "abs", "sin", "cos", "sqrt")


def generate(root: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """A KernelBench-style checkout (level1..level4) and a folder of candidate files."""
    rng = random.Random(seed)
    checkout, candidates = root / "kernelbench", root / "candidates"
    for i in range(count):
        level = 1 + i % 4
        name = f"{i + 1}_{OPS[i % len(OPS)].capitalize()}Scale"
        scale = round(rng.uniform(0.5, 2.0), 3)
        padding = "".join(f"# note {rng.getrandbits(64):016x}\n" for _ in range(rng.randint(10, 40)))
        folder = checkout / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.py").write_text(
            REFERENCE.format(i=i, op=OPS[i % len(OPS)], n=256 + i, scale=scale, padding=padding)
        )
        kernel = "\n".join(KERNEL_LINE.format(j=j) for j in range(rng.randint(20, 60)))
        (candidates / f"level{level}").mkdir(parents=True, exist_ok=True)
        (candidates / f"level{level}" / f"{name}.py").write_text(CANDIDATE.format(i=i, scale=scale, kernel=kernel))
    return checkout, candidates


def load_candidates(folder: Path) -> list[Candidate]:
    return [
        Candidate.make(f"kernelbench/{path.parent.name}/{path.stem}", path.read_text(), origin="bench", created_at=0.0)
        for path in sorted(folder.glob("level*/*.py"))
    ]


def plain_upload(client, bucket: str, prefix: str, files: list[Path], root: Path, threads: int) -> int:
    def put(path: Path) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(root).as_posix()}", Body=path.read_bytes())

    if threads <= 1:
        for path in files:
            put(path)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(put, files))
    return len(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=250, help="tasks, and as many candidates (default 250)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each measurement (default 5)")
    parser.add_argument("--threads", type=int, default=8, help="parallel uploads (default 8, as staging)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-staging-") as tmp:
        root = Path(tmp)
        checkout, cand_dir = generate(root / "src", args.tasks)
        files = sorted(checkout.glob("level*/*.py")) + sorted(cand_dir.glob("level*/*.py"))
        total_mb = sum(p.stat().st_size for p in files) / 1e6
        with SeaweedServer(root / "s3", bucket="bench") as server:
            client = server.client(max_pool_connections=max(10, args.threads))
            os.environ.update(server.env())  # open_store reads credentials the usual way
            config = StoreConfig(upload_threads=args.threads)
            times: dict[str, list[float]] = {"plain-seq": [], "plain-par": [], "stage": [], "restage": []}
            objects: dict[str, int] = {}
            for rep in range(args.reps):
                t0 = time.perf_counter()
                objects["plain-seq"] = plain_upload(client, "bench", f"plain-seq-{rep}", files, root / "src", 1)
                times["plain-seq"].append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                objects["plain-par"] = plain_upload(
                    client, "bench", f"plain-par-{rep}", files, root / "src", args.threads
                )
                times["plain-par"].append(time.perf_counter() - t0)

                for label in ("stage", "restage"):
                    t0 = time.perf_counter()
                    imported = import_source(str(checkout))
                    candidates = load_candidates(cand_dir)
                    store = open_store(f"s3://bench/staged-{rep}", config=config)
                    result = stage_dataset(
                        store,
                        "kb",
                        imported.tasks,
                        candidates,
                        source=str(checkout),
                        upload_threads=args.threads,
                        progress=False,
                    )
                    times[label].append(time.perf_counter() - t0)
                    objects[label] = result.objects_written
                    assert result.created == (label == "stage"), result
                    assert result.counts == {"tasks": args.tasks, "candidates": args.tasks}, result.counts

    print(
        f"{args.tasks} tasks + {args.tasks} candidates, {len(files)} files, {total_mb:.2f} MB; "
        f"SeaweedFS on 127.0.0.1; {args.reps} reps; {args.threads} upload threads where parallel"
    )
    seq, par = statistics.median(times["plain-seq"]), statistics.median(times["plain-par"])
    print(f"{'operation':<48}{'median s':>9}{'min s':>8}{'max s':>8}{'objects':>8}{'/ seq':>8}{'/ par':>8}")
    labels = {
        "plain-seq": "plain boto3 put, one object per file, serial",
        "plain-par": f"plain boto3 put, one per file, {args.threads} threads",
        "stage": "speedforge stage (import + parquet + manifest)",
        "restage": "speedforge re-stage, unchanged",
    }
    for key, label in labels.items():
        values = times[key]
        median = statistics.median(values)
        print(
            f"{label:<48}{median:>9.3f}{min(values):>8.3f}{max(values):>8.3f}{objects[key]:>8}"
            f"{median / seq:>8.3f}{median / par:>8.3f}"
        )


if __name__ == "__main__":
    main()
