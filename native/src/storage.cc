// Exact vector storage and the search space (float or 8-bit scalar-quantised codes).
#include "sfann/storage.h"

#include <algorithm>
#include <cmath>

namespace sfann {

VectorStore::VectorStore(const float* data, size_t n, int dim, Metric metric)
    : n_(n), dim_(dim), dim_padded_(padded_dim(dim)), metric_(metric), data_(n * static_cast<size_t>(padded_dim(dim))) {
  for (size_t i = 0; i < n; ++i) prepare_query(data + i * dim, data_.data() + i * dim_padded_);
}

void VectorStore::prepare_query(const float* query, float* out) const {
  std::memcpy(out, query, sizeof(float) * dim_);
  std::memset(out + dim_, 0, sizeof(float) * (dim_padded_ - dim_));
  if (metric_ == Metric::Angular) {
    double norm = 0.0;
    for (int j = 0; j < dim_; ++j) norm += static_cast<double>(out[j]) * out[j];
    if (norm > 0.0) {
      float inv = static_cast<float>(1.0 / std::sqrt(norm));
      for (int j = 0; j < dim_; ++j) out[j] *= inv;
    }
  }
}

Quantization parse_quantization(const std::string& name) {
  if (name == "none" || name == "fp32") return Quantization::None;
  if (name == "sq8") return Quantization::SQ8;
  throw std::invalid_argument("unknown quantization '" + name + "' (expected none or sq8)");
}

const char* quantization_name(Quantization q) { return q == Quantization::SQ8 ? "sq8" : "none"; }

SearchSpace::SearchSpace(const VectorStore& store, Quantization q)
    : quant_(q), metric_(store.metric()), n_(store.size()), dim_padded_(store.dim_padded()) {
  const Kernels& k = kernels();
  const bool l2 = metric_ == Metric::L2;
  float_fn_ = l2 ? k.l2_float : k.ip_float;
  float_batch_ = l2 ? k.l2_float_batch : k.ip_float_batch;
  code_fn_ = l2 ? k.l2_sq8 : k.ip_sq8;
  code_batch_ = l2 ? k.l2_sq8_batch : k.ip_sq8_batch;
  if (q == Quantization::None) {
    code_bytes_ = sizeof(float) * dim_padded_;
    codes_ = n_ ? reinterpret_cast<const uint8_t*>(store.row(0)) : nullptr;
  } else {
    const int dim = store.dim();
    offsets_.assign(dim_padded_, 0.f);
    std::vector<float> hi(dim_padded_, 0.f);
    for (int j = 0; j < dim; ++j) {
      offsets_[j] = n_ ? store.row(0)[j] : 0.f;
      hi[j] = offsets_[j];
    }
    for (size_t i = 0; i < n_; ++i) {
      const float* r = store.row(i);
      for (int j = 0; j < dim; ++j) {
        offsets_[j] = std::min(offsets_[j], r[j]);
        hi[j] = std::max(hi[j], r[j]);
      }
    }
    float range = 0.f;
    for (int j = 0; j < dim; ++j) range = std::max(range, hi[j] - offsets_[j]);
    step_ = range > 0.f ? range / 255.f : 1.f;
    code_bytes_ = static_cast<size_t>(dim_padded_);
    owned_.resize(n_ * code_bytes_);
    const float inv = 1.f / step_;
    for (size_t i = 0; i < n_; ++i) {
      const float* r = store.row(i);
      uint8_t* c = owned_.data() + i * code_bytes_;
      for (int j = 0; j < dim; ++j) {
        float v = std::nearbyint((r[j] - offsets_[j]) * inv);
        c[j] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, v)));
      }
    }
    codes_ = owned_.data();
  }
  prefetch_bytes_ = std::min<size_t>(code_bytes_, 512);
}

void SearchSpace::prepare_query(const float* query_padded, void* out) const {
  if (quant_ == Quantization::None) {
    std::memcpy(out, query_padded, sizeof(float) * dim_padded_);
    return;
  }
  int16_t* q = static_cast<int16_t*>(out);
  if (metric_ == Metric::L2) {
    // On the code grid; clamped so that (q - c)^2 summed over 960 dimensions fits in int32.
    const float inv = 1.f / step_;
    for (int j = 0; j < dim_padded_; ++j) {
      float v = std::nearbyint((query_padded[j] - offsets_[j]) * inv);
      q[j] = static_cast<int16_t>(std::min(510.f, std::max(-255.f, v)));
    }
  } else {
    // q.x = q.offsets + step * sum q_j c_j: ranking by sum q_j c_j needs only q up to a positive
    // scale, chosen so |q_j| <= 2047 (sums over 960 dimensions fit in int32).
    float top = 0.f;
    for (int j = 0; j < dim_padded_; ++j) top = std::max(top, std::fabs(query_padded[j]));
    const float scale = top > 0.f ? 2047.f / top : 0.f;
    for (int j = 0; j < dim_padded_; ++j) q[j] = static_cast<int16_t>(std::nearbyint(query_padded[j] * scale));
  }
}

}  // namespace sfann
