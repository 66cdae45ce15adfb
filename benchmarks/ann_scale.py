"""What bench_ann.py needs to run at a million vectors: exact neighbours found block by block,
the largest data set that fits in memory, and the peak resident memory of one build."""

from __future__ import annotations

import numpy as np


def _normalised(x):
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)


QUERY_BLOCK, BASE_BLOCK = 256, 65536  # ground truth: 64 MB of float32 scores at a time


def ground_truth(base, queries, k, metric, query_block=QUERY_BLOCK, base_block=BASE_BLOCK):
    """[Q x k] int64 ids of the exact k nearest base vectors of each query, nearest first, as
    speedforge.ann.groundtruth.exact_knn finds them (l2: squared distance; angular: cosine; ip:
    inner product), but a block of queries against a block of base vectors at a time, keeping
    the k best so far: memory ~ query_block x base_block scores and no copy of the base, so a
    million GIST-shaped vectors (3.8 GB) need no more than a thousand do."""
    n = len(base)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the number of base vectors ({n})")
    if metric == "angular":
        queries = _normalised(queries)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    norms = None
    if metric == "l2":  # |b|^2 of every base vector, summed in float64 a block at a time (no float64 copy)
        norms = np.concatenate(
            [
                np.einsum("ij,ij->i", b, b, dtype=np.float64).astype(np.float32)
                for b in (np.asarray(base[s : s + base_block], dtype=np.float32) for s in range(0, n, base_block))
            ]
        )
    out = np.empty((len(queries), k), dtype=np.int64)
    for qs in range(0, len(queries), query_block):
        q = queries[qs : qs + query_block]
        best_s = np.full((len(q), k), np.inf, dtype=np.float32)  # smaller is nearer
        best_i = np.zeros((len(q), k), dtype=np.int64)
        for bs in range(0, n, base_block):
            b = np.asarray(base[bs : bs + base_block], dtype=np.float32)
            if metric == "angular":
                b = _normalised(b)
            scores = q @ b.T
            if metric == "l2":  # |q|^2 is the same along a row
                scores = norms[None, bs : bs + len(b)] - 2.0 * scores
            else:
                scores = -scores
            kk = min(k, len(b))
            part = (
                np.argpartition(scores, kk - 1, axis=1)[:, :kk]
                if kk < len(b)
                else np.broadcast_to(np.arange(len(b)), (len(q), len(b)))
            )
            cand_s = np.concatenate([best_s, np.take_along_axis(scores, part, axis=1)], axis=1)
            cand_i = np.concatenate([best_i, part + bs], axis=1)
            keep = np.argpartition(cand_s, k - 1, axis=1)[:, :k]
            best_s, best_i = np.take_along_axis(cand_s, keep, axis=1), np.take_along_axis(cand_i, keep, axis=1)
        order = np.argsort(best_s, axis=1, kind="stable")
        out[qs : qs + len(q)] = np.take_along_axis(best_i, order, axis=1)
    return out


# fitting_n: bytes per base vector of a d-dimensional set, for the data (and the one copy a
# library may make while building) and for each library's index kept alive until the sweeps end
# (floats, often codes as well, and a graph of up to 64 neighbours).
FIT_DATA_COPIES, FIT_INDEX_COPIES, FIT_GRAPH_BYTES = 3.0, 1.5, 600
FIT_MEMORY_SHARE = 0.8  # of the memory available now
FIT_STEP = 50_000


def fitting_n(dim, libraries, available_bytes, cap=1_000_000):
    """The largest size (a multiple of FIT_STEP, at most `cap`) whose data and `libraries` indexes,
    all alive at once as bench_shape keeps them, fit in FIT_MEMORY_SHARE of `available_bytes`."""
    per_vector = 4 * dim * (FIT_DATA_COPIES + FIT_INDEX_COPIES * libraries) + FIT_GRAPH_BYTES * libraries
    n = int(FIT_MEMORY_SHARE * available_bytes / per_vector) // FIT_STEP * FIT_STEP
    return max(FIT_STEP, min(cap, n))


def reset_peak_rss():
    """Reset the kernel's peak resident size of this process (VmHWM; Linux: clear_refs 5).
    False where that cannot be done: the peak column then reads n/a."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss():
    """This process's peak resident size in bytes since the last reset (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
