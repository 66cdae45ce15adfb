"""Seeds a candidate cannot learn from what it is given.

A candidate sees the seed its model is built under (torch.initial_seed() in its constructor:
reference and candidate are built under one seed, as KernelBench and CUDA-L1 build them) and, in
the ann family, the seed its index is built with. Whatever the harness draws from a seed the
candidate knows, the candidate can draw too, in its untimed constructor or build, and then
answer from stored results: a cpp candidate that rebuilt every trial's and timed call's inputs
from its construction seed read `ok` at 1.8-1.95x (tests/adversarial/predicts_inputs_from_seed.py).
So what the harness draws for the measurement (inputs, pair order) comes from `hidden_seed`, and
what it hands the candidate comes from another.
"""

from __future__ import annotations

import hashlib
import secrets


def hidden_seed(seed: int, fixed: int | None, purpose: str, bits: int = 62) -> int:
    """A seed of `bits` bits for `purpose`, unrelated to `seed` (the job's, which its job.json
    holds and the construction reveals): a fresh secret one, drawn in the sandbox before the
    candidate loads and kept nowhere else, unless the evaluator's seed is fixed (config.seed, to
    reproduce a run), which then fixes this one as a hash of `seed` and `purpose`. A fixed seed is
    for debugging: an informed candidate can compute that hash too."""
    if fixed is None:
        return secrets.randbits(bits)
    digest = hashlib.blake2b(f"{seed}:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (1 << bits)
