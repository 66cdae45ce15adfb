"""The CPU's buffer rotation: each timed pair's inputs and outputs stay alive for the next
cpu_rotation_pairs pairs (inside the sandbox, speedforge.evaluator.timing).

Where a tensor lands in physical memory changes how fast a memory-bound kernel runs on it (cache
sets, pages), and a process that frees and reallocates the same sizes gets the same blocks back
on every call: each sandbox then measured the one placement it happened to get. The same cpp
kernel gave 1.14x-1.45x over 10 processes, each steady within itself; with 8 pairs kept alive,
so that each call runs on other blocks than the last 8 did, 1.25x-1.31x with the same mean
(docs/benchmarks/defaults.md). The rotation's size is set by the largest pair so far: as many
pairs as fit in cpu_rotation_mb. The GPU keeps nothing.
"""

from __future__ import annotations

import collections

from speedforge.evaluator.correctness import flatten


class Rotation:
    def __init__(self, torch, config, is_cuda: bool) -> None:
        self.torch, self.config, self.is_cuda = torch, config, is_cuda
        self.kept: collections.deque | None = None
        self.pair_bytes = 0

    def keep(self, pair: list) -> None:
        """Keep a pair's tensors (nested lists and tuples of them) alive; the oldest pair goes once
        the rotation is full."""
        if self.is_cuda:
            return
        tensors = [t.detach() for t in flatten(self.torch, pair)]  # the memory only, not an autograd graph
        nbytes = sum(t.untyped_storage().nbytes() for t in tensors)
        if self.kept is None or nbytes > self.pair_bytes:  # sized on the largest pair so far (a timed pair
            self.pair_bytes = nbytes  # with untimed calls' inputs is larger than a warm-up pair)
            fits = (int(self.config.cpu_rotation_mb) << 20) // max(nbytes, 1)
            self.kept = collections.deque(self.kept or (), maxlen=min(int(self.config.cpu_rotation_pairs), fits))
        self.kept.append(tensors)

    def filling(self) -> bool:
        """Whether the rotation has room for more pairs (warm-up goes on until it is full)."""
        return self.kept is not None and len(self.kept) < (self.kept.maxlen or 0)
