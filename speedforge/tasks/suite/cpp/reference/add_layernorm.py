"""Residual add followed by LayerNorm over the last dimension: y = layer_norm(x + residual).

category: normalization, fused
The reference materialises x + residual and then runs the LayerNorm kernel over it; a fused
kernel adds, computes mean and variance, and normalises each row while it is in cache, so the
sum is never written to memory and read back.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average 2-3; 3 separate evaluations of fast/add_layernorm.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 3.14 | 1.81 | 1.74x |
| 2 | 3.06 | 1.85 | 1.65x |
| 3 | 3.34 | 2.02 | 1.65x |
| median | | | 1.65x |
"""

import torch
import torch.nn as nn

TOKENS = 2048
HIDDEN = 1024


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.add_(0.1 * torch.randn(hidden))
            self.norm.bias.add_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
