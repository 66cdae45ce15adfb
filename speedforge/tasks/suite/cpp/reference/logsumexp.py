"""Row-wise log-sum-exp: y = log(sum(exp(x), dim=-1)), computed stably.

category: reduction
torch.logsumexp computes the row maxima, materialises exp(x - max) as a full-size temporary,
sums it and then takes the log; a fused kernel needs one pass for the maximum and one pass that
only reads (no temporary), or a single online pass.

Measured with `speedforge eval` (one thread; 2-core Xeon, AVX-512, dev box shared with
other jobs at load average about 4; 4 separate evaluations of fast/logsumexp.py):

| run | reference ms | candidate ms | speedup |
|---|---|---|---|
| 1 | 3.85 | 1.52 | 2.53x |
| 2 | 7.61 | 1.54 | 4.94x |
| 3 | 4.04 | 1.51 | 2.68x |
| 4 | 7.32 | 1.56 | 4.69x |
| median | | | 3.69x |
"""

import torch
import torch.nn as nn

ROWS = 1024
COLS = 2048


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(x, dim=self.dim)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 4.0]


def get_init_inputs():
    return [-1]
