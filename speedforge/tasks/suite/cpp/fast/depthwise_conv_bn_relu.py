"""Depthwise KxK conv + inference BatchNorm + ReLU in one pass: folded filters, row-wise kernel.

For each (image, channel) plane the batch norm is folded into the K*K filter and a bias; the
plane is copied into a zero-bordered buffer, and each output row starts from the bias,
accumulates K*K shifted, full-width input rows (loops the compiler vectorises) and gets its
ReLU while it is still in L1.
"""

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

// One [H, W] plane: out = relu(conv(in, filt) + bias), zero padding `pad`, stride 1. The plane is
// first copied into the interior of `padded` ([H + 2 pad, W + 2 pad], zero borders), so every tap
// is a full-width, branch-free row loop that the compiler vectorises.
SF_SIMD static void depthwise_plane(const float* __restrict__ in, const float* __restrict__ filt, float bias,
                                    float* __restrict__ padded, float* __restrict__ out, int64_t height,
                                    int64_t width, int64_t k, int64_t pad) {
  const int64_t pw = width + 2 * pad;
  for (int64_t h = 0; h < height; ++h) {
    const float* __restrict__ src = in + h * width;
    float* __restrict__ dst = padded + (h + pad) * pw + pad;
    for (int64_t w = 0; w < width; ++w) dst[w] = src[w];
  }
  for (int64_t h = 0; h < height; ++h) {
    float* __restrict__ orow = out + h * width;
    for (int64_t w = 0; w < width; ++w) orow[w] = bias;
    for (int64_t kh = 0; kh < k; ++kh) {
      const float* __restrict__ prow = padded + (h + kh) * pw;
      for (int64_t kw = 0; kw < k; ++kw) {
        const float f = filt[kh * k + kw];
        for (int64_t w = 0; w < width; ++w) orow[w] += f * prow[w + kw];
      }
    }
    for (int64_t w = 0; w < width; ++w) orow[w] = orow[w] > 0.f ? orow[w] : 0.f;
  }
}

torch::Tensor depthwise_conv_bn_relu(torch::Tensor x, torch::Tensor conv_w, torch::Tensor bn_w, torch::Tensor bn_b,
                                     torch::Tensor mean, torch::Tensor var, double eps, std::vector<int64_t> stride,
                                     std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 4,
              "depthwise_conv_bn_relu: expects a float32 CPU tensor [N, C, H, W]");
  const int64_t channels = x.size(1);
  TORCH_CHECK(conv_w.dim() == 4 && conv_w.size(0) == channels && conv_w.size(1) == 1 && groups == channels,
              "depthwise_conv_bn_relu: expects a depthwise filter [C, 1, K, K] with groups == C");
  const int64_t k = conv_w.size(2);
  TORCH_CHECK(conv_w.size(3) == k && k % 2 == 1, "depthwise_conv_bn_relu: expects an odd square filter");
  TORCH_CHECK(stride == std::vector<int64_t>({1, 1}) && dilation == std::vector<int64_t>({1, 1}) &&
                  padding == std::vector<int64_t>({k / 2, k / 2}),
              "depthwise_conv_bn_relu: this kernel handles stride 1, dilation 1, 'same' padding");
  TORCH_CHECK(bn_w.numel() == channels && bn_b.numel() == channels && mean.numel() == channels &&
                  var.numel() == channels, "depthwise_conv_bn_relu: per-channel tensors must have C entries");
  auto xc = x.contiguous();
  auto w = conv_w.contiguous(), g = bn_w.contiguous(), b = bn_b.contiguous(), m = mean.contiguous(),
       v = var.contiguous();
  std::vector<float> filt(channels * k * k), bias(channels);
  for (int64_t c = 0; c < channels; ++c) {
    const float s = g.data_ptr<float>()[c] / std::sqrt(v.data_ptr<float>()[c] + static_cast<float>(eps));
    for (int64_t i = 0; i < k * k; ++i) filt[c * k * k + i] = w.data_ptr<float>()[c * k * k + i] * s;
    bias[c] = b.data_ptr<float>()[c] - m.data_ptr<float>()[c] * s;
  }
  auto y = torch::empty_like(xc);
  const int64_t batch = xc.size(0), height = xc.size(2), width = xc.size(3);
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  std::vector<float> padded((height + 2 * (k / 2)) * (width + 2 * (k / 2)), 0.f);  // borders stay zero
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t offset = (n * channels + c) * height * width;
      depthwise_plane(xp + offset, filt.data() + c * k * k, bias[c], padded.data(), yp + offset, height, width, k,
                      k / 2);
    }
  return y;
}
"""

_ext = load_inline(
    name="sf_cpp_depthwise_conv_bn_relu",
    cpp_sources=CPP_SOURCE,
    functions=["depthwise_conv_bn_relu"],
    extra_cflags=["-O3", "-fno-math-errno", "-fno-trapping-math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, channels: int, kernel_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=False)
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(channels))
        self.register_buffer("running_var", 0.5 + torch.rand(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        return _ext.depthwise_conv_bn_relu(
            x,
            c.weight,
            self.bn_weight,
            self.bn_bias,
            self.running_mean,
            self.running_var,
            self.eps,
            list(c.stride),
            list(c.padding),
            list(c.dilation),
            c.groups,
        )
