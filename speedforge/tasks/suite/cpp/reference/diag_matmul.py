"""Multiply a matrix on the left by a diagonal matrix: y = diag(a) @ B.

category: matmul
The reference materialises the N x N diagonal matrix and runs a dense O(N^2 M) matrix product
on it; the same result is each row of B scaled by one entry of a, an O(N M) pass.
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
