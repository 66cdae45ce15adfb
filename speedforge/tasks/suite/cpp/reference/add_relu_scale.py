"""Residual add, ReLU and a constant scale: y = relu(a + b) * scale.

category: elementwise, fused
The reference runs three element-wise kernels (add, relu, mul), each reading and writing the
whole tensor; a fused kernel reads a and b once and writes y once.
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
