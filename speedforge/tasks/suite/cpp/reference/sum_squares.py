"""Sum of squares over the middle dimension of a [batch, dim, seq] tensor: y = sum(x * x, dim=1).

category: reduction
The reference squares into a full-size temporary and then reduces it; a fused kernel squares
while it accumulates, reading x once. Reducing the middle dimension means the contiguous axis
(seq) is kept, so a good kernel accumulates whole rows of seq at a time.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average 2-3; 3 separate evaluations of fast/sum_squares.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 1.35 | 0.39 | 3.46x |
| 2 | 1.40 | 0.40 | 3.50x |
| 3 | 1.27 | 0.34 | 3.71x |
| median | | | 3.50x |
"""

import torch
import torch.nn as nn

BATCH = 16
DIM = 256
SEQ = 512


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x * x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, DIM, SEQ)]


def get_init_inputs():
    return [1]
