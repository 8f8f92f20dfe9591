// Checkpoints (ForwardArgs::checkpoints) for the CPU backends: one entry written
// from a [V][K] state (where each sequence's entries start: common/sequences.h).
#pragma once
#include <cstdint>
#include <vector>

#include "common/bf16.h"
#include "common/sequences.h"
#include "flashkda/flashkda.h"

namespace flashkda::cpu {

// Entry `entry`, value head hv, from the state S [V][K] (float or double): its rows
// [row_begin, row_end), all of them by default.
template <typename T>
void write_checkpoint(const ForwardArgs& a, int64_t entry, int64_t hv, const T* S, int64_t row_begin = 0,
                      int64_t row_end = -1) {
  const int64_t HV = value_heads(a), K = a.head_dim_k, V = a.head_dim_v;
  const int64_t base = (entry * HV + hv) * K * V;
  if (row_end < 0) row_end = V;
  for (int64_t e = row_begin; e < row_end; ++e)
    for (int64_t d = 0; d < K; ++d) {
      const float x = static_cast<float>(S[e * K + d]);
      const int64_t at = base + (a.checkpoints_value_major ? e * K + d : d * V + e);
      if (a.checkpoints_dtype == DType::kFP32) static_cast<float*>(a.checkpoints)[at] = x;
      else static_cast<uint16_t*>(a.checkpoints)[at] = float_to_bf16(x);
    }
}

}  // namespace flashkda::cpu
