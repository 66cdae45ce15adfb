"""Leaves torch's SchemaCheckMode (a Python dispatch mode of torch's own: no knob, no patch, no
subclass) entered after its own call and leaves it before its next: every aten op of the
reference goes through Python dispatch and a schema check. The stacks of torch function and
dispatch modes are process state, put back around the reference's calls. (Before they were:
ok at 21.6x with the tripwire off; the tripwire alone caught it only because the slowdown is
above its limit.)
task: relu_task.py
screen: pass
runtime: ok
honest_speed: true
"""
import torch
import torch.nn as nn
from torch._subclasses.schema_check_mode import SchemaCheckMode


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.mode = SchemaCheckMode()
        self.entered = False

    def forward(self, x):
        if self.entered:
            self.mode.__exit__(None, None, None)
        out = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
        self.mode.__enter__()
        self.entered = True
        return out
