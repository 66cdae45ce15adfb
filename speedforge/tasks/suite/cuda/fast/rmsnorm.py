"""RMSNorm in one kernel: a block per row, sum of squares, then the scaled write."""

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

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int64_t rows, int64_t cols, float eps) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* __restrict__ xr = x + r * cols;
    float* __restrict__ yr = y + r * cols;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_reduce<false>(ss, smem);
    const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] * inv * w[j];
  }
}

torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda() && x.scalar_type() == torch::kFloat32 &&
                  weight.scalar_type() == torch::kFloat32, "rmsnorm: expects float32 CUDA tensors");
  TORCH_CHECK(x.dim() >= 1 && weight.numel() == x.size(-1), "rmsnorm: weight must match the last dimension");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  if (rows == 0) return y;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
  rmsnorm_kernel<<<blocks, THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, cols, static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = "torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps);"

_ext = load_inline(
    name="sf_cuda_rmsnorm",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["rmsnorm"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rmsnorm(x, self.weight, self.eps)
