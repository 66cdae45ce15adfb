"""relu(2x + y) on 4 MiB tensors: three temporaries a call."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x * 2 + y)


def get_inputs():
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]


def get_init_inputs():
    return []
