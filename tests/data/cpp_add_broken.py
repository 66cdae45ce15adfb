import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
torch::Tensor axpb(torch::Tensor a, torch::Tensor b) {
    return a + undefined_name * b;
}
"""
_ext = load_inline(name="sf_test_broken", cpp_sources=_SRC, functions=["axpb"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return _ext.axpb(a, b)
