"""Matrix product, bias add and tanh-approximated GELU: y = gelu(x @ W + b).

category: matmul, fused
The reference runs the product, then a bias-add pass and a GELU pass, each with a full-size
temporary; a faster version keeps the product in a library GEMM and applies bias and GELU in
one pass over its output, in place.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2048
IN_FEATURES = 128
OUT_FEATURES = 1024


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features**0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.matmul(x, self.weight) + self.bias, approximate="tanh")


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
