"""A float32 matmul of a few milliseconds a call: longer than a scheduler time slice."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        return torch.mm(x, self.weight)


def get_inputs():
    return [torch.randn(512, 1024)]


def get_init_inputs():
    return [1024]
