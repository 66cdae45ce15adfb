"""A bfloat16 matmul: on the CPU its speed depends on oneDNN (torch.backends.mkldnn.enabled)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n, dtype=torch.bfloat16) / n ** 0.5)

    def forward(self, x):
        return torch.mm(x, self.weight)


def get_inputs():
    return [torch.randn(64, 256, dtype=torch.bfloat16)]


def get_init_inputs():
    return [256]
