"""GEMM from the library, then bias add and tanh-GELU in one in-place pass over its output."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SF_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SF_SIMD
#endif

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

// y = gelu_tanh(y + bias) in place; 0.5 * (1 + tanh(u)) == sigmoid(2u).
SF_SIMD static void bias_gelu_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict__ yr = y + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      float v = yr[j] + bias[j];
      float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      yr[j] = v / (1.0f + fast_exp(-2.0f * u));
    }
  }
}

torch::Tensor matmul_bias_gelu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                  bias.scalar_type() == torch::kFloat32, "matmul_bias_gelu: expects float32 CPU tensors");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(0) && bias.numel() == weight.size(1),
              "matmul_bias_gelu: expects x [B, K], weight [K, N], bias [N]");
  auto y = at::mm(x, weight);  // fresh, contiguous [B, N]
  auto bc = bias.contiguous();
  bias_gelu_kernel(y.data_ptr<float>(), bc.data_ptr<float>(), y.size(0), y.size(1));
  return y;
}
"""

_ext = load_inline(
    name="sf_cpp_matmul_bias_gelu",
    cpp_sources=CPP_SOURCE,
    functions=["matmul_bias_gelu"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features**0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.matmul_bias_gelu(x, self.weight, self.bias)
