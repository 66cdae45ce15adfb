"""RMSNorm in one kernel: sum of squares per row, then scale by rsqrt and weight from cache."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SF_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SF_SIMD
#endif

constexpr int LANES = 32;

SF_SIMD static void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                   int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * cols;
    float* __restrict__ yr = y + r * cols;
    float lane[LANES];
    for (int l = 0; l < LANES; ++l) lane[l] = 0.f;
    int64_t i = 0;
    for (; i + LANES <= cols; i += LANES)
      for (int l = 0; l < LANES; ++l) lane[l] += xr[i + l] * xr[i + l];
    float ss = 0.f;
    for (int l = 0; l < LANES; ++l) ss += lane[l];
    for (; i < cols; ++i) ss += xr[i] * xr[i];
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(cols) + eps);
    for (int64_t j = 0; j < cols; ++j) yr[j] = xr[j] * inv * w[j];
  }
}

torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32,
              "rmsnorm: expects float32 CPU tensors");
  TORCH_CHECK(x.dim() >= 1 && weight.numel() == x.size(-1), "rmsnorm: weight must match the last dimension");
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto y = torch::empty_like(xc);
  int64_t cols = xc.size(-1);
  int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  rmsnorm_kernel(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, cols, static_cast<float>(eps));
  return y;
}
"""

_ext = load_inline(
    name="sf_cpp_rmsnorm",
    cpp_sources=CPP_SOURCE,
    functions=["rmsnorm"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rmsnorm(x, self.weight, self.eps)
