"""Residual add, ReLU and a constant scale: y = relu(a + b) * scale.

category: elementwise, fused
The reference runs three element-wise kernels (add, relu, mul), each reading and writing the
whole tensor; a fused kernel reads a and b once and writes y once.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average 2-3; 3 separate evaluations of fast/add_relu_scale.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 3.72 | 1.59 | 2.34x |
| 2 | 3.95 | 1.56 | 2.53x |
| 3 | 3.87 | 1.55 | 2.49x |
| median | | | 2.49x |
"""

import torch
import torch.nn as nn

BATCH = 256
DIM = 8192
SCALE = 0.5


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a + b) * self.scale


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [SCALE]
