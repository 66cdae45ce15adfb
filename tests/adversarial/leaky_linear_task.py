"""A linear layer and a leaky ReLU through torch.nn.functional, which looks its kernel up in
torch._C._nn on every call."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return F.leaky_relu(self.fc(x), 0.01)


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return [512]
