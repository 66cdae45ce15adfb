"""Dereferences a null pointer.
screen: reject
runtime: crashed
"""
import ctypes

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        return ctypes.cast(8, ctypes.POINTER(ctypes.c_int64))[0]
