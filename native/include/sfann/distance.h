// Distance kernels, chosen once at run time for the CPU the engine runs on (scalar, AVX2+FMA,
// AVX-512). Every kernel takes vectors padded to a multiple of kDimAlign dimensions.
#pragma once

#include "sfann/common.h"

namespace sfann {

// Float vs float. L2: squared Euclidean distance; IP: 1 - dot (smaller is nearer).
using FloatDistFn = float (*)(const float* a, const float* b, int dim_padded);
// Float query vs many float rows: out[j] = dist(query, base + ids[j] * stride).
using FloatBatchFn = void (*)(const float* query, const float* base, size_t stride, const uint32_t* ids, int m,
                              int dim_padded, float* out);
// 8-bit scalar quantisation: an int16 query on the code grid vs uint8 codes, in integer
// arithmetic. L2: sum (q_i - c_i)^2; IP: -sum q_i c_i.
using CodeDistFn = float (*)(const int16_t* query, const uint8_t* code, int dim_padded);
using CodeBatchFn = void (*)(const int16_t* query, const uint8_t* codes, size_t stride, const uint32_t* ids, int m,
                             int dim_padded, float* out);

struct Kernels {
  FloatDistFn l2_float;
  FloatDistFn ip_float;
  FloatBatchFn l2_float_batch;
  FloatBatchFn ip_float_batch;
  CodeDistFn l2_sq8;
  CodeDistFn ip_sq8;
  CodeBatchFn l2_sq8_batch;
  CodeBatchFn ip_sq8_batch;
  const char* level;  // "avx512" | "avx2" | "scalar"
};

// The kernels for this CPU (detected once, thread-safe).
const Kernels& kernels();
// Kernels of one level, for tests and benchmarks: "scalar", "avx2", "avx512" (throws if the CPU
// lacks it).
const Kernels& kernels_for(const std::string& level);
const char* simd_level();

// The float distance of a metric (Angular vectors are normalised, so it uses IP).
inline FloatDistFn float_distance(Metric metric) {
  return metric == Metric::L2 ? kernels().l2_float : kernels().ip_float;
}

}  // namespace sfann
