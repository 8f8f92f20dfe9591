// Rows of q and k whose squared norm overflows fp32, in the prologue.
//
// The prologue normalises a row as x / sqrt(|x|² + 1e-6) (spec section 1), with
// |x|² summed in fp32. That sum overflows for |x| above ~1.8e19 (a bf16 row can
// reach 3.4e38·sqrt(K)), and 1/sqrt(inf) = 0 would read the row as zero: a
// silent wrong answer on a valid input. Such a row is summed again with its
// elements times kHugeRowScale, and its reciprocal norm is taken back by the same
// factor. The scaled elements (each at most 3.4e38·2^-68 ~ 1.2e18) square to at
// most 1.3e36, so 128 of them stay finite; the row's |x|² (at least 3.4e38, so
// the scaled sum at least 3.9e-3) leaves the 1e-6 below fp32's rounding, and it
// is dropped there. The test for it (the first sum is +inf) is uniform over the
// threads that share the sum, and no ordinary row takes the branch: its cost is
// the comparison (the forward measured level, docs/perf-log.md).
//
// The decode kernels do not take this path: there the same test and rescale cost
// the latency-bound steps 2-17 % (registers and a spill in the token loop), so a
// decode reads such a row as zero (README, "Decode").
#pragma once

namespace flashkda::sm90 {

constexpr float kHugeRowScale = 0x1p-68f;

// Whether a row's fp32 sum of squares overflowed (+inf; a NaN row stays on the
// ordinary path and gives NaN, as the contract does).
__device__ __forceinline__ bool squares_overflowed(float sum_of_squares) { return isinf(sum_of_squares); }

}  // namespace flashkda::sm90
