"""Multiply a matrix on the left by a diagonal matrix: y = diag(a) @ B.

category: matmul
The reference materialises the N x N diagonal matrix and runs a dense O(N^2 M) matrix product
on it; the same result is each row of B scaled by one entry of a, an O(N M) pass.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average 2-3; 3 separate evaluations of fast/diag_matmul.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 13.94 | 0.58 | 23.88x |
| 2 | 14.20 | 0.67 | 21.08x |
| 3 | 13.87 | 0.60 | 22.99x |
| median | | | 22.99x |
"""

import torch
import torch.nn as nn

N = 1024
M = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.diag(a) @ b


def get_inputs():
    return [torch.randn(N), torch.randn(N, M)]


def get_init_inputs():
    return []
