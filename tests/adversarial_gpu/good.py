"""An honest candidate.
screen: pass
runtime: ok
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.addcmul(x.sum(dim=1, keepdim=True) * 0.01, torch.relu(x), torch.tensor(self.scale, device=x.device))
