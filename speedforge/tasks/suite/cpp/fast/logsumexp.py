"""Row-wise log-sum-exp in two read-only passes per row (max, then sum of exp), no temporaries."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SF_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SF_SIMD
#endif

constexpr int LANES = 32;

// exp(x) for x clamped to [-87.3, 88]: 2^round(t) * 2^f with a degree-6 polynomial for 2^f.
static inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.0f ? 88.0f : x;
  float t = x * 1.44269504088896341f;
  int32_t i = static_cast<int32_t>(t + (t >= 0.f ? 0.5f : -0.5f));
  float f = t - static_cast<float>(i);
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  int32_t bits = (i + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

SF_SIMD static void logsumexp_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ row = x + r * cols;
    float lane[LANES];
    for (int l = 0; l < LANES; ++l) lane[l] = -INFINITY;
    int64_t i = 0;
    for (; i + LANES <= cols; i += LANES)
      for (int l = 0; l < LANES; ++l) lane[l] = row[i + l] > lane[l] ? row[i + l] : lane[l];
    float m = -INFINITY;
    for (int l = 0; l < LANES; ++l) m = lane[l] > m ? lane[l] : m;
    for (; i < cols; ++i) m = row[i] > m ? row[i] : m;
    if (!std::isfinite(m)) {  // empty row, all -inf, or +inf present: defer to exact math
      double s = 0.0;
      for (int64_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(row[j]));
      out[r] = static_cast<float>(std::log(s));
      continue;
    }
    for (int l = 0; l < LANES; ++l) lane[l] = 0.f;
    i = 0;
    for (; i + LANES <= cols; i += LANES)
      for (int l = 0; l < LANES; ++l) lane[l] += fast_exp(row[i + l] - m);
    float s = 0.f;
    for (int l = 0; l < LANES; ++l) s += lane[l];
    for (; i < cols; ++i) s += fast_exp(row[i] - m);
    out[r] = m + std::log(s);
  }
}

torch::Tensor logsumexp_lastdim(torch::Tensor x, int64_t dim) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "logsumexp: expects a float32 CPU tensor");
  TORCH_CHECK(x.dim() >= 1 && (dim == -1 || dim == x.dim() - 1), "logsumexp: this kernel reduces the last dimension");
  auto xc = x.contiguous();
  int64_t cols = xc.size(-1);
  int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  auto out = torch::empty(xc.sizes().slice(0, xc.dim() - 1), xc.options());
  if (cols == 0) return out.fill_(-INFINITY);  // log of an empty sum
  logsumexp_kernel(xc.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
  return out;
}
"""

_ext = load_inline(
    name="sf_cpp_logsumexp",
    cpp_sources=CPP_SOURCE,
    functions=["logsumexp_lastdim"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.logsumexp_lastdim(x, self.dim)
