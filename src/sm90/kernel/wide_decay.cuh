// Token-parallel prologue, the exact path for a chunk whose decay is too wide for
// K_inv (the kGeneralInputs instantiations only).
//
// The chunk algorithm forms L and Mqk as K_dec·K_invᵀ and Q_dec·K_invᵀ with
// K_inv = k̂·2^-G, and K_res as K_inv·2^G_last. The safe gate keeps every G of a
// chunk above −5·log2(e)·16 ≈ −115.4, so 2^±G stay normal floats; a log decay
// (GateForm::kLogDecay) has no such bound, and 2^-G overflows (inf·0 = NaN in the
// products). Where a chunk's G falls below −kMaxChunkDecayLog2 (common/gate.h,
// the bound the CPU chunked backend uses too), this path never forms K_inv:
//
//   L_ij   = Σ_d k̂_id k̂_jd 2^(G_id − G_jd)           i > j   (b_i applied by build_inverse)
//   Mqk_ij = Σ_d scale·q̂_id k̂_jd 2^(G_id − G_jd)     i >= j
//   K_res  = k̂·2^(G_last − G)
//
// Every exponent is <= 0 there (G does not increase along the chunk: a log decay
// above 0 is read as 0), so nothing overflows, and what underflows is below
// 2^-126 of a term that is at most 1. K_dec, Q_dec and 2^G_last are formed as on
// the common path. Each entry is one warp's sum over the keys in fp32 (more exact
// than the bf16 hi + lo products it replaces), about as many instructions again
// as the rest of the chunk: the price of chunks whose decay passes 2^-116.
#pragma once
#include "sm90/kernel/prologue.cuh"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// Where the wide path keeps its fp32 intermediates in the prologue's shared memory:
// arrays the common path needs and this path does not (PrologueSmem::wide_g over
// kinv_hi and kinv_lo for G, kdec_hi for the two 16x16 sums). The fp32 g of the
// general inputs also arrives in G's place: it is read by gate_prefix_general, two
// barriers before G is written.
template <class Smem>
__device__ __forceinline__ float (*wide_g(Smem& s))[kHeadDim] {
  return s.wide_g;
}
struct WideSums {
  float l[kChunk][kChunk];    // Σ_d k̂_id k̂_jd 2^(G_id − G_jd), i > j
  float mqk[kChunk][kChunk];  // Σ_d scale·q̂_id k̂_jd 2^(G_id − G_jd), i >= j
};
template <class Smem>
__device__ __forceinline__ WideSums& wide_sums(Smem& s) {
  static_assert(sizeof(WideSums) <= sizeof(Smem::kdec_hi), "the two 16x16 sums fit kdec_hi");
  return *reinterpret_cast<WideSums*>(&s.kdec_hi[0][0]);
}
// G_last of each key column, published by finish_gate_prefix into row 3 of
// g_part, which no thread reads (finish_gate_prefix adds the totals of groups 0-2).
template <class Smem>
__device__ __forceinline__ float* wide_g_last(Smem& s) {
  static_assert(kRowGroups == 4, "group 3's totals are never read");
  return &s.g_part[kRowGroups - 1][0];
}

// write_decayed_operands for a wide chunk: K_dec (fp16, for w), Q_dec's high part
// (the record) and K_res (the record) as the common path writes them, and G in fp32
// for the sums; none of the mma operands of L and Mqk.
template <class Smem>
__device__ __forceinline__ void write_decayed_operands_wide(Smem& s, const ElementMap& m,
                                                            const float2 (&G)[kRowsPerThread]) {
  const float2 g_last = *reinterpret_cast<const float2*>(&wide_g_last(s)[m.d0]);
  float (*const g32)[kHeadDim] = wide_g(s);
  const SwizzledRows rows(m);
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const unsigned i = m.row(r);
    const DecayedRowInputs x(s, m, i, G[r]);
    const float k0 = x.k0, k1 = x.k1, up0 = x.up0, up1 = x.up1, rq = x.rq;
    const float2 qf = x.q;
    *reinterpret_cast<uint32_t*>(&s.kdec16[i][m.d0]) = pack_f16(k0 * up0, k1 * up1);
    const unsigned sw = rows.row(r);
    *reinterpret_cast<uint32_t*>(&s.wq[kQdecRow0 + sw]) = pack_bf16(qf.x * rq * up0, qf.y * rq * up1);
    uint32_t hi, lo;
    split_bf16x2(k0 * ex2_approx(g_last.x - G[r].x), k1 * ex2_approx(g_last.y - G[r].y), hi, lo);
    *reinterpret_cast<uint32_t*>(&s.kres_hi[sw]) = hi;
    *reinterpret_cast<uint32_t*>(&s.kres_lo[sw]) = lo;
    *reinterpret_cast<float2*>(&g32[i][m.d0]) = G[r];
  }
}

