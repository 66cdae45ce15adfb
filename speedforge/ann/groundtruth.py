"""Exact k nearest neighbours by blocked brute force, and recall@k against them."""

from __future__ import annotations

import numpy as np

from speedforge.ann.datasets import DatasetError, check_metric, check_vectors


def _normalised(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def exact_knn(base: np.ndarray, queries: np.ndarray, k: int, metric: str = "l2", block: int = 256) -> np.ndarray:
    """[Q x k] int64 ids of the exact k nearest base vectors of each query, nearest first.

    l2: squared Euclidean; ip: largest inner product; angular: largest cosine.
    """
    check_metric(metric)
    base = check_vectors(base, "base vectors")
    queries = check_vectors(queries, "queries", dim=base.shape[1])
    if not 1 <= k <= base.shape[0]:
        raise DatasetError(f"k={k} must be between 1 and the number of base vectors ({base.shape[0]})")
    if metric == "angular":
        base, queries = _normalised(base), _normalised(queries)
    base_sq = (base.astype(np.float64) ** 2).sum(axis=1).astype(np.float32) if metric == "l2" else None
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for start in range(0, queries.shape[0], block):
        q = queries[start : start + block]
        scores = q @ base.T  # larger is nearer for ip / angular
        if metric == "l2":
            scores = base_sq[None, :] - 2.0 * scores  # |q|^2 is constant per row
        else:
            scores = -scores
        part = (
            np.argpartition(scores, k - 1, axis=1)[:, :k] if k < base.shape[0] else np.tile(np.arange(k), (len(q), 1))
        )
        order = np.argsort(np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
        out[start : start + block] = np.take_along_axis(part, order, axis=1)
    return out


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """Mean over queries of |found[:k] ∩ truth[:k]| / k."""
    found = np.asarray(found)[:, :k]
    truth = np.asarray(truth)[:, :k]
    if found.shape[0] != truth.shape[0]:
        raise ValueError(f"found has {found.shape[0]} rows, truth {truth.shape[0]}")
    hits = sum(len(np.intersect1d(f, t, assume_unique=False)) for f, t in zip(found, truth))
    return hits / (k * found.shape[0])
