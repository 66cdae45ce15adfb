"""What the training tests feed the stages: a candidate for cpp/add_relu_scale that is correct
and faster than its reference without compiling anything (pure torch, in-place ops: one
temporary instead of two), and a policy answer with the three sections around a program."""

FAST = '''"""relu(a + b) * scale with in-place ops: one temporary instead of two."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return torch.relu_(a + b).mul_(self.scale)
'''


def answer(code: str) -> str:
    return f"### Performance Analysis\nThree passes.\n### Algorithm Design\nOne pass.\n### Code Implementation\n```python\n{code}```\n"
