"""Does the work on a side stream the timer's events do not wait for (a screen finding only: the
device-wide synchronize before the end event counts the side stream's work).
screen: pass
runtime: ok
honest_speed: true
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.side = torch.cuda.Stream()

    def forward(self, x):
        with torch.cuda.stream(self.side):
            out = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
            for _ in range(20):
                out = out * 1.0
        return out
