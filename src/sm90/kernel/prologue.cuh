// Token-parallel prologue, part 1: row norms, gates, the base-2 decay prefix and
// the decayed operands of one chunk. Element-wise work is spread over the 256
// threads of the prologue kernel: thread (d, half) owns key column d = tid % 128
// and rows 8·half..8·half+7.
#pragma once
#include "common/gate.h"
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/huge_rows.cuh"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

constexpr int kPrologueThreads = 256;
constexpr int kPrologueWarps = kPrologueThreads / 32;
// Element-wise thread map: thread (pair p, group q) owns key columns 2p, 2p+1 and
// rows 4q..4q+3, so that every shared-memory access moves two elements.
constexpr int kColPairs = kHeadDim / 2;                         // 64
constexpr int kRowGroups = kPrologueThreads / kColPairs;        // 4
constexpr int kRowsPerThread = kChunk / kRowGroups;             // 4
static_assert(kRowGroups * kRowsPerThread == kChunk, "thread map covers the chunk");

// Unsigned arithmetic throughout: as signed ints the divisions and remainders
// below each took a sign fix-up (~15 instructions a thread in all).
struct ElementMap {
  unsigned d0;     // first of the thread's two key columns
  unsigned group;  // rows 4·group .. 4·group + 3
  __device__ explicit ElementMap(unsigned tid) : d0(2 * (tid % kColPairs)), group(tid / kColPairs) {}
  __device__ unsigned row(unsigned r) const { return kRowsPerThread * group + r; }
};

__device__ __forceinline__ float2 bf16x2_bits_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// (x, y) as hi + lo bf16 pairs: hi = bf16(x), lo = bf16(x − hi).
__device__ __forceinline__ void split_bf16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(x, y);
  lo = pack_bf16(x - __uint_as_float(hi << 16), y - __uint_as_float(hi & 0xffff0000u));
}

// 1/sqrt(|x|²+1e-6) of every row of k, and the same times `scale` of every row of
// q (the product write_decayed_operands needs, formed once a row instead of once
// an element pair). Warp w handles rows 2w and 2w+1, a half-warp each (8
// elements a lane): the two rows' sums reduce side by side in four shuffle
// levels, where a whole warp a row took five levels, one row after the other.
template <class Smem>
__device__ __forceinline__ void row_norms(Smem& s, int warp, int lane, float scale) {
  static_assert(kChunk == 2 * kPrologueWarps && kHeadDim == 16 * 8, "two rows per warp, 8 columns a lane");
  const int row = 2 * warp + (lane >> 4), col = 8 * (lane & 15);
  const uint4 qv = *reinterpret_cast<const uint4*>(&s.q[row][col]);
  const uint4 kv = *reinterpret_cast<const uint4*>(&s.k[row][col]);
  const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, kw[4] = {kv.x, kv.y, kv.z, kv.w};
  float sq = 0.f, sk = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 qf = bf16x2_bits_to_float2(qw[i]), kf = bf16x2_bits_to_float2(kw[i]);
    sq = fmaf(qf.x, qf.x, fmaf(qf.y, qf.y, sq));
    sk = fmaf(kf.x, kf.x, fmaf(kf.y, kf.y, sk));
  }
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) {  // within the half-warp
    sq += __shfl_xor_sync(0xffffffffu, sq, off);
    sk += __shfl_xor_sync(0xffffffffu, sk, off);
  }
  float rq = rsqrt_approx(sq + 1e-6f), rk = rsqrt_approx(sk + 1e-6f);  // sq + 1e-6 >= 1e-6: a normal float
  const bool huge_q = squares_overflowed(sq), huge_k = squares_overflowed(sk);
  if (huge_q || huge_k) {  // uniform over the half-warp (huge_rows.cuh)
    const unsigned half = 0xffffu << (lane & 16);
    const float fq = huge_q ? kHugeRowScale : 1.f, fk = huge_k ? kHugeRowScale : 1.f;
    float sq2 = 0.f, sk2 = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 qf = bf16x2_bits_to_float2(qw[i]), kf = bf16x2_bits_to_float2(kw[i]);
      sq2 = fmaf(qf.x * fq, qf.x * fq, fmaf(qf.y * fq, qf.y * fq, sq2));
      sk2 = fmaf(kf.x * fk, kf.x * fk, fmaf(kf.y * fk, kf.y * fk, sk2));
    }
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) {
      sq2 += __shfl_xor_sync(half, sq2, off);
      sk2 += __shfl_xor_sync(half, sk2, off);
    }
    if (huge_q) rq = rsqrt_approx(sq2) * kHugeRowScale;  // sq2 >= 3.9e-3: normal
    if (huge_k) rk = rsqrt_approx(sk2) * kHugeRowScale;
  }
  if ((lane & 15) == 0) {
    s.rnorm_q_scaled[row] = rq * scale;
    s.rnorm_k[row] = rk;
  }
}

