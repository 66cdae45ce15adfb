"""Residual add and LayerNorm in one kernel: a block per row; each thread re-reads only what it wrote."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

constexpr int THREADS = 512;

// Block-wide max or sum; every thread gets the result. `smem` holds one float per warp.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* smem) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = IS_MAX ? fmaxf(v, other) : v + other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // earlier readers of smem are done
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x >> 5) ? smem[lane] : (IS_MAX ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = IS_MAX ? fmaxf(v, other) : v + other;
    }
    if (lane == 0) smem[0] = v;
  }
  __syncthreads();
  return smem[0];
}

// y = layer_norm(x + res) per row. Pass 1 writes the sum and accumulates it; pass 2 the squared
// deviations from the mean (two-pass variance); pass 3 normalises in place. A thread touches the
// same columns in every pass, so it only reads back its own writes.
__global__ void add_layernorm_kernel(const float* __restrict__ x, const float* __restrict__ res,
                                     const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
                                     int64_t rows, int64_t cols, float eps) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* __restrict__ xr = x + r * cols;
    const float* __restrict__ rr = res + r * cols;
    float* __restrict__ yr = y + r * cols;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float v = xr[j] + rr[j];
      yr[j] = v;
      s += v;
    }
    const float mean = block_reduce<false>(s, smem) / static_cast<float>(cols);
    float q = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float d = yr[j] - mean;
      q += d * d;
    }
    const float rstd = rsqrtf(block_reduce<false>(q, smem) / static_cast<float>(cols) + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (yr[j] - mean) * rstd * w[j] + b[j];
  }
}

torch::Tensor add_layernorm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, torch::Tensor bias,
                            double eps) {
  TORCH_CHECK(x.is_cuda() && residual.is_cuda() && weight.is_cuda() && bias.is_cuda(),
              "add_layernorm: expects CUDA tensors");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && residual.scalar_type() == torch::kFloat32 &&
                  weight.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32,
              "add_layernorm: expects float32 tensors");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_layernorm: x and residual must have the same shape");
  TORCH_CHECK(x.dim() >= 1 && weight.numel() == x.size(-1) && bias.numel() == x.size(-1),
              "add_layernorm: weight and bias must match the last dimension");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto rc = residual.contiguous();
  auto wc = weight.contiguous();
  auto bc = bias.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  if (rows == 0) return y;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
  add_layernorm_kernel<<<blocks, THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), rc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(), rows,
      cols, static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = "torch::Tensor add_layernorm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, torch::Tensor bias, double eps);"

_ext = load_inline(
    name="sf_cuda_add_layernorm",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["add_layernorm"],
    extra_cuda_cflags=["-O3"],
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
