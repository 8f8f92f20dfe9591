// Rows of bf16 q or k whose fp32 sum of squares overflows (|x| above ~1.8e19):
// what src/sm90/kernel/huge_rows.cuh and the CPU backends' double sums handle.
// Shared by the CPU and GPU tests of the forward and the decode.
#pragma once

#include <cstdint>
#include <vector>

#include "common/bf16.h"

namespace flashkda::testing {

// In the bf16 matrix `x` of rows of `width` elements: row `scaled` times 2^70
// (exact; |x| ~ 1e22), row `one_element` with its first element 1e30, and row
// `at_the_top` with every element ±3.0e38 (the row's own signs; bf16 tops out
// at 3.39e38). Their normalised rows are those of ordinary rows (scaled) or of
// simple ones, so the outputs stay of ordinary size.
inline void make_rows_huge(std::vector<uint16_t>& x, int64_t width, int64_t scaled, int64_t one_element,
                           int64_t at_the_top) {
  for (int64_t d = 0; d < width; ++d) {
    uint16_t& s = x[static_cast<size_t>(scaled * width + d)];
    s = float_to_bf16(bf16_to_float(s) * 0x1p70f);
    uint16_t& t = x[static_cast<size_t>(at_the_top * width + d)];
    t = float_to_bf16(bf16_to_float(t) < 0.f ? -3.0e38f : 3.0e38f);
  }
  x[static_cast<size_t>(one_element * width)] = float_to_bf16(1e30f);
}

}  // namespace flashkda::testing
