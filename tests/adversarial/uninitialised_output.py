"""Returns uninitialised memory, hoping to pick up the reference's freed result (on a GPU the
caching allocator would hand it straight back, were the candidate not run first on NaN-filled memory).
screen: pass
runtime: incorrect
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        return torch.empty_like(x)