// γ = lower_bound·log2(e)·sigmoid(exp(A_log)·(g + dt_bias)) for the thread's
// elements and its inclusive prefix G over the thread's 4 rows. Each group
// publishes its column totals so later groups can add them after a barrier.
// sigmoid(a·(g + d)) = 1 / (1 + 2^(g·c + c·d)) with c = −log2(e)·a: one FMA an
// element for the exponent, where a·(g + d)·(−log2 e) took three (the prologue is
// bound by the instructions it issues). a = exp(A_log) comes clamped to
// kMaxGateScale: with a = inf, g·c and c·d could be infinities of opposite signs.
struct GateConstants {
  float c;    // −log2(e)·exp(A_log)
  float2 cd;  // c·dt_bias of the thread's two columns
};
__device__ __forceinline__ GateConstants gate_constants(float exp_a, float2 dt_bias) {
  const float c = -1.4426950408889634f * exp_a;
  return {c, make_float2(c * dt_bias.x, c * dt_bias.y)};
}
// sigmoid(a·(g + d)) of one element from g, c and c·d: γ is lower_bound·log2(e)
// times it, added to the prefix by one FMA.
__device__ __forceinline__ float gate_sigmoid(float g, float c, float cd) {
  return rcp_approx(1.f + ex2_approx(fmaf(g, c, cd)));
}
template <class Smem>
__device__ __forceinline__ void gate_prefix(Smem& s, const ElementMap& m, const GateConstants& k, float lb_log2e,
                                            float2 (&G)[kRowsPerThread]) {
  float2 acc = make_float2(0.f, 0.f);
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const float2 x = bf16x2_bits_to_float2(*reinterpret_cast<const uint32_t*>(&s.g[m.row(r)][m.d0]));
    acc.x = fmaf(lb_log2e, gate_sigmoid(x.x, k.c, k.cd.x), acc.x);
    acc.y = fmaf(lb_log2e, gate_sigmoid(x.y, k.c, k.cd.y), acc.y);
    G[r] = acc;
  }
  *reinterpret_cast<float2*>(&s.g_part[m.group][m.d0]) = acc;
}

// The general inputs' gate (the kGeneralInputs prologue): g in bf16 (s.g) or fp32
// (g32, non-null), either the raw gate (γ as gate_prefix forms it) or the log
// decay a itself (γ = a·log2(e)). A log decay above 0 is not a decay: it is read
// as 0 and reported through the return value (the kernel records it); a NaN stays
// NaN, as any NaN input does. γ is held at kMinTokenDecayLog2 and above: a token
// that keeps 2^-64 of the state instead of less adds 2^-64 of the old state, below
// the state's own fp32 rounding (2^-24) unless the old state is ~2^40 times what
// follows, while G stays finite (a = −inf, a decay of 0, would make
// the wide path's G_i − G_j NaN) and small enough (at least −1024 over a chunk) that
// those differences lose at most 2^-13 of a unit to cancellation.
constexpr float kMinTokenDecayLog2 = -64.f;

// The general inputs' gate input of the thread's row r, two columns.
template <class Smem>
__device__ __forceinline__ float2 general_gate_input(const Smem& s, const ElementMap& m, int r,
                                                     const float (*g32)[kHeadDim]) {
  return g32 != nullptr ? *reinterpret_cast<const float2*>(&g32[m.row(r)][m.d0])
                        : bf16x2_bits_to_float2(*reinterpret_cast<const uint32_t*>(&s.g[m.row(r)][m.d0]));
}

