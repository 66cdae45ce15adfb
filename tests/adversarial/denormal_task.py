"""Products in the subnormal range: slow on x86 unless denormals are flushed to zero."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return x * y * 0.5


def get_inputs():
    return [torch.randn(1024, 1024) * 1e-20, torch.randn(1024, 1024) * 1e-19]


def get_init_inputs():
    return []
