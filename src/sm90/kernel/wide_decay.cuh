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
// than the bf16 hi + lo products it replaces); each entry's decay is the entry
// before's times one row's step 2^γ, so no entry takes an ex2. A forward with
// every chunk wide takes ~1.4x the common path's time: the price of chunks whose
// decay passes 2^-116.
#pragma once
#include "sm90/kernel/prologue.cuh"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// Where the wide path keeps its fp32 intermediates in the prologue's shared memory:
// arrays the common path needs and this path does not (PrologueSmem::wide_g over
// kinv_hi and kinv_lo for the rows' decay steps, wide_khat over kdec_lo and kdec_hi
// for k̂ in fp32, qdec_lo for the two 16x16 sums).
// The fp32 g of the general inputs also arrives there: it is read by
// gate_prefix_general and write_decayed_operands_wide, the latter a barrier before
// the steps are written.
template <class Smem>
__device__ __forceinline__ float (*wide_g(Smem& s))[kHeadDim] {
  return s.wide_g;
}
// The same array holds each row's decay step 2^γ_i = 2^(G_i − G_{i−1}) once the
// gate has been read (write_decayed_operands_wide).
template <class Smem>
__device__ __forceinline__ float (*wide_steps(Smem& s))[kHeadDim] {
  return s.wide_g;
}
struct WideSums {
  float l[kChunk][kChunk];    // Σ_d k̂_id k̂_jd 2^(G_id − G_jd), i > j
  float mqk[kChunk][kChunk];  // Σ_d scale·q̂_id k̂_jd 2^(G_id − G_jd), i >= j
};
template <class Smem>
__device__ __forceinline__ WideSums& wide_sums(Smem& s) {
  static_assert(sizeof(WideSums) <= sizeof(Smem::qdec_lo), "the two 16x16 sums fit qdec_lo");
  return *reinterpret_cast<WideSums*>(&s.qdec_lo[0][0]);
}
// k̂ in fp32, [row][key] (PrologueSmem::wide_khat over g_part, kdec_lo and kdec_hi).
template <class Smem>
__device__ __forceinline__ float (*wide_khat(Smem& s))[kHeadDim] {
  return s.wide_khat;
}
// G_last of each key column, published by finish_gate_prefix into row 3 of
// g_part, which no thread reads (finish_gate_prefix adds the totals of groups 0-2).
template <class Smem>
__device__ __forceinline__ float* wide_g_last(Smem& s) {
  static_assert(kRowGroups == 4, "group 3's totals are never read");
  return &s.g_part[kRowGroups - 1][0];
}

// write_decayed_operands for a wide chunk: K_dec (fp16, for w), Q_dec's high part
// (the record) and K_res (the record) as the common path writes them, and each
// row's step 2^γ_i = 2^(G_i − G_{i−1}) in fp32 for the sums; none of the mma
// operands of L and Mqk. The steps come from the gate's input again (g32 or s.g,
// as gate_prefix_general read them), not as differences of G: where G has reached
// −1000 a difference is off by up to 2^-13 absolute (G's own rounding), a large
// error on a small γ, where a step from γ itself is off by 2^-24 of γ, and the
// fifteen steps wide_lower_sums multiplies add no more than fifteen of those.
// s.g shares its memory with kdec16 and g32 with the steps: the inputs are read
// before a barrier, the outputs written after it (a wide chunk is the CTA's, so
// every thread takes this path).
template <class Smem>
__device__ __forceinline__ void write_decayed_operands_wide(Smem& s, const ElementMap& m,
                                                            const float2 (&G)[kRowsPerThread],
                                                            const GateConstants& k, float lb_log2e, bool log_decay,
                                                            const float (*g32)[kHeadDim]) {
  const GeneralGamma gamma(lb_log2e, log_decay);
  float2 step[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    // γ as gate_prefix_general forms it, from the same input
    const float2 f = gamma.factors(general_gate_input(s, m, r, g32), k);
    step[r] = make_float2(ex2_approx(gamma.scale * f.x), ex2_approx(gamma.scale * f.y));  // <= 1
  }
  const float2 g_last = *reinterpret_cast<const float2*>(&wide_g_last(s)[m.d0]);
  __syncthreads();  // every read of s.g and g_part before kdec16's and k̂'s writes
  float (*const steps)[kHeadDim] = wide_steps(s);
  float (*const khat)[kHeadDim] = wide_khat(s);
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
    *reinterpret_cast<float2*>(&steps[i][m.d0]) = step[r];
    *reinterpret_cast<float2*>(&khat[i][m.d0]) = make_float2(k0, k1);
  }
}

