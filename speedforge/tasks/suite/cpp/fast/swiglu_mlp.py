"""Gated MLP with the SiLU and the gating multiply fused into one in-place pass between GEMMs."""

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

// g = silu(g) * u, in place.
SF_SIMD static void silu_mul_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = g[i];
    g[i] = v / (1.0f + fast_exp(-v)) * u[i];
  }
}

torch::Tensor swiglu_mlp(torch::Tensor x, torch::Tensor w_gate, torch::Tensor w_up, torch::Tensor w_down) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "swiglu_mlp: expects a float32 CPU tensor");
  TORCH_CHECK(x.dim() == 2 && w_gate.sizes() == w_up.sizes() && w_gate.size(1) == x.size(1) &&
                  w_down.size(1) == w_gate.size(0), "swiglu_mlp: expects x [T, H], gate/up [I, H], down [H, I]");
  auto g = at::mm(x, w_gate.t());  // fresh, contiguous [T, I]
  auto u = at::mm(x, w_up.t());
  silu_mul_kernel(g.data_ptr<float>(), u.data_ptr<float>(), g.numel());
  return at::mm(g, w_down.t());
}
"""

_ext = load_inline(
    name="sf_cpp_swiglu_mlp",
    cpp_sources=CPP_SOURCE,
    functions=["swiglu_mlp"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.swiglu_mlp(x, self.gate.weight, self.up.weight, self.down.weight)
