"""Brings its own smaller inputs and a changed hyperparameter, and only computes half the rows.
screen: pass
runtime: incorrect
"""
import torch
import torch.nn as nn

batch = 8


def get_inputs():
    return [torch.randn(batch, 64)]


def get_init_inputs():
    return [1.0]


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        half = x[: x.shape[0] // 2]
        out = torch.zeros_like(x)
        out[: half.shape[0]] = torch.relu(half) * self.scale + half.sum(dim=1, keepdim=True) * 0.01
        return out
