"""Swish with a slope: y = x * sigmoid(beta * x), element-wise over a large tensor.

category: elementwise
The reference makes three passes over memory (beta * x, sigmoid, multiply) and allocates two
temporaries; a fused kernel reads x once, writes y once and evaluates the sigmoid in registers.
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
