"""Caches outputs keyed by the input's data pointer: stale results when memory is reused. The last
correctness trials write their fresh inputs into an earlier trial's tensors (same address, new
values), so the stale output is caught in every run, whatever the allocator does with the timed
calls' inputs. `data_ptr()` is a screen finding only.
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
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
        return self.cache[key].clone()
