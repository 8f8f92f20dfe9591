// Token-parallel prologue, part 2: the chunk's 16x16 matrices and the WY operand w.
//   warp 0: L = diag(b)·strict_lower(K_dec K_invᵀ) → INV = (I + L)^{-1} (fp32 forward
//           substitution, unit_lower_inverse.cuh) → A_w = INV·diag(b)
//   warp 1: Mqk = lower_incl(Q_dec K_invᵀ)
//   all 8 warps (after a barrier): w = A_w·K_dec, stored negated for the recurrence.
// L and Mqk take their operands as bf16 hi + lo pairs (three products: hi·hi,
// lo·hi, hi·lo): K_inv spans 2^±116, too wide for fp16, and a single bf16
// rounding of K_dec, K_inv or Q_dec alone costs ~1.7e-3 of relative error on out.
#pragma once
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/prologue.cuh"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/unit_lower_inverse.cuh"

namespace flashkda::sm90 {

// (X_hi + X_lo)·(K_inv_hi + K_inv_lo)ᵀ over the kDim key dimensions (the columns
// past them are zero: shared_storage.cuh), dropping lo·lo.
// load_x_hi(kk, lane): the A fragment of X_hi's key columns 16kk..16kk+15.
template <int kDim, class Smem, class LoadHi>
__device__ __forceinline__ void times_kinv_t(FragC (&c)[2], LoadHi load_x_hi, const __nv_bfloat16 (*x_lo)[kLdRow],
                                             const Smem& s, int lane) {
  zero(c[0]);
  zero(c[1]);
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    const FragA a_hi = load_x_hi(kk, lane);
    const FragA a_lo = ldsm_a(&x_lo[0][0], kLdRow, 0, 16 * kk, lane);
    FragB b_hi[2], b_lo[2];
    ldsm_b2(&s.kinv_hi[0][0], kLdRow, 0, 16 * kk, lane, b_hi[0], b_hi[1]);
    ldsm_b2(&s.kinv_lo[0][0], kLdRow, 0, 16 * kk, lane, b_lo[0], b_lo[1]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      mma_bf16(c[nt], a_hi, b_hi[nt]);
      mma_bf16(c[nt], a_lo, b_hi[nt]);
      mma_bf16(c[nt], a_hi, b_lo[nt]);
    }
  }
}

// A 16x16 product given in shared memory (wide_decay.cuh's sums) in the accumulator
// layout times_kinv_t leaves.
__device__ __forceinline__ void load_tile16(FragC (&c)[2], const float (*x)[kChunk], int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[nt].x[e] = x[g + 8 * (e >> 1)][8 * nt + 2 * t + (e & 1)];
}

// kMaybeWide (the general inputs' prologue): where `wide` is non-null, L's sum comes
// from it (wide_decay.cuh) instead of the products with K_inv.
template <int kDim, bool kMaybeWide = false, class Smem>
__device__ __forceinline__ void build_inverse(Smem& s, int lane, const float (*wide)[kChunk] = nullptr) {
  const int g = lane >> 2, t = lane & 3;
  FragC n[2];
  if (kMaybeWide && wide != nullptr)
    load_tile16(n, wide, lane);
  else
    times_kinv_t<kDim>(
        n, [&](int kk, int l) { return ldsm_a(&s.kdec_hi[0][0], kLdRow, 0, 16 * kk, l); }, s.kdec_lo, s, lane);
  // N = −diag(b)·strict_lower(·). A select, not a multiply: the masked upper
  // triangle holds products 2^(G_i − G_j) with i < j that may overflow to inf.
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 8 * nt + 2 * t + (e & 1);
      n[nt].x[e] = row > col ? -s.beta_sig[row] * n[nt].x[e] : 0.f;
    }
  FragC inv[2];
  unit_lower_inverse(n, inv, s.inverse, lane);
  // A_w = INV·diag(b): scale column j by b_j. Stored as fp16 (A operand of w) and
  // as bf16 hi + lo (B operand of uᵀ = Vᵀ A_wᵀ, whose other factor is bf16 v).
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int col = 8 * nt + 2 * t;
    const float b0 = s.beta_sig[col], b1 = s.beta_sig[col + 1];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = g + 8 * hr;
      const float x0 = inv[nt].x[2 * hr] * b0, x1 = inv[nt].x[2 * hr + 1] * b1;
      const uint32_t hi = pack_bf16(x0, x1);
      const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
      *reinterpret_cast<uint32_t*>(&s.aw_f16[row][col]) = pack_f16(x0, x1);
      *reinterpret_cast<uint32_t*>(&s.aw_hi[tile16_offset(row, col)]) = hi;
      *reinterpret_cast<uint32_t*>(&s.aw_lo[tile16_offset(row, col)]) = pack_bf16(x0 - h0, x1 - h1);
    }
  }
}

template <int kDim, bool kMaybeWide = false, class Smem>
__device__ __forceinline__ void build_mqk(Smem& s, int lane, const float (*wide)[kChunk] = nullptr) {
  const int g = lane >> 2, t = lane & 3;
  FragC m[2];
  if (kMaybeWide && wide != nullptr)
    load_tile16(m, wide, lane);
  else  // Q_dec's high part is rows 16-31 of the record's swizzled wq.
    times_kinv_t<kDim>(
        m, [&](int kk, int l) { return ldsm_a_sw128(s.wq, kChunk, 16 * kk, l); }, s.qdec_lo, s, lane);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int col = 8 * nt + 2 * t;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = g + 8 * hr;
      const float x0 = row >= col ? m[nt].x[2 * hr] : 0.f;
      const float x1 = row >= col + 1 ? m[nt].x[2 * hr + 1] : 0.f;
      const uint32_t hi = pack_bf16(x0, x1);
      *reinterpret_cast<uint32_t*>(&s.mqk_hi[tile16_offset(row, col)]) = hi;
      *reinterpret_cast<uint32_t*>(&s.mqk_lo[tile16_offset(row, col)]) =
          pack_bf16(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
    }
  }
}

// −w = −A_w·K_dec; warp w produces key columns 16w..16w+15.
template <class Smem>
__device__ __forceinline__ void build_w(Smem& s, int warp, int lane) {
  static_assert(kHeadDim == 16 * kPrologueWarps, "each warp builds two n-tiles of w");
  const int g = lane >> 2, t = lane & 3;
  const FragA a = ldsm_a(&s.aw_f16[0][0], kLdT, 0, 0, lane);
  FragB b[2];
  ldsm_b2_trans(&s.kdec16[0][0], kLdRow, 16 * warp, lane, b[0], b[1]);
  // Key columns 16w + 8j + 2t of rows g and g + 8 in wq: chunk 2(w % 4) + j of
  // atom w / 4, swizzled with row g (sw128_offset, spelt out per lane).
  const int base = (warp / 4) * 512 + g * 64 + 2 * t, swizzle = (2 * (warp % 4)) ^ g;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    FragC c;
    zero(c);
    mma_f16(c, a, b[j]);
    const int off = base + ((swizzle ^ j) << 3);
    *reinterpret_cast<uint32_t*>(&s.wq[off]) = pack_bf16(-c.x[0], -c.x[1]);
    *reinterpret_cast<uint32_t*>(&s.wq[off + 1024]) = pack_bf16(-c.x[2], -c.x[3]);  // the next 8-row group
  }
}

}  // namespace flashkda::sm90
