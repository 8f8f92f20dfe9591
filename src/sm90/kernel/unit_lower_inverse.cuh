// (I + L)^{-1} of a strictly lower-triangular 16x16 L, by one warp, in fp32.
//
// Forward substitution, right-looking: with X = (I + L)^{-1} and N = −L, column
// c of X starts as e_c, and once its entry x_p is final every later row takes
// its share:
//     x_i ← x_i + N_ip · x_p        for p = 0..14, i = p+1..15
// 120 fp32 FMAs a column; lane c (and lane c + 16, which repeats it) owns column
// c in 16 registers and reads column p of N from shared memory as broadcast
// vectors. The chain is 15 dependent FMAs long; each entry is a dot product of
// terms no larger than the inverse itself, so the result is exact to fp32
// rounding for every |L_ij| <= 1 (docs/design.md, "The inverse").
//
// Why not the Neumann product (I + N)(I + N²)(I + N⁴)(I + N⁸) on the tensor
// cores, which is fewer instructions: with near-collinear keys, b → 1 and slow
// decay, L tends to the all-ones strictly lower matrix, whose N⁸ has entries up
// to C(15,7) = 6435 while X stays within ±1; the product then lives on
// cancellation between large partial sums, which fp16 operands (or bf16 hi + lo
// pairs) cannot represent. It returned NaN and errors up to 10³ on such input.
#pragma once
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// n = N = −L as two fp32 C tiles (columns 0-7, 8-15), zero on and above the
// diagonal; returns X = (I + L)^{-1} the same way. Warp-synchronous.
__device__ __forceinline__ void unit_lower_inverse(const FragC (&n)[2], FragC (&inv)[2], InverseScratch& s,
                                                   int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s.nT[8 * nt + 2 * t + (e & 1)][g + 8 * (e >> 1)] = n[nt].x[e];
  __syncwarp();

  const int c = lane & 15;
  float x[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) x[i] = i == c ? 1.f : 0.f;
#pragma unroll
  for (int p = 0; p < kChunk - 1; ++p) {
    // Column p of N below the diagonal, from the first 4-aligned vector that holds row p+1.
#pragma unroll
    for (int q = (p + 1) / 4; q < kChunk / 4; ++q) {
      const float4 col = *reinterpret_cast<const float4*>(&s.nT[p][4 * q]);
      const float nc[4] = {col.x, col.y, col.z, col.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (4 * q + e > p) x[4 * q + e] = fmaf(nc[e], x[p], x[4 * q + e]);
    }
  }

  // Lanes 0-15 store rows 0-7 of their column, lanes 16-31 rows 8-15.
  const bool upper = lane < 16;
#pragma unroll
  for (int r = 0; r < kChunk / 2; ++r) s.x[r + (upper ? 0 : 8)][c] = upper ? x[r] : x[r + 8];
  __syncwarp();
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float2 v = *reinterpret_cast<const float2*>(&s.x[g + 8 * hr][8 * nt + 2 * t]);
      inv[nt].x[2 * hr] = v.x;
      inv[nt].x[2 * hr + 1] = v.y;
    }
}

}  // namespace flashkda::sm90
