"""Caches outputs keyed by the identity (`id()`) of the input tensor object: stale results when
the same object comes back holding new values.
screen: pass
runtime: incorrect
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.cache = {}

    def forward(self, x):
        key = id(x)
        if key not in self.cache:
            self.cache[key] = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
        return self.cache[key].clone()