// γ of a log decay a: a·log2(e), 0 above 0, held at kMinTokenDecayLog2. Selects,
// not fminf / fmaxf, so that a NaN stays NaN.
__device__ __forceinline__ float log_decay_gamma(float a) {
  const float g = a > 0.f ? 0.f : kLog2e * a;
  return g < kMinTokenDecayLog2 ? kMinTokenDecayLog2 : g;
}

// γ of the general inputs as a product scale·factor, either form: the prefix adds
// it by one FMA, in the raw gate's form gate_prefix's own (so an fp32 raw gate
// gives the default kernels' bits), and a log decay's by fmaf(1, γ, ·), its sum.
struct GeneralGamma {
  float scale;  // lower_bound·log2(e) for the raw gate, 1 for a log decay
  bool log_decay;
  __device__ GeneralGamma(float lb_log2e, bool log_decay_form)
      : scale(log_decay_form ? 1.f : lb_log2e), log_decay(log_decay_form) {}
  __device__ float factor(float g, const GateConstants& k, float cd) const {
    return log_decay ? log_decay_gamma(g) : gate_sigmoid(g, k.c, cd);
  }
  __device__ float2 factors(float2 g, const GateConstants& k) const {
    return make_float2(factor(g.x, k, k.cd.x), factor(g.y, k, k.cd.y));
  }
};

template <class Smem>
__device__ __forceinline__ bool gate_prefix_general(Smem& s, const ElementMap& m, const GateConstants& k,
                                                    float lb_log2e, bool log_decay, const float (*g32)[kHeadDim],
                                                    float2 (&G)[kRowsPerThread]) {
  const GeneralGamma gamma(lb_log2e, log_decay);
  float2 acc = make_float2(0.f, 0.f);
  bool above_zero = false;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const float2 x = general_gate_input(s, m, r, g32);
    above_zero = above_zero || (log_decay && (x.x > 0.f || x.y > 0.f));
    const float2 f = gamma.factors(x, k);
    acc.x = fmaf(gamma.scale, f.x, acc.x);
    acc.y = fmaf(gamma.scale, f.y, acc.y);
    G[r] = acc;
  }
  *reinterpret_cast<float2*>(&s.g_part[m.group][m.d0]) = acc;
  return above_zero;
}

