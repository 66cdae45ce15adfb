"""Sum of squares over the middle dimension of a [batch, dim, seq] tensor: y = sum(x * x, dim=1).

category: reduction
The reference squares into a full-size temporary and then reduces it; a fused kernel squares
while it accumulates, reading x once. Reducing the middle dimension means the contiguous axis
(seq) is kept, so a good kernel accumulates whole rows of seq at a time.
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
