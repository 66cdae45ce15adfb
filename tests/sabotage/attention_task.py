"""Scaled dot-product attention: on the CPU its speed depends on the flash kernel being enabled."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(2, 4, 128, 64) for _ in range(3)]


def get_init_inputs():
    return []