// The wide chunk's L and Mqk sums, by all kPrologueWarps warps: warp w takes rows
// w and 15 − w, so every warp sums 17 entries (i, j <= i) of both matrices; lane l
// takes keys 4l..4l+3. The upper triangles are not written: build_inverse and
// build_mqk select below the diagonal.
//
// Row i's entries run from j = i down to 0, each key's decay 2^(G_i − G_j) the
// entry before's times row j + 1's step (a product of
// factors <= 1: what underflows stays below 2^-126 of a term that is at most 1),
// instead of an ex2 of a difference an entry. Entries go four at a time, their
// eight partial sums (L and Mqk of each) reduced over the warp by one
// reduce-scatter: at each of three levels a lane keeps half of its values and
// trades the other half with its partner, then the last value is summed over the
// lane's quad; lane 4v + t (t < 4) ends with value v. Nine shuffles for eight sums,
// where one butterfly a sum took forty.
template <int kDim, class Smem>
__device__ __forceinline__ void wide_lower_sums(Smem& s, int warp, int lane) {
  static_assert(kChunk == 2 * kPrologueWarps && kHeadDim == 4 * 32, "two rows a warp, four keys a lane");
  constexpr int kBatch = 4;  // entries a reduce-scatter: 2·kBatch = 8 values over 3 levels of 32 lanes
  const float (*const steps)[kHeadDim] = wide_steps(s);
  const float (*const khat)[kHeadDim] = wide_khat(s);
  WideSums& out = wide_sums(s);
  const int d = 4 * lane;
  const bool keys = d < kDim;  // K = 64: lanes 16-31 hold the zero padding columns
  const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0, hi4 = (lane & 4) != 0;
  const int held = (lane >> 2) & 7;  // the value this lane holds after the reduce-scatter
#pragma unroll 1
  for (int h = 0; h < 2; ++h) {
    const int i = h == 0 ? warp : kChunk - 1 - warp;
    // k̂ (wide_khat) and scale·q̂, normalised before any product: a row of raw
    // elements near 1e19 (huge_rows.cuh) would overflow fp32 in k_i·k_j.
    float ki[4] = {}, qi[4] = {};
    if (keys) {
      const float rq_i = s.rnorm_q_scaled[i];
      const float4 kv = *reinterpret_cast<const float4*>(&khat[i][d]);
      const uint2 qw = *reinterpret_cast<const uint2*>(&s.q[i][d]);
      const float2 q01 = bf16x2_bits_to_float2(qw.x), q23 = bf16x2_bits_to_float2(qw.y);
      ki[0] = kv.x, ki[1] = kv.y, ki[2] = kv.z, ki[3] = kv.w;
      qi[0] = q01.x * rq_i, qi[1] = q01.y * rq_i, qi[2] = q23.x * rq_i, qi[3] = q23.y * rq_i;
    }
    float decay[4] = {1.f, 1.f, 1.f, 1.f};  // 2^(G_i − G_j) on the lane's keys, from j = i
#pragma unroll 1
    for (int j0 = i; j0 >= 0; j0 -= kBatch) {
      float v[2 * kBatch];  // v[2u], v[2u + 1]: L's and Mqk's partial sums of entry j0 − u
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int j = j0 - u;
        float lk = 0.f, lq = 0.f;
        if (j >= 0 && keys) {
          const float4 kv = *reinterpret_cast<const float4*>(&khat[j][d]);
          const float kj[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float dk = kj[e] * decay[e];
            lk = fmaf(ki[e], dk, lk);
            lq = fmaf(qi[e], dk, lq);
          }
          if (j > 0) {  // on to j − 1: times 2^(G_j − G_{j−1})
            const float4 st = *reinterpret_cast<const float4*>(&steps[j][d]);
            decay[0] *= st.x, decay[1] *= st.y, decay[2] *= st.z, decay[3] *= st.w;
          }
        }
        v[2 * u] = lk;
        v[2 * u + 1] = lq;
      }
      // Reduce-scatter: keep values 4·hi16 + .., then 2·hi8 + .., then hi4.
      float w4[4], w2[2];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w4[e] = (hi16 ? v[e + 4] : v[e]) + __shfl_xor_sync(0xffffffffu, hi16 ? v[e] : v[e + 4], 16);
#pragma unroll
      for (int e = 0; e < 2; ++e)
        w2[e] = (hi8 ? w4[e + 2] : w4[e]) + __shfl_xor_sync(0xffffffffu, hi8 ? w4[e] : w4[e + 2], 8);
      float x = (hi4 ? w2[1] : w2[0]) + __shfl_xor_sync(0xffffffffu, hi4 ? w2[0] : w2[1], 4);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      const int j = j0 - (held >> 1);
      if ((lane & 3) == 0 && j >= 0) {
        if (held & 1)
          out.mqk[i][j] = x;
        else
          out.l[i][j] = i > j ? x : 0.f;
      }
    }
  }
}

}  // namespace flashkda::sm90
