"""Eight small linear layers indexed out of an nn.ModuleList: the reference's Python (range, len,
ModuleList.__getitem__'s isinstance and len) runs on every call."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n, depth):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(n, n) for _ in range(depth)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = F.relu(self.layers[i](x))
        return x


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256, 8]
