"""Writes a file outside its private temp dir (file access is a screen finding only: Landlock refuses it).
screen: pass
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
