"""A float32 matmul of about 2 ms a call on the 2-core box: long enough for the checks on CPU time
(speedforge.evaluator.timing.COMPANY_MIN_S) over a few timed calls."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        return torch.mm(x, self.weight)


def get_inputs():
    return [torch.randn(256, 768)]


def get_init_inputs():
    return [768]
