"""RMSNorm as written in LLaMA: y = x * rsqrt(mean(x^2, dim=-1) + eps) * weight.

category: normalization
The reference runs six kernels (pow, mean, add, rsqrt and two multiplies), two of them
writing full-size temporaries; a fused kernel reads each row once for the sum of squares and
once more (from cache) to write the normalised row.
"""

import torch
import torch.nn as nn

TOKENS = 2048
HIDDEN = 2048
EPS = 1e-6


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, EPS]
