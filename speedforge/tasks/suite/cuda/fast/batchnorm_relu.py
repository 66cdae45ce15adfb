"""Inference batch norm and ReLU in one kernel: a block per (n, c) plane with its scale and shift."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

// Planes are the contiguous [H*W] slices of an NCHW tensor; plane p has channel p % C.
__global__ void batchnorm_relu_kernel(const float* __restrict__ x, const float* __restrict__ mean,
                                      const float* __restrict__ var, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y, int64_t planes,
                                      int64_t channels, int64_t plane, float eps) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const int64_t c = p % channels;
    const float scale = w[c] * rsqrtf(var[c] + eps);
    const float shift = b[c] - mean[c] * scale;
    const float* __restrict__ xp = x + p * plane;
    float* __restrict__ yp = y + p * plane;
    for (int64_t i = threadIdx.x; i < plane; i += blockDim.x) yp[i] = fmaxf(fmaf(xp[i], scale, shift), 0.0f);
  }
}

torch::Tensor batchnorm_relu(torch::Tensor x, torch::Tensor mean, torch::Tensor var, torch::Tensor weight,
                             torch::Tensor bias, double eps) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "batchnorm_relu: expects a float32 CUDA tensor");
  TORCH_CHECK(x.dim() >= 2, "batchnorm_relu: expects [N, C, ...]");
  const int64_t channels = x.size(1);
  for (const auto& t : {mean, var, weight, bias}) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.numel() == channels,
                "batchnorm_relu: per-channel tensors must be float32 CUDA tensors with C entries");
  }
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto m = mean.contiguous(), v = var.contiguous(), w = weight.contiguous(), b = bias.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t planes = xc.size(0) * channels;
  if (planes == 0 || xc.numel() == 0) return y;
  const int64_t plane = xc.numel() / planes;
  const int blocks = static_cast<int>(std::min<int64_t>(planes, 65535));
  batchnorm_relu_kernel<<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
      y.data_ptr<float>(), planes, channels, plane, static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = """torch::Tensor batchnorm_relu(torch::Tensor x, torch::Tensor mean, torch::Tensor var, torch::Tensor weight,
                             torch::Tensor bias, double eps);"""

_ext = load_inline(
    name="sf_cuda_batchnorm_relu",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["batchnorm_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(channels))
        self.register_buffer("running_var", 0.5 + torch.rand(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.batchnorm_relu(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
