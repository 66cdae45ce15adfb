"""Writes a file outside its private temp dir.
screen: reject
runtime: runtime_error
"""
import torch.nn as nn

with open("/tmp/speedforge-escape-probe.txt", "w") as f:
    f.write("escaped")


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        return x
