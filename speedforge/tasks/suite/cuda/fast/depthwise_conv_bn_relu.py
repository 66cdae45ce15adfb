"""Depthwise KxK conv + inference BatchNorm + ReLU in one kernel: a thread per output element.

Each thread folds its channel's batch norm into scale and shift, accumulates the K*K taps of
its output (neighbouring threads share inputs through L1/L2, and adjacent threads read adjacent
columns, so loads coalesce) and stores relu(acc * scale + shift): one read and one write of the
activations instead of the reference's three passes.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

__global__ void depthwise_bn_relu_kernel(const float* __restrict__ x, const float* __restrict__ filt,
                                         const float* __restrict__ bn_w, const float* __restrict__ bn_b,
                                         const float* __restrict__ mean, const float* __restrict__ var,
                                         float* __restrict__ y, int64_t total, int64_t channels, int64_t height,
                                         int64_t width, int k, int pad, float eps) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t plane = height * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t p = i / plane;  // (n, c) plane index
    const int64_t c = p % channels;
    const int64_t hw = i - p * plane;
    const int64_t h = hw / width, w = hw - h * width;
    const float* __restrict__ xp = x + p * plane;
    const float* __restrict__ f = filt + c * k * k;
    float acc = 0.0f;
    for (int kh = 0; kh < k; ++kh) {
      const int64_t ih = h + kh - pad;
      if (ih < 0 || ih >= height) continue;
      for (int kw = 0; kw < k; ++kw) {
        const int64_t iw = w + kw - pad;
        if (iw >= 0 && iw < width) acc = fmaf(f[kh * k + kw], xp[ih * width + iw], acc);
      }
    }
    const float scale = bn_w[c] * rsqrtf(var[c] + eps);
    y[i] = fmaxf(fmaf(acc, scale, bn_b[c] - mean[c] * scale), 0.0f);
  }
}

torch::Tensor depthwise_conv_bn_relu(torch::Tensor x, torch::Tensor conv_w, torch::Tensor bn_w, torch::Tensor bn_b,
                                     torch::Tensor mean, torch::Tensor var, double eps, std::vector<int64_t> stride,
                                     std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4,
              "depthwise_conv_bn_relu: expects a float32 CUDA tensor [N, C, H, W]");
  const int64_t channels = x.size(1);
  TORCH_CHECK(conv_w.dim() == 4 && conv_w.size(0) == channels && conv_w.size(1) == 1 && groups == channels,
              "depthwise_conv_bn_relu: expects a depthwise filter [C, 1, K, K] with groups == C");
  const int64_t k = conv_w.size(2);
  TORCH_CHECK(conv_w.size(3) == k && k % 2 == 1 && k <= 15, "depthwise_conv_bn_relu: expects an odd square filter");
  TORCH_CHECK(stride == std::vector<int64_t>({1, 1}) && dilation == std::vector<int64_t>({1, 1}) &&
                  padding == std::vector<int64_t>({k / 2, k / 2}),
              "depthwise_conv_bn_relu: this kernel handles stride 1, dilation 1, 'same' padding");
  for (const auto& t : {conv_w, bn_w, bn_b, mean, var}) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32, "depthwise_conv_bn_relu: parameters must be float32 on CUDA");
  }
  TORCH_CHECK(bn_w.numel() == channels && bn_b.numel() == channels && mean.numel() == channels &&
                  var.numel() == channels, "depthwise_conv_bn_relu: per-channel tensors must have C entries");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto w = conv_w.contiguous(), g = bn_w.contiguous(), b = bn_b.contiguous(), m = mean.contiguous(),
       v = var.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t total = xc.numel();
  if (total == 0) return y;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 65535));
  depthwise_bn_relu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), w.data_ptr<float>(), g.data_ptr<float>(), b.data_ptr<float>(), m.data_ptr<float>(),
      v.data_ptr<float>(), y.data_ptr<float>(), total, channels, xc.size(2), xc.size(3), static_cast<int>(k),
      static_cast<int>(k / 2), static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = """torch::Tensor depthwise_conv_bn_relu(torch::Tensor x, torch::Tensor conv_w, torch::Tensor bn_w, torch::Tensor bn_b,
                                     torch::Tensor mean, torch::Tensor var, double eps, std::vector<int64_t> stride,
                                     std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups);"""

_ext = load_inline(
    name="sf_cuda_depthwise_conv_bn_relu",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["depthwise_conv_bn_relu"],
    extra_cuda_cflags=["-O3"],
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
            x, c.weight, self.bn_weight, self.bn_bias, self.running_mean, self.running_var, self.eps,
            list(c.stride), list(c.padding), list(c.dilation), c.groups,
        )
