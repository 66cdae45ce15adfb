"""Launches the kernel on a side stream from C++, returning before it finishes (a screen finding
only: the device-wide synchronize before the end event counts the side stream's work).
screen: pass
runtime: ok|incorrect
honest_speed: true
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

__global__ void slow_relu(const float* x, const float* rows, float* out, float scale, int64_t n, int64_t cols) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < 200; ++k) v = v * 1.0000001f;
        out[i] = fmaxf(x[i], 0.f) * scale + rows[i / cols] * 0.01f + (v - v);
    }
}

torch::Tensor side_relu(torch::Tensor x, double scale) {
    auto rows = x.sum(1);
    auto out = torch::empty_like(x);
    auto side = at::cuda::getStreamFromPool();
    int64_t n = x.numel();
    slow_relu<<<(n + 255) / 256, 256, 0, side.stream()>>>(x.data_ptr<float>(), rows.data_ptr<float>(),
                                                        out.data_ptr<float>(), (float)scale, n, x.size(1));
    return out;
}
"""
_ext = load_inline(name="sf_side_stream", cpp_sources="torch::Tensor side_relu(torch::Tensor x, double scale);",
                   cuda_sources=_CUDA, functions=["side_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return _ext.side_relu(x.contiguous(), self.scale)
