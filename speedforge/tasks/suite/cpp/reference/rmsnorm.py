"""RMSNorm as written in LLaMA: y = x * rsqrt(mean(x^2, dim=-1) + eps) * weight.

category: normalization
The reference runs six kernels (pow, mean, add, rsqrt and two multiplies), two of them
writing full-size temporaries; a fused kernel reads each row once for the sum of squares and
once more (from cache) to write the normalised row.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average 2-3; 3 separate evaluations of fast/rmsnorm.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 8.81 | 2.56 | 3.44x |
| 2 | 9.25 | 2.57 | 3.60x |
| 3 | 8.52 | 2.76 | 3.09x |
| median | | | 3.44x |
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
