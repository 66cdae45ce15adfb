"""Scaled ReLU of a 1024 x 1024 input: an output of 1M elements, whose timed calls are checked on a
random sample of them (speedforge.evaluator.correctness.TIMED_SAMPLE)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return [2.0]
