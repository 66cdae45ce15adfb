"""Conv2d + inference BatchNorm + ReLU: batch norm folded into the weights, one bias+ReLU kernel.

Each call folds the batch norm into a fresh copy of the convolution weights (a tiny kernel),
runs the convolution without bias through ATen (cuDNN), and adds the folded bias and applies
ReLU in one in-place pass, where the reference makes three passes after the convolution
(bias, batch norm, ReLU).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

// fw = w * s[c] and fb = (cb - mean) * s + bn_b, with s = bn_w / sqrt(var + eps), c = output channel.
__global__ void fold_kernel(const float* __restrict__ w, const float* __restrict__ cb, const float* __restrict__ bn_w,
                            const float* __restrict__ bn_b, const float* __restrict__ mean,
                            const float* __restrict__ var, float* __restrict__ fw, float* __restrict__ fb,
                            int64_t out_ch, int64_t per_ch, float eps) {
  const int64_t total = out_ch * per_ch;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t c = i / per_ch;
    const float s = bn_w[c] * rsqrtf(var[c] + eps);
    fw[i] = w[i] * s;
    if (i % per_ch == 0) fb[c] = (cb[c] - mean[c]) * s + bn_b[c];
  }
}

// y = relu(y + bias[c]) in place over the [H*W] planes of an NCHW tensor; plane p has channel p % C.
__global__ void bias_relu_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t planes,
                                 int64_t channels, int64_t plane) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const float b = bias[p % channels];
    float* __restrict__ yp = y + p * plane;
    for (int64_t i = threadIdx.x; i < plane; i += blockDim.x) yp[i] = fmaxf(yp[i] + b, 0.0f);
  }
}

torch::Tensor conv_bn_relu(torch::Tensor x, torch::Tensor conv_w, torch::Tensor conv_b, torch::Tensor bn_w,
                           torch::Tensor bn_b, torch::Tensor mean, torch::Tensor var, double eps,
                           std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                           int64_t groups) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4,
              "conv_bn_relu: expects a float32 CUDA tensor [N, C, H, W]");
  const int64_t out_ch = conv_w.size(0);
  for (const auto& t : {conv_w, conv_b, bn_w, bn_b, mean, var}) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32, "conv_bn_relu: parameters must be float32 on CUDA");
  }
  TORCH_CHECK(conv_b.numel() == out_ch && bn_w.numel() == out_ch && bn_b.numel() == out_ch && mean.numel() == out_ch &&
                  var.numel() == out_ch, "conv_bn_relu: per-channel tensors must have C_out entries");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto w = conv_w.contiguous();
  auto fw = torch::empty_like(w);
  auto fb = torch::empty({out_ch}, w.options());
  const int64_t per_ch = out_ch == 0 ? 0 : w.numel() / out_ch;
  if (w.numel() > 0) {
    const int blocks = static_cast<int>(std::min<int64_t>((w.numel() + 255) / 256, 4096));
    auto cb = conv_b.contiguous(), g = bn_w.contiguous(), bb = bn_b.contiguous(), m = mean.contiguous(),
         v = var.contiguous();
    fold_kernel<<<blocks, 256, 0, stream>>>(w.data_ptr<float>(), cb.data_ptr<float>(), g.data_ptr<float>(),
                                            bb.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                                            fw.data_ptr<float>(), fb.data_ptr<float>(), out_ch, per_ch,
                                            static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  auto y = at::conv2d(x, fw, std::nullopt, stride, padding, dilation, groups).contiguous();
  const int64_t planes = y.size(0) * y.size(1);
  if (planes == 0 || y.numel() == 0) return y;
  const int blocks = static_cast<int>(std::min<int64_t>(planes, 65535));
  bias_relu_kernel<<<blocks, 256, 0, stream>>>(y.data_ptr<float>(), fb.data_ptr<float>(), planes, y.size(1),
                                               y.numel() / planes);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = """torch::Tensor conv_bn_relu(torch::Tensor x, torch::Tensor conv_w, torch::Tensor conv_b, torch::Tensor bn_w,
                           torch::Tensor bn_b, torch::Tensor mean, torch::Tensor var, double eps,
                           std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                           int64_t groups);"""

_ext = load_inline(
    name="sf_cuda_conv_bn_relu",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["conv_bn_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", 0.5 + torch.rand(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        return _ext.conv_bn_relu(
            x,
            c.weight,
            c.bias,
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
