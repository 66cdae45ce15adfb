"""Residual add and LayerNorm fused per row: add and moments in one pass, normalise from cache."""

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

// Per row: one pass writes v = x + res and accumulates the moments of v - shift (shift = the
// row's first sum, so that the single-pass variance does not cancel catastrophically when the
// mean is large), one pass normalises in place while the row is still in cache.
SF_SIMD static void add_layernorm_kernel(const float* __restrict__ x, const float* __restrict__ res,
                                         const float* __restrict__ w, const float* __restrict__ b,
                                         float* __restrict__ y, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * cols;
    const float* __restrict__ rr = res + r * cols;
    float* __restrict__ yr = y + r * cols;
    const float shift = xr[0] + rr[0];
    float sum[LANES], sq[LANES];
    for (int l = 0; l < LANES; ++l) sum[l] = sq[l] = 0.f;
    int64_t i = 0;
    for (; i + LANES <= cols; i += LANES)
      for (int l = 0; l < LANES; ++l) {
        const float v = xr[i + l] + rr[i + l];
        yr[i + l] = v;
        const float d = v - shift;
        sum[l] += d;
        sq[l] += d * d;
      }
    float s = 0.f, q = 0.f;
    for (int l = 0; l < LANES; ++l) {
      s += sum[l];
      q += sq[l];
    }
    for (; i < cols; ++i) {
      const float v = xr[i] + rr[i];
      yr[i] = v;
      s += v - shift;
      q += (v - shift) * (v - shift);
    }
    const float n = static_cast<float>(cols);
    const float mean_shifted = s / n;
    float var = q / n - mean_shifted * mean_shifted;
    var = var > 0.f ? var : 0.f;
    const float mean = shift + mean_shifted;
    const float rstd = 1.0f / std::sqrt(var + eps);
    for (int64_t j = 0; j < cols; ++j) yr[j] = (yr[j] - mean) * rstd * w[j] + b[j];
  }
}

torch::Tensor add_layernorm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, torch::Tensor bias,
                            double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && residual.scalar_type() == torch::kFloat32,
              "add_layernorm: expects float32 CPU tensors");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_layernorm: x and residual must have the same shape");
  TORCH_CHECK(x.dim() >= 1 && weight.numel() == x.size(-1) && bias.numel() == x.size(-1),
              "add_layernorm: weight and bias must match the last dimension");
  auto xc = x.contiguous();
  auto rc = residual.contiguous();
  auto wc = weight.contiguous();
  auto bc = bias.contiguous();
  auto y = torch::empty_like(xc);
  int64_t cols = xc.size(-1);
  int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  add_layernorm_kernel(xc.data_ptr<float>(), rc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(),
                       y.data_ptr<float>(), rows, cols, static_cast<float>(eps));
  return y;
}
"""

_ext = load_inline(
    name="sf_cpp_add_layernorm",
    cpp_sources=CPP_SOURCE,
    functions=["add_layernorm"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.add_(0.1 * torch.randn(hidden))
            self.norm.bias.add_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return _ext.add_layernorm(x, residual, self.norm.weight, self.norm.bias, self.norm.eps)
