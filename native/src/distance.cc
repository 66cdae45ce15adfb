// Distance kernels for three instruction-set levels, compiled with per-function target
// attributes (no -march flag) and chosen at run time with __builtin_cpu_supports.
#include "sfann/distance.h"

#if defined(__x86_64__) || defined(_M_X64)
#define SFANN_X86 1
// GCC 12 warns about the deliberately undefined upper lanes inside its own AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace sfann {
namespace {

// ---- scalar (portable; the compiler may still vectorise with the baseline ISA) ----

float l2_float_scalar(const float* a, const float* b, int d) {
  float s = 0.f;
  for (int i = 0; i < d; ++i) {
    float t = a[i] - b[i];
    s += t * t;
  }
  return s;
}

float ip_float_scalar(const float* a, const float* b, int d) {
  float s = 0.f;
  for (int i = 0; i < d; ++i) s += a[i] * b[i];
  return 1.f - s;
}

float l2_sq8_scalar(const int16_t* q, const uint8_t* c, int d) {
  int32_t s = 0;
  for (int i = 0; i < d; ++i) {
    int32_t t = q[i] - static_cast<int32_t>(c[i]);
    s += t * t;
  }
  return static_cast<float>(s);
}

float ip_sq8_scalar(const int16_t* q, const uint8_t* c, int d) {
  int32_t s = 0;
  for (int i = 0; i < d; ++i) s += q[i] * static_cast<int32_t>(c[i]);
  return -static_cast<float>(s);
}

#ifdef SFANN_X86

// ---- AVX2 + FMA ----

__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 0x55));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) float l2_float_avx2(const float* a, const float* b, int d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 16) {
    __m256 t0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    __m256 t1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    s0 = _mm256_fmadd_ps(t0, t0, s0);
    s1 = _mm256_fmadd_ps(t1, t1, s1);
  }
  return hsum256(_mm256_add_ps(s0, s1));
}

__attribute__((target("avx2,fma"))) float ip_float_avx2(const float* a, const float* b, int d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  return 1.f - hsum256(_mm256_add_ps(s0, s1));
}

__attribute__((target("avx2,fma"))) inline int32_t hsum256_epi32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
  return _mm_cvtsi128_si32(x);
}

__attribute__((target("avx2,fma"))) inline __m256i load_u8x16_epi16(const uint8_t* c) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
}

__attribute__((target("avx2,fma"))) float l2_sq8_avx2(const int16_t* q, const uint8_t* c, int d) {
  __m256i acc = _mm256_setzero_si256();
  for (int i = 0; i < d; i += 16) {
    __m256i t = _mm256_sub_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), load_u8x16_epi16(c + i));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(t, t));
  }
  return static_cast<float>(hsum256_epi32(acc));
}

__attribute__((target("avx2,fma"))) float ip_sq8_avx2(const int16_t* q, const uint8_t* c, int d) {
  __m256i acc = _mm256_setzero_si256();
  for (int i = 0; i < d; i += 16) {
    acc = _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), load_u8x16_epi16(c + i)));
  }
  return -static_cast<float>(hsum256_epi32(acc));
}

// ---- AVX-512 (F + BW) ----

__attribute__((target("avx512f,avx512bw"))) float l2_float_avx512(const float* a, const float* b, int d) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= d; i += 32) {
    __m512 t0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    __m512 t1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
    s0 = _mm512_fmadd_ps(t0, t0, s0);
    s1 = _mm512_fmadd_ps(t1, t1, s1);
  }
  if (i < d) {
    __m512 t0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    s0 = _mm512_fmadd_ps(t0, t0, s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f,avx512bw"))) float ip_float_avx512(const float* a, const float* b, int d) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= d; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i < d) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  return 1.f - _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f,avx512bw"))) float l2_sq8_avx512(const int16_t* q, const uint8_t* c, int d) {
  __m512i acc = _mm512_setzero_si512();
  int i = 0;
  for (; i + 32 <= d; i += 32) {
    __m512i code = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
    __m512i t = _mm512_sub_epi16(_mm512_loadu_si512(q + i), code);
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(t, t));
  }
  int32_t s = _mm512_reduce_add_epi32(acc);
  if (i < d) {
    __m256i code = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
    __m256i t = _mm256_sub_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), code);
    __m256i p = _mm256_madd_epi16(t, t);
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    s += _mm_cvtsi128_si32(x);
  }
  return static_cast<float>(s);
}

