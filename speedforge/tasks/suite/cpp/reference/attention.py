"""Single-head scaled dot-product attention written out: softmax(q k^T / sqrt(d)) v.

category: attention, matmul, softmax
The reference materialises the score matrix, divides it into a second temporary and softmaxes
it into a third; a faster version folds the 1/sqrt(d) scale into the batched product, runs the
softmax in place over each cache-resident row and feeds the result to the second product.
"""

import math

import torch
import torch.nn as nn

BATCH = 8
SEQ = 512
HEAD_DIM = 64


class Model(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / self.scale
        attn = torch.softmax(scores, dim=-1)
        return torch.matmul(attn, v)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HEAD_DIM), torch.randn(BATCH, SEQ, HEAD_DIM), torch.randn(BATCH, SEQ, HEAD_DIM)]


def get_init_inputs():
    return [HEAD_DIM]
