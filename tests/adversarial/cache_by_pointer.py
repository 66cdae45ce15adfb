"""Caches outputs keyed by the input's data pointer: stale results when memory is reused.
Whether the allocator reuses an address is not up to the test: when it does, the stale output
is caught (incorrect); when it never does, the cache never hits and the candidate does the
reference's work plus a copy, so it cannot look faster. `data_ptr()` is a screen finding only.
screen: pass
runtime: incorrect|ok
honest_speed: true
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
        return self.cache[key].clone()