__attribute__((target("avx512f,avx512bw"))) float ip_sq8_avx512(const int16_t* q, const uint8_t* c, int d) {
  __m512i acc = _mm512_setzero_si512();
  int i = 0;
  for (; i + 32 <= d; i += 32) {
    __m512i code = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_loadu_si512(q + i), code));
  }
  int32_t s = _mm512_reduce_add_epi32(acc);
  if (i < d) {
    __m256i code = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
    __m256i p = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), code);
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    s += _mm_cvtsi128_si32(x);
  }
  return -static_cast<float>(s);
}

#endif  // SFANN_X86

// AVX-512 VNNI: vpdpwssd fuses the multiply-add of 16-bit pairs with the 32-bit accumulation,
// one instruction less per 32 dimensions; two accumulators hide its latency. Exact, like the rest.
#define SFANN_SQ8_TAIL(EXPR)                                                                       \
  if (i < d) {                                                                                     \
    __m256i code = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i))); \
    __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));                      \
    __m256i p = EXPR;                                                                              \
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));          \
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));                                              \
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));                                              \
    s += _mm_cvtsi128_si32(x);                                                                     \
  }

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float l2_sq8_avx512vnni(const int16_t* q, const uint8_t* c,
                                                                                int d) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  int i = 0;
  for (; i + 64 <= d; i += 64) {
    __m512i t0 = _mm512_sub_epi16(_mm512_loadu_si512(q + i),
                                  _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i))));
    __m512i t1 = _mm512_sub_epi16(_mm512_loadu_si512(q + i + 32), _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                                                                      reinterpret_cast<const __m256i*>(c + i + 32))));
    a0 = _mm512_dpwssd_epi32(a0, t0, t0);
    a1 = _mm512_dpwssd_epi32(a1, t1, t1);
  }
  for (; i + 32 <= d; i += 32) {
    __m512i t = _mm512_sub_epi16(_mm512_loadu_si512(q + i),
                                 _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i))));
    a0 = _mm512_dpwssd_epi32(a0, t, t);
  }
  int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1));
  SFANN_SQ8_TAIL(_mm256_madd_epi16(_mm256_sub_epi16(qv, code), _mm256_sub_epi16(qv, code)))
  return static_cast<float>(s);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) float ip_sq8_avx512vnni(const int16_t* q, const uint8_t* c,
                                                                                int d) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  int i = 0;
  for (; i + 64 <= d; i += 64) {
    a0 = _mm512_dpwssd_epi32(a0, _mm512_loadu_si512(q + i),
                             _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i))));
    a1 = _mm512_dpwssd_epi32(a1, _mm512_loadu_si512(q + i + 32),
                             _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 32))));
  }
  for (; i + 32 <= d; i += 32) {
    a0 = _mm512_dpwssd_epi32(a0, _mm512_loadu_si512(q + i),
                             _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i))));
  }
  int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1));
  SFANN_SQ8_TAIL(_mm256_madd_epi16(qv, code))
  return -static_cast<float>(s);
}
#undef SFANN_SQ8_TAIL

// Batch forms: one indirect call per expanded node; the row kernel is inlined into the loop.
#define SFANN_FLOAT_BATCH(NAME, ROW, ATTR)                                                                   \
  ATTR void NAME(const float* q, const float* base, size_t stride, const uint32_t* ids, int m, int d,      \
                 float* out) {                                                                           \
    for (int j = 0; j < m; ++j) out[j] = ROW(q, base + ids[j] * stride, d);                               \
  }
#define SFANN_CODE_BATCH(NAME, ROW, ATTR)                                                                    \
  ATTR void NAME(const int16_t* q, const uint8_t* codes, size_t stride, const uint32_t* ids, int m, int d, \
                 float* out) {                                                                           \
    for (int j = 0; j < m; ++j) out[j] = ROW(q, codes + ids[j] * stride, d);                              \
  }
