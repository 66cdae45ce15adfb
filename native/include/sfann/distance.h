// Distance kernels, chosen once at run time for the CPU the engine runs on (scalar, AVX2+FMA,
// AVX-512). Every kernel takes vectors padded to a multiple of kDimAlign dimensions.
#pragma once

#include "sfann/common.h"

namespace sfann {

// Float vs float. L2: squared Euclidean distance; IP: 1 - dot (smaller is nearer).
using FloatDistFn = float (*)(const float* a, const float* b, int dim_padded);
// Prepared float query vs uint8 code (scalar quantisation): sum (q_i - c_i)^2, or 1 - sum q_i c_i.
using CodeDistFn = float (*)(const float* query, const uint8_t* code, int dim_padded);

struct Kernels {
  FloatDistFn l2_float;
  FloatDistFn ip_float;
  CodeDistFn l2_sq8;
  CodeDistFn ip_sq8;
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
