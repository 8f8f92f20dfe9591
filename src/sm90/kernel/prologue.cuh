// Token-parallel prologue, part 1: row norms, gates, the base-2 decay prefix and
// the decayed operands of one chunk. Element-wise work is spread over the 256
// threads of the prologue kernel: thread (d, half) owns key column d = tid % 128
// and rows 8·half..8·half+7.
#pragma once
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

constexpr int kPrologueThreads = 256;
constexpr int kPrologueWarps = kPrologueThreads / 32;
constexpr int kRowsPerThread = kChunk / (kPrologueThreads / kHeadDim);  // 8
static_assert(kPrologueThreads % kHeadDim == 0 && kRowsPerThread == 8, "thread map assumes 256 threads, K = 128");

// x as hi + lo, two bf16 numbers: hi = bf16(x), lo = bf16(x − hi).
__device__ __forceinline__ void split_bf16(float x, __nv_bfloat16& hi, __nv_bfloat16& lo) {
  hi = __float2bfloat16_rn(x);
  lo = __float2bfloat16_rn(x - __bfloat162float(hi));
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// 1/sqrt(|x|²+1e-6) of every row of q and k; warp w handles rows 2w and 2w+1.
template <class Stage>
__device__ __forceinline__ void row_norms(const Stage& st, float* rnorm_q, float* rnorm_k, int warp, int lane) {
  static_assert(kChunk == 2 * kPrologueWarps, "two rows per warp");
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = 2 * warp + rr;
    const uint2 qv = *reinterpret_cast<const uint2*>(&st.q[row][4 * lane]);
    const uint2 kv = *reinterpret_cast<const uint2*>(&st.k[row][4 * lane]);
    float sq = 0.f, sk = 0.f;
    const uint32_t qw[2] = {qv.x, qv.y}, kw[2] = {kv.x, kv.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float q0 = __uint_as_float(qw[i] << 16), q1 = __uint_as_float(qw[i] & 0xffff0000u);
      const float k0 = __uint_as_float(kw[i] << 16), k1 = __uint_as_float(kw[i] & 0xffff0000u);
      sq = fmaf(q0, q0, fmaf(q1, q1, sq));
      sk = fmaf(k0, k0, fmaf(k1, k1, sk));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, off);
      sk += __shfl_xor_sync(0xffffffffu, sk, off);
    }
    if (lane == 0) {
      rnorm_q[row] = rsqrtf(sq + 1e-6f);
      rnorm_k[row] = rsqrtf(sk + 1e-6f);
    }
  }
}

// γ = lower_bound·log2(e)·sigmoid(exp(A_log)·(g + dt_bias)) for the thread's 8 rows,
// and its inclusive prefix G within those rows. Threads of the first half publish
// their total so the second half can add it after a barrier (finish_gate_prefix).
template <class Stage>
__device__ __forceinline__ void gate_prefix(const Stage& st, float exp_a, float dt_bias, float lb_log2e, int d,
                                            int half, float (&G)[kRowsPerThread], float* g_half) {
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const float x = bf16_bits_to_float(st.g[kRowsPerThread * half + r][d]);
    acc += lb_log2e * sigmoid(exp_a * (x + dt_bias));
    G[r] = acc;
  }
  if (half == 0) g_half[d] = acc;
}

// Completes G for the rows 8-15 and publishes 2^G_last (G of the last real row).
__device__ __forceinline__ void finish_gate_prefix(float (&G)[kRowsPerThread], int d, int half, int rows,
                                                   const float* g_half, float* decay_last) {
  if (half == 1) {
    const float base = g_half[d];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) G[r] += base;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    if (kRowsPerThread * half + r == rows - 1) {  // unrolled compare: G stays in registers
      decay_last[d] = ex2_approx(G[r]);
    }
  }
}

// The decayed operands of the chunk (spec section 3), written where the mma
// fragments of chunk_matrices.cuh and recurrence.cuh read them.
template <class Smem>
__device__ __forceinline__ void write_decayed_operands(Smem& s, const float (&G)[kRowsPerThread], float scale, int d,
                                                       int half) {
  const float dl = s.decay_last[d];
  __align__(16) __half kdec_col[kRowsPerThread];
  __align__(16) __nv_bfloat16 kres_col[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = kRowsPerThread * half + r;
    const float kk = bf16_bits_to_float(s.k[i][d]) * s.rnorm_k[i];
    const float qq = bf16_bits_to_float(s.q[i][d]) * s.rnorm_q[i] * scale;
    const float up = ex2_approx(G[r]);     // 2^G   in (0, 1]
    const float down = ex2_approx(-G[r]);  // 2^-G  in [1, 2^116): still a normal float
    const float kdec = kk * up;
    split_bf16(kdec, s.kdec_hi[i][d], s.kdec_lo[i][d]);
    split_bf16(kk * down, s.kinv_hi[i][d], s.kinv_lo[i][d]);
    split_bf16(qq * up, s.qdec[i][d], s.qdec_lo[i][d]);
    kdec_col[r] = __float2half_rn(kdec);
    // 2^(G_last − G) as a product of two normal floats (no third ex2); <= 1 on real rows.
    kres_col[r] = __float2bfloat16_rn(kk * (dl * down));
  }
  *reinterpret_cast<uint4*>(&s.kdecT[d][kRowsPerThread * half]) = *reinterpret_cast<const uint4*>(kdec_col);
  *reinterpret_cast<uint4*>(&s.kresT[d][kRowsPerThread * half]) = *reinterpret_cast<const uint4*>(kres_col);
}

}  // namespace flashkda::sm90
