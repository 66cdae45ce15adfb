"""A depthwise-separable block's first half for inference: depthwise 3x3 Conv2d, BatchNorm2d, ReLU.

category: convolution, normalization, fused
A depthwise convolution does only K*K multiply-adds per output, so the block is bound by
memory traffic: the reference makes three passes (convolution, batch norm, ReLU) over the
activations. Folding the batch norm into the per-channel filters and computing each output
directly (its K*K inputs come from cache) with the ReLU applied before the store leaves a single
read and a single write of the activations.

No fast candidate ships for the cuda family: a hand-written direct kernel could not beat cuDNN's
depthwise kernel plus two element-wise passes on an H200 (docs/benchmarks/builtin-suite.md); a
faster one needs shared-memory tiling of the input planes.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
CHANNELS = 128
SIZE = 112
KERNEL = 3
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=False)
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(channels))
        self.register_buffer("running_var", 0.5 + torch.rand(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = F.batch_norm(
            y, self.running_mean, self.running_var, self.bn_weight, self.bn_bias, training=False, eps=self.eps
        )
        return torch.relu(y)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS, KERNEL, EPS]
