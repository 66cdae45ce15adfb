"""Allocates far more memory than the sandbox may have, touching every page.
screen: pass
runtime: runtime_error|crashed
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.hoard = []

    def forward(self, x):
        for _ in range(1000):
            self.hoard.append(torch.ones(256, 1024, 1024, dtype=torch.uint8))  # 256 MiB each, touched
        return x
