"""A matmul against a weight the reference owns."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        return torch.mm(x, self.weight)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
