"""Captures its first call in a CUDA graph and replays the graph on every later call without copying
the new input into the graph's static input, returning copies of a stale result (CUDA graphs are a
screen finding only: fresh inputs make every replay after the first wrong).
screen: pass
runtime: incorrect
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.graph = None

    def forward(self, x):
        if self.graph is None:
            self.static_x = x.clone()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = torch.relu(self.static_x) * self.scale + self.static_x.sum(dim=1, keepdim=True) * 0.01
        self.graph.replay()  # the new x is never copied into static_x
        return self.static_out.clone()