// Adds the totals of the earlier row groups and publishes 2^G_last (G of the last
// real row); with g_last (the general inputs), G_last itself as well.
template <class Smem>
__device__ __forceinline__ void finish_gate_prefix(Smem& s, const ElementMap& m, float2 (&G)[kRowsPerThread],
                                                   int rows, float* g_last = nullptr) {
  float2 base = make_float2(0.f, 0.f);
#pragma unroll
  for (int q = 0; q < kRowGroups - 1; ++q) {
    if (static_cast<unsigned>(q) < m.group) {
      const float2 part = *reinterpret_cast<const float2*>(&s.g_part[q][m.d0]);
      base.x += part.x;
      base.y += part.y;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    G[r].x += base.x;
    G[r].y += base.y;
    if (static_cast<int>(m.row(r)) == rows - 1) {  // unrolled compare: G stays in registers
      *reinterpret_cast<float2*>(&s.decay_last[m.d0]) = make_float2(ex2_approx(G[r].x), ex2_approx(G[r].y));
      if (g_last != nullptr) *reinterpret_cast<float2*>(&g_last[m.d0]) = G[r];
    }
  }
}

// The thread's rows 4q..4q+3 in the swizzled record operands: a base per thread
// and, per row r, r·64 + ((chunk ^ r) << 3) (sw128_row_split_holds).
struct SwizzledRows {
  unsigned base, chunk;
  __device__ explicit SwizzledRows(const ElementMap& m) {
    static_assert(kRowsPerThread == 4, "rows 4q..4q+3 per thread");
    const unsigned i0 = m.row(0);
    chunk = ((m.d0 % 64) / 8) ^ (i0 % 8);
    base = (i0 / 8) * 1024 + (m.d0 / 64) * 512 + (i0 % 8) * 64 + m.d0 % 8;
  }
  __device__ unsigned row(int r) const { return base + r * 64 + ((chunk ^ r) << 3); }
};
constexpr int kQdecRow0 = kChunk * kHeadDim;  // Q_dec is rows 16-31 of wq

// What every decayed operand of the thread's row i starts from: k̂ = k·rk and
// scale·q̂ = q·rq on its two key columns, and 2^G there.
struct DecayedRowInputs {
  float k0, k1;  // k̂
  float2 q;      // raw q; scale·q̂ = q·rq
  float rq;
  float up0, up1;  // 2^G in (0, 1]
  template <class Smem>
  __device__ DecayedRowInputs(const Smem& s, const ElementMap& m, unsigned i, float2 G) {
    const float rk = s.rnorm_k[i];
    rq = s.rnorm_q_scaled[i];
    const float2 kf = bf16x2_bits_to_float2(*reinterpret_cast<const uint32_t*>(&s.k[i][m.d0]));
    q = bf16x2_bits_to_float2(*reinterpret_cast<const uint32_t*>(&s.q[i][m.d0]));
    k0 = kf.x * rk;
    k1 = kf.y * rk;
    up0 = ex2_approx(G.x);
    up1 = ex2_approx(G.y);
  }
};

// The decayed operands of the chunk (spec section 3), written where the mma
// fragments of chunk_matrices.cuh and recurrence.cuh read them.
template <class Smem>
__device__ __forceinline__ void write_decayed_operands(Smem& s, const ElementMap& m,
                                                       const float2 (&G)[kRowsPerThread]) {
  const float2 dl = *reinterpret_cast<const float2*>(&s.decay_last[m.d0]);
  const SwizzledRows rows(m);
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const unsigned i = m.row(r);
    const DecayedRowInputs x(s, m, i, G[r]);
    const float k0 = x.k0, k1 = x.k1, up0 = x.up0, up1 = x.up1, rq = x.rq;
    const float2 qf = x.q;
    const float down0 = ex2_approx(-G[r].x), down1 = ex2_approx(-G[r].y);  // 2^-G in [1, 2^116): a normal float
    const float kdec0 = k0 * up0, kdec1 = k1 * up1;
    const float kinv0 = k0 * down0, kinv1 = k1 * down1;
    uint32_t hi, lo;
    split_bf16x2(kdec0, kdec1, hi, lo);
    *reinterpret_cast<uint32_t*>(&s.kdec_hi[i][m.d0]) = hi;
    *reinterpret_cast<uint32_t*>(&s.kdec_lo[i][m.d0]) = lo;
    split_bf16x2(kinv0, kinv1, hi, lo);
    *reinterpret_cast<uint32_t*>(&s.kinv_hi[i][m.d0]) = hi;
    *reinterpret_cast<uint32_t*>(&s.kinv_lo[i][m.d0]) = lo;
    split_bf16x2(qf.x * rq * up0, qf.y * rq * up1, hi, lo);
    const unsigned sw = rows.row(r);
    *reinterpret_cast<uint32_t*>(&s.wq[kQdecRow0 + sw]) = hi;
    *reinterpret_cast<uint32_t*>(&s.qdec_lo[i][m.d0]) = lo;
    *reinterpret_cast<uint32_t*>(&s.kdec16[i][m.d0]) = pack_f16(kdec0, kdec1);
    // K_res = K_inv · 2^G_last: 2^(G_last − G) as a product of two normal floats (no
    // third ex2), applied to K_inv (k̂ · 2^-G, at most 2^116 in size: no overflow).
    split_bf16x2(kinv0 * dl.x, kinv1 * dl.y, hi, lo);
    *reinterpret_cast<uint32_t*>(&s.kres_hi[sw]) = hi;
    *reinterpret_cast<uint32_t*>(&s.kres_lo[sw]) = lo;
  }
}

}  // namespace flashkda::sm90