#define SFANN_NO_ATTR
SFANN_FLOAT_BATCH(l2_float_batch_scalar, l2_float_scalar, SFANN_NO_ATTR)
SFANN_FLOAT_BATCH(ip_float_batch_scalar, ip_float_scalar, SFANN_NO_ATTR)
SFANN_CODE_BATCH(l2_sq8_batch_scalar, l2_sq8_scalar, SFANN_NO_ATTR)
SFANN_CODE_BATCH(ip_sq8_batch_scalar, ip_sq8_scalar, SFANN_NO_ATTR)
#ifdef SFANN_X86
#define SFANN_AVX2 __attribute__((target("avx2,fma")))
#define SFANN_AVX512 __attribute__((target("avx512f,avx512bw")))
SFANN_FLOAT_BATCH(l2_float_batch_avx2, l2_float_avx2, SFANN_AVX2)
SFANN_FLOAT_BATCH(ip_float_batch_avx2, ip_float_avx2, SFANN_AVX2)
SFANN_CODE_BATCH(l2_sq8_batch_avx2, l2_sq8_avx2, SFANN_AVX2)
SFANN_CODE_BATCH(ip_sq8_batch_avx2, ip_sq8_avx2, SFANN_AVX2)
SFANN_FLOAT_BATCH(l2_float_batch_avx512, l2_float_avx512, SFANN_AVX512)
SFANN_FLOAT_BATCH(ip_float_batch_avx512, ip_float_avx512, SFANN_AVX512)
SFANN_CODE_BATCH(l2_sq8_batch_avx512, l2_sq8_avx512, SFANN_AVX512)
SFANN_CODE_BATCH(ip_sq8_batch_avx512, ip_sq8_avx512, SFANN_AVX512)
#define SFANN_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
SFANN_CODE_BATCH(l2_sq8_batch_avx512vnni, l2_sq8_avx512vnni, SFANN_AVX512VNNI)
SFANN_CODE_BATCH(ip_sq8_batch_avx512vnni, ip_sq8_avx512vnni, SFANN_AVX512VNNI)
#endif

const Kernels kScalar{l2_float_scalar,       ip_float_scalar,    l2_float_batch_scalar, ip_float_batch_scalar,
                      l2_sq8_scalar,         ip_sq8_scalar,      l2_sq8_batch_scalar,   ip_sq8_batch_scalar,
                      "scalar"};
#ifdef SFANN_X86
const Kernels kAvx2{l2_float_avx2,       ip_float_avx2,    l2_float_batch_avx2, ip_float_batch_avx2,
                    l2_sq8_avx2,         ip_sq8_avx2,      l2_sq8_batch_avx2,   ip_sq8_batch_avx2,
                    "avx2"};
const Kernels kAvx512{l2_float_avx512,       ip_float_avx512,    l2_float_batch_avx512, ip_float_batch_avx512,
                      l2_sq8_avx512,         ip_sq8_avx512,      l2_sq8_batch_avx512,   ip_sq8_batch_avx512,
                      "avx512"};
// The avx512 level on a CPU with VNNI: the same float kernels, the code kernels above.
const Kernels kAvx512Vnni{l2_float_avx512,          ip_float_avx512,          l2_float_batch_avx512,
                          ip_float_batch_avx512,    l2_sq8_avx512vnni,        ip_sq8_avx512vnni,
                          l2_sq8_batch_avx512vnni,  ip_sq8_batch_avx512vnni,  "avx512"};

bool cpu_has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}
#endif

bool cpu_has(const std::string& level) {
  if (level == "scalar") return true;
#ifdef SFANN_X86
  __builtin_cpu_init();
  if (level == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (level == "avx512") return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
  return false;
}

const Kernels& detect() {
#ifdef SFANN_X86
  if (cpu_has("avx512")) return cpu_has_vnni() ? kAvx512Vnni : kAvx512;
  if (cpu_has("avx2")) return kAvx2;
#endif
  return kScalar;
}

}  // namespace

const Kernels& kernels() {
  static const Kernels& chosen = detect();
  return chosen;
}

const Kernels& kernels_for(const std::string& level) {
  if (!cpu_has(level)) throw std::invalid_argument("SIMD level not available on this CPU: " + level);
  if (level == "scalar") return kScalar;
#ifdef SFANN_X86
  if (level == "avx2") return kAvx2;
  if (level == "avx512") return cpu_has_vnni() ? kAvx512Vnni : kAvx512;
#endif
  throw std::invalid_argument("unknown SIMD level: " + level);
}

const char* simd_level() { return kernels().level; }

Metric parse_metric(const std::string& name) {
  if (name == "l2" || name == "euclidean") return Metric::L2;
  if (name == "ip" || name == "dot") return Metric::IP;
  if (name == "angular" || name == "cosine") return Metric::Angular;
  throw std::invalid_argument("unknown metric '" + name + "' (expected l2, ip or angular)");
}

const char* metric_name(Metric metric) {
  switch (metric) {
    case Metric::L2: return "l2";
    case Metric::IP: return "ip";
    case Metric::Angular: return "angular";
  }
  return "?";
}

}  // namespace sfann
