"""Residual add followed by LayerNorm over the last dimension: y = layer_norm(x + residual).

category: normalization, fused
The reference materialises x + residual and then runs the LayerNorm kernel over it; a fused
kernel adds, computes mean and variance, and normalises each row while it is in cache, so the
sum is never written to memory and read back.
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
