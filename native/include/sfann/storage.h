// Vector storage: the exact float vectors, and the compact copy the search walks over
// (float or 8-bit scalar-quantised codes).
#pragma once

#include <vector>

#include "sfann/common.h"
#include "sfann/distance.h"

namespace sfann {

// Exact vectors, zero-padded to padded_dim(dim), one 64-byte aligned row each. Angular vectors
// are stored normalised to unit length.
class VectorStore {
 public:
  VectorStore() = default;
  VectorStore(const float* data, size_t n, int dim, Metric metric);

  const float* row(size_t i) const { return data_.data() + i * static_cast<size_t>(dim_padded_); }
  size_t size() const { return n_; }
  int dim() const { return dim_; }
  int dim_padded() const { return dim_padded_; }
  Metric metric() const { return metric_; }
  FloatDistFn distance_fn() const { return float_distance(metric_); }
  float distance(const float* query_padded, size_t i) const { return distance_fn()(query_padded, row(i), dim_padded_); }
  float distance(size_t i, size_t j) const { return distance_fn()(row(i), row(j), dim_padded_); }
  // Copy (and normalise, for Angular) one query into a padded buffer of dim_padded() floats.
  void prepare_query(const float* query, float* out) const;
  size_t memory_bytes() const { return data_.bytes(); }

 private:
  size_t n_ = 0;
  int dim_ = 0;
  int dim_padded_ = 0;
  Metric metric_ = Metric::L2;
  AlignedBuffer<float> data_;
};

enum class Quantization : int { None = 0, SQ8 = 1 };

Quantization parse_quantization(const std::string& name);  // "none" | "sq8"
const char* quantization_name(Quantization q);

// What the search reads: rows of `code_bytes` bytes, with a distance from a prepared query.
// Quantization::None: the rows are the float vectors themselves (no copy); the prepared query
// is the padded float query. Quantization::SQ8: one byte per dimension (per-dimension offset,
// one global step); the prepared query is int16 on the same grid, and distances are computed
// in integer arithmetic (exact order up to the grid; the refinement re-ranks exactly).
class SearchSpace {
 public:
  SearchSpace() = default;
  SearchSpace(const VectorStore& store, Quantization q);

  Quantization quantization() const { return quant_; }
  size_t size() const { return n_; }
  int dim_padded() const { return dim_padded_; }
  size_t code_bytes() const { return code_bytes_; }
  bool exact() const { return quant_ == Quantization::None; }
  const uint8_t* code(size_t i) const { return codes_ + i * code_bytes_; }

  // Padded query (store.prepare_query) -> prepared query; `out` holds dim_padded() floats.
  void prepare_query(const float* query_padded, void* out) const;
  float distance(const void* prepared, size_t i) const {
    return quant_ == Quantization::None
               ? float_fn_(static_cast<const float*>(prepared), reinterpret_cast<const float*>(code(i)), dim_padded_)
               : code_fn_(static_cast<const int16_t*>(prepared), code(i), dim_padded_);
  }
  // out[j] = distance(prepared, ids[j]) for j < m, in one call.
  void distances(const void* prepared, const uint32_t* ids, int m, float* out) const {
    if (quant_ == Quantization::None) {
      float_batch_(static_cast<const float*>(prepared), reinterpret_cast<const float*>(codes_), code_bytes_ / sizeof(float),
                   ids, m, dim_padded_, out);
    } else {
      code_batch_(static_cast<const int16_t*>(prepared), codes_, code_bytes_, ids, m, dim_padded_, out);
    }
  }
  void prefetch(size_t i) const { prefetch_lines(code(i), prefetch_bytes_); }
  size_t memory_bytes() const { return owned_.bytes() + offsets_.size() * sizeof(float); }

 private:
  Quantization quant_ = Quantization::None;
  Metric metric_ = Metric::L2;
  size_t n_ = 0;
  int dim_padded_ = 0;
  size_t code_bytes_ = 0;
  size_t prefetch_bytes_ = 0;
  const uint8_t* codes_ = nullptr;
  AlignedBuffer<uint8_t> owned_;
  std::vector<float> offsets_;  // per dimension: value of code 0
  float step_ = 1.0f;           // value of one code step
  FloatDistFn float_fn_ = nullptr;
  FloatBatchFn float_batch_ = nullptr;
  CodeDistFn code_fn_ = nullptr;
  CodeBatchFn code_batch_ = nullptr;
};

}  // namespace sfann