// The wide chunk's L and Mqk sums, by all kPrologueWarps warps: warp w takes rows
// w and 15 − w, so every warp sums 17 entries (i, j <= i) of both matrices; lane l
// takes keys 4l..4l+3. The upper triangles are not written: build_inverse and
// build_mqk select below the diagonal.
template <int kDim, class Smem>
__device__ __forceinline__ void wide_lower_sums(Smem& s, int warp, int lane) {
  static_assert(kChunk == 2 * kPrologueWarps && kHeadDim == 4 * 32, "two rows a warp, four keys a lane");
  const float (*const g32)[kHeadDim] = wide_g(s);
  WideSums& out = wide_sums(s);
  const int d = 4 * lane;
  const bool keys = d < kDim;  // K = 64: lanes 16-31 hold the zero padding columns
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = h == 0 ? warp : kChunk - 1 - warp;
    // k̂ and scale·q̂, normalised before any product: a row of raw elements near
    // 1e19 (huge_rows.cuh) would overflow fp32 in k_i·k_j.
    float ki[4] = {}, qi[4] = {}, gi[4] = {};
    if (keys) {
      const float rk_i = s.rnorm_k[i], rq_i = s.rnorm_q_scaled[i];
      const uint2 kw = *reinterpret_cast<const uint2*>(&s.k[i][d]);
      const uint2 qw = *reinterpret_cast<const uint2*>(&s.q[i][d]);
      const float4 gv = *reinterpret_cast<const float4*>(&g32[i][d]);
      const float2 k01 = bf16x2_bits_to_float2(kw.x), k23 = bf16x2_bits_to_float2(kw.y);
      const float2 q01 = bf16x2_bits_to_float2(qw.x), q23 = bf16x2_bits_to_float2(qw.y);
      ki[0] = k01.x * rk_i, ki[1] = k01.y * rk_i, ki[2] = k23.x * rk_i, ki[3] = k23.y * rk_i;
      qi[0] = q01.x * rq_i, qi[1] = q01.y * rq_i, qi[2] = q23.x * rq_i, qi[3] = q23.y * rq_i;
      gi[0] = gv.x, gi[1] = gv.y, gi[2] = gv.z, gi[3] = gv.w;
    }
    for (int j = 0; j <= i; ++j) {
      float lk = 0.f, lq = 0.f;
      if (keys) {
        const float rk_j = s.rnorm_k[j];
        const uint2 kw = *reinterpret_cast<const uint2*>(&s.k[j][d]);
        const float4 gv = *reinterpret_cast<const float4*>(&g32[j][d]);
        const float2 k01 = bf16x2_bits_to_float2(kw.x), k23 = bf16x2_bits_to_float2(kw.y);
        const float kj[4] = {k01.x * rk_j, k01.y * rk_j, k23.x * rk_j, k23.y * rk_j};
        const float gj[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float dk = kj[e] * ex2_approx(gi[e] - gj[e]);  // G_i − G_j <= 0
          lk = fmaf(ki[e], dk, lk);
          lq = fmaf(qi[e], dk, lq);
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        lk += __shfl_xor_sync(0xffffffffu, lk, off);
        lq += __shfl_xor_sync(0xffffffffu, lq, off);
      }
      if (lane == 0) {
        out.l[i][j] = i > j ? lk : 0.f;
        out.mqk[i][j] = lq;
      }
    }
  }
}

}  // namespace flashkda::sm90
