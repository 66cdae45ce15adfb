"""A LLaMA-style gated MLP: y = down(silu(gate(x)) * up(x)), three bias-free linear layers.

category: mlp, matmul, fused
The reference runs three GEMMs plus a SiLU pass and a multiply pass with full-size
temporaries; a faster version keeps the GEMMs in the library and fuses SiLU and the gating
multiply into one pass that writes the hidden activation once.

No fast candidate ships for the cuda family: the three GEMMs are almost all of the time, and
hand-written versions could not beat the reference by a margin the timing resolves on an H200
(docs/benchmarks/builtin-suite.md).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 16384
HIDDEN = 128
INTERMEDIATE = 1024


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
