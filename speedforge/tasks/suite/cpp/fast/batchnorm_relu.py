"""Inference batch norm and ReLU in one pass: one scale and shift per channel, then max(., 0)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SF_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SF_SIMD
#endif

SF_SIMD static void scale_shift_relu_kernel(const float* __restrict__ x, const float* __restrict__ scale,
                                            const float* __restrict__ shift, float* __restrict__ y, int64_t batch,
                                            int64_t channels, int64_t plane) {
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      const float* __restrict__ xp = x + (n * channels + c) * plane;
      float* __restrict__ yp = y + (n * channels + c) * plane;
      const float a = scale[c], b = shift[c];
      for (int64_t i = 0; i < plane; ++i) {
        float v = xp[i] * a + b;
        yp[i] = v > 0.f ? v : 0.f;
      }
    }
}

torch::Tensor batchnorm_relu(torch::Tensor x, torch::Tensor mean, torch::Tensor var, torch::Tensor weight,
                             torch::Tensor bias, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "batchnorm_relu: expects a float32 CPU tensor");
  TORCH_CHECK(x.dim() >= 2, "batchnorm_relu: expects [N, C, ...]");
  const int64_t channels = x.size(1);
  TORCH_CHECK(mean.numel() == channels && var.numel() == channels && weight.numel() == channels &&
                  bias.numel() == channels, "batchnorm_relu: per-channel tensors must have C entries");
  auto xc = x.contiguous();
  auto m = mean.contiguous(), v = var.contiguous(), w = weight.contiguous(), b = bias.contiguous();
  std::vector<float> scale(channels), shift(channels);
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = w.data_ptr<float>()[c] / std::sqrt(v.data_ptr<float>()[c] + static_cast<float>(eps));
    shift[c] = b.data_ptr<float>()[c] - m.data_ptr<float>()[c] * scale[c];
  }
  const int64_t batch = xc.size(0);
  const int64_t plane = (batch == 0 || channels == 0) ? 0 : xc.numel() / (batch * channels);
  auto y = torch::empty_like(xc);
  scale_shift_relu_kernel(xc.data_ptr<float>(), scale.data(), shift.data(), y.data_ptr<float>(), batch, channels, plane);
  return y;
}
"""

_ext = load_inline(
    name="sf_cpp_batchnorm_relu",
    cpp_sources=CPP_SOURCE,
    functions=["batchnorm_relu"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
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
