"""A stem convolution block for inference: 3x3 Conv2d on RGB input, BatchNorm2d, ReLU.

category: convolution, normalization, fused
The reference runs the convolution, a batch-norm pass and a ReLU pass; at inference the batch
norm is an affine map per output channel, so it can be folded into the convolution's weights
and bias, leaving one convolution and one in-place ReLU.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
IN_CHANNELS = 3
OUT_CHANNELS = 32
SIZE = 64
KERNEL = 3
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", 0.5 + torch.rand(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = F.batch_norm(
            y, self.running_mean, self.running_var, self.bn_weight, self.bn_bias, training=False, eps=self.eps
        )
        return torch.relu(y)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL, EPS]
