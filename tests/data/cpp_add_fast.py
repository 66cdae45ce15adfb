import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
torch::Tensor axpb(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "contiguous inputs expected");
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    const int64_t n = a.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + 2.0f * pb[i];
    return out;
}
"""
_ext = load_inline(name="sf_test_axpb", cpp_sources=_SRC, functions=["axpb"], extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.axpb(a.contiguous(), b.contiguous())
