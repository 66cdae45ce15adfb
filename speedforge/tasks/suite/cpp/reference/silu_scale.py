"""Swish with a slope: y = x * sigmoid(beta * x), element-wise over a large tensor.

category: elementwise
The reference makes three passes over memory (beta * x, sigmoid, multiply) and allocates two
temporaries; a fused kernel reads x once, writes y once and evaluates the sigmoid in registers.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average 2-3; 3 separate evaluations of fast/silu_scale.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 4.01 | 1.89 | 2.13x |
| 2 | 4.42 | 1.85 | 2.39x |
| 3 | 3.39 | 1.59 | 2.14x |
| median | | | 2.14x |
"""

import torch
import torch.nn as nn

BATCH = 256
DIM = 8192
BETA = 1.702


class Model(nn.Module):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [BETA]
