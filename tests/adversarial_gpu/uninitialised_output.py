"""Returns uninitialised device memory, hoping the caching allocator hands it the reference's
freed result.
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
