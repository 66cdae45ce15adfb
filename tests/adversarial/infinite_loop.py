"""Never returns.
screen: pass
runtime: timeout
"""
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        while True:
            pass
