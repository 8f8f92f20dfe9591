// Checkpoints (ForwardArgs::checkpoints) for the CPU backends: where each
// sequence's entries start, and one entry written from a [V][K] state.
#pragma once
#include <cstdint>
#include <vector>

#include "common/bf16.h"
#include "common/sequences.h"
#include "flashkda/flashkda.h"

namespace flashkda::cpu {

inline int64_t checkpoints_of(int64_t length, int64_t interval) { return (length + interval - 1) / interval; }

// checkpoint_offset(n) = Σ_{m<n} ceil(L_m / c); one past the end at [N] (the total).
inline std::vector<int64_t> checkpoint_offsets(const ForwardArgs& a, const std::vector<SequenceSpan>& spans) {
  std::vector<int64_t> off(spans.size() + 1, 0);
  for (size_t n = 0; n < spans.size(); ++n) off[n + 1] = off[n] + checkpoints_of(spans[n].length, a.checkpoint_interval);
  return off;
}

// Entry `entry`, value head hv, from the state S [V][K] (float or double).
template <typename T>
void write_checkpoint(const ForwardArgs& a, int64_t entry, int64_t hv, const T* S) {
  const int64_t HV = value_heads(a), K = a.head_dim_k, V = a.head_dim_v;
  const int64_t base = (entry * HV + hv) * K * V;
  for (int64_t e = 0; e < V; ++e)
    for (int64_t d = 0; d < K; ++d) {
      const float x = static_cast<float>(S[e * K + d]);
      const int64_t at = base + (a.checkpoints_value_major ? e * K + d : d * V + e);
      if (a.checkpoints_dtype == DType::kFP32) static_cast<float*>(a.checkpoints)[at] = x;
      else static_cast<uint16_t*>(a.checkpoints)[at] = float_to_bf16(x);
    }
}

}  // namespace flashkda::cpu
