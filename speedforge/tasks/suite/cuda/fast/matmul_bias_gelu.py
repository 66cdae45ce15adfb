"""cuBLAS GEMM through ATen, then bias add and tanh-GELU in one in-place kernel over its output."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

// y = gelu_tanh(y + bias[col]) in place; 0.5 * (1 + tanh(u)) == 1 / (1 + exp(-2u)).
__global__ void bias_gelu_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = y[i] + bias[i % cols];
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    y[i] = v / (1.0f + __expf(-2.0f * u));
  }
}

torch::Tensor matmul_bias_gelu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "matmul_bias_gelu: expects CUDA tensors");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                  bias.scalar_type() == torch::kFloat32, "matmul_bias_gelu: expects float32 tensors");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(0) && bias.numel() == weight.size(1),
              "matmul_bias_gelu: expects x [B, K], weight [K, N], bias [N]");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto y = at::mm(x, weight);  // fresh, contiguous [B, N], on the current stream
  auto bc = bias.contiguous();
  const int64_t n = y.numel();
  if (n == 0) return y;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 8192));
  bias_gelu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), bc.data_ptr<float>(),
                                                                              n, y.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = "torch::Tensor matmul_bias_gelu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

_ext = load_inline(
    name="sf_cuda_matmul_bias_gelu",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["matmul_bias_gelu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features**0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.matmul_bias_gelu(x, self.weight, self.bias)
