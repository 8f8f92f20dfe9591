// The latency decode kernel ("lat"; A/B against d2 in docs/perf-log.md, decode).
//
// At a few sequences a decode step is one CTA per SM, and Nsight Compute put
// d2's CTA at ~4,400 active cycles for one token (N = 1, H = 32, fp32 pool),
// against ~1,000 for the same loads and stores without the math (rmw): ~600
// instructions a warp, mostly a dependent chain. Two chains meet before the
// state update: the state (pool index, then the slot's rows) and the token's
// per-column vectors (norms, gates). d2 builds the vectors CTA-wide (a block
// reduction, two barriers) with IEEE divisions, square roots and expf, each
// with a slow-path branch, which takes longer than the state's two round
// trips; its state pass then runs two dependent dot products (S k̂, then S q̂
// after the update). Here:
//  * every warp builds the token's vectors itself (4 columns a lane, butterfly
//    reductions, no block barrier, only __syncwarp), with the approximate
//    intrinsics (__expf, __fdividef, rsqrtf: a few ulp, far inside the error
//    bars of the tests), so they are ready before the state is;
//  * one pass over the state gives (S·diag(decay)) k̂ and (S·diag(decay)) q̂ in
//    eight independent FMA chains; o = S_dec q̂ + coef·(k̂·q̂) is stored before
//    the state update, which is off the output's path.
// Same work split and state layout as d2 (the first kernel, removed): 128 threads per
// (sequence, value head, 32 rows of V); thread (row, part) holds the columns
// 4·(part + 4·jj) + e, jj < 8, e < 4.
// K = V = 64 (kDim), the only decode kernel built for 64 (its state traffic is
// exact); jj < 4 (columns 0..63). Two builds (kRows, chosen in sm90_decode.cu):
//  * one row a thread, two CTAs per (sequence, head) of 32 rows each: for a few
//    pairs, where the grid is far from filling the GPU and a CTA's chain is the
//    step's time;
//  * two rows 32 apart, one CTA per (sequence, head): a CTA moves as many state
//    bytes as at 128 and builds the token's vectors once for twice the rows.
// The vectors are built 128 wide with columns 64..127 zero (lanes 16..31 load
// nothing), which the state never reads.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/decode/decode_common.cuh"

namespace flashkda::sm90 {

constexpr int kLatWarps = kDecodeThreads / 32;
constexpr int kLatColsPerLane = kDecodeDim / 32;  // 4: lane l builds columns 4l .. 4l+3

// One warp's copy of the token's per-column vectors.
struct LatencyVectors {
  __align__(16) float dkhat[kDecodeDim];  // decay · k̂
  __align__(16) float dqhat[kDecodeDim];  // decay · q̂ · scale
  __align__(16) float decay[kDecodeDim];
  __align__(16) float khat[kDecodeDim];
};

// Token t's inputs for lane `lane` (columns 4·lane .. 4·lane + 3) and for the
// thread's rows of v (row0 + kDecodeRows·i, i < kRows). Element loads: the API
// promises these tensors only 2-byte alignment.
template <int kRows>
struct WarpTokenInputs {
  float q[kLatColsPerLane], k[kLatColsPerLane], g[kLatColsPerLane], beta, v[kRows];
};
// kStrided: the token tensors' strides from DecodeParams (views of a fused
// projection); else dense [T, heads, dim]. kGeneral: also the general inputs' fp32
// g and beta (DecodeParams::g_f32, beta_f32).
template <int kDim, int kRows, bool kStrided, bool kGeneral = false>
__device__ __forceinline__ WarpTokenInputs<kRows> load_warp_token_inputs(const DecodeParams& p, int64_t t, int h,
                                                                         int hv, int lane, int row0) {
  const int col = kLatColsPerLane * lane;
  int64_t q_off, k_off, g_off, v_off, b_off;
  if constexpr (kStrided) {
    q_off = q_at(p, t, h) + col;
    k_off = k_at(p, t, h) + col;
    g_off = g_at(p, t, hv) + col;
    v_off = v_at(p, t, hv) + row0;
    b_off = beta_at(p, t, hv);
  } else {
    q_off = k_off = (t * p.num_heads + h) * kDim + col;
    const int64_t vh = t * p.num_v_heads + hv;
    g_off = vh * kDim + col;
    v_off = vh * kDim + row0;
    b_off = vh;
  }
  WarpTokenInputs<kRows> in{};
  const bool g_f32 = kGeneral && p.g_f32 != nullptr, beta_f32 = kGeneral && p.beta_f32 != nullptr;
  if (kDim == kDecodeDim || col < kDim) {
#pragma unroll
    for (int e = 0; e < kLatColsPerLane; ++e) {
      in.q[e] = bf16_at(p.q, q_off + e);
      in.k[e] = bf16_at(p.k, k_off + e);
      in.g[e] = g_f32 ? p.g_f32[g_off + e] : bf16_at(p.g, g_off + e);
    }
  }
  in.beta = beta_f32 ? p.beta_f32[b_off] : bf16_at(p.beta, b_off);
#pragma unroll
  for (int i = 0; i < kRows; ++i) in.v[i] = bf16_at(p.v, v_off + kDecodeRows * i);
  return in;
}

// kMinBlocks: four CTAs an SM (128 registers) for both pool dtypes; the kernel
// serves the steps with fewer than 256 (sequence, head) pairs, at most two
// waves of 4 x 132 CTAs.
// kVerify: speculative verify (DecodeParams::verify_slots): the state after
// each token goes to that token's slot of the sequence's row of indices, and
// there is no final store (the last token's slot has it). Verify steps are a
// few tokens for few sequences, the latency regime this kernel is built for.
// kRows: the rows a thread holds, kDecodeRows apart (2 only at K = 64).
// kStrided: token tensors read through their strides (views of a fused
// projection output), the build every strided decode runs.
// kGeneral (with kStrided): the general inputs (DecodeParams::gate_log_decay,
// beta_probability, g_f32, beta_f32) read at run time; the build every decode with
// them runs, so that the others keep their code.
template <bool kFp32, int kMinBlocks, bool kVerify = false, int kDim = kDecodeDim, int kRows = 1,
          bool kStrided = false, bool kGeneral = false>
__global__ void __launch_bounds__(kDecodeThreads, kMinBlocks)
    kda_decode_latency_kernel(const __grid_constant__ DecodeParams p) {
  static_assert(kDim == 64 || kDim == kDecodeDim, "K = V = 64 or 128");
  static_assert(kRows == 1 || (kRows == 2 && kDim == 64), "two rows a thread only at K = 64");
  constexpr int kSlices = kDim / (kDecodeRows * kRows);   // CTAs per (sequence, head)
  constexpr int kGroups = kDim / 16;                      // jj: the thread's 4-column groups
  using IO = StateIO<kFp32>;
  __shared__ LatencyVectors vecs[kLatWarps];

  const DecodeTile tile = decode_tile<kSlices, true>(p);
  const int hv = tile.hv, h = tile.h;
  const int tid = threadIdx.x, lane = tid & 31;
  const int row = tile.slice * kDecodeRows * kRows + tid / 4, part = tid & 3;  // the first of its rows
  LatencyVectors& sh = vecs[tid / 32];
  wait_for_prior_grids();
  allow_dependent_grids();

  // Everything that does not depend on the pool slot is requested before the
  // slot is known (as in d2).
  const DecodeSequence seq = decode_sequence<kVerify>(p, tile.n);
  uint32_t faults = seq.faults;
  const int64_t t0 = seq.t0, t1 = seq.t1;
  static_assert(!kGeneral || kStrided, "the general inputs' build addresses by strides");
  // The general inputs' log decay reads neither A_log nor dt_bias, which may then be null.
  const bool log_decay = kGeneral && p.gate_log_decay != 0;
  // Clamped as the forward's prologue clamps it (common/gate.h): exp(A_log) past
  // fp32's range times a zero g + dt_bias is the contract's sigmoid(0), not NaN.
  const float exp_a = log_decay ? 0.f : clamp_gate_scale(__expf(p.A_log[hv]));
  float dt_bias[kLatColsPerLane] = {};
  if (!log_decay && (kDim == kDecodeDim || kLatColsPerLane * lane < kDim)) {
#pragma unroll
    for (int e = 0; e < kLatColsPerLane; ++e)
      dt_bias[e] = p.dt_bias[static_cast<int64_t>(hv) * kDim + kLatColsPerLane * lane + e];
  }
  WarpTokenInputs<kRows> next{};
  if (t0 < t1) next = load_warp_token_inputs<kDim, kRows, kStrided, kGeneral>(p, t0, h, hv, lane, row);
  const int64_t slot = seq.slot;
  if (slot < 0 || slot >= p.pool_size) {  // padding entry or index past the pool: no access
    report_decode_faults<kVerify>(p, tile, faults);
    return;
  }

  // Row i of the thread: row + kDecodeRows·i, at head_off + i·kRowStep.
  const int64_t head_off = (static_cast<int64_t>(hv) * kDim + row) * kDim;
  constexpr int64_t kRowStep = int64_t{kDecodeRows} * kDim;
  float s[kRows][4 * kGroups];  // s[i][4·jj + e] = S[row i][4·(part + 4·jj) + e]
  {
    const int64_t base = slot * p.pool_stride + head_off;
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj) {
        const float4 x = IO::load4(p.pool, base + i * kRowStep + 4 * (part + 4 * jj));
        s[i][4 * jj] = x.x; s[i][4 * jj + 1] = x.y; s[i][4 * jj + 2] = x.z; s[i][4 * jj + 3] = x.w;
      }
  }
  // The thread's rows to memory at `base` (+ i·kRowStep).
  auto store_rows = [&](void* dst, int64_t base) {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj)
        IO::store4(dst, base + i * kRowStep + 4 * (part + 4 * jj),
                   make_float4(s[i][4 * jj], s[i][4 * jj + 1], s[i][4 * jj + 2], s[i][4 * jj + 3]));
  };
  for (int64_t t = t0; t < t1; ++t) {
    // Verify: this token's slot, requested before the math that precedes its store.
    const int64_t token_slot = kVerify ? index_at(p, p.indices, tile.n * p.verify_slots + (t - t0)) : -1;
    const WarpTokenInputs<kRows> in = next;
    if (t + 1 < t1) next = load_warp_token_inputs<kDim, kRows, kStrided, kGeneral>(p, t + 1, h, hv, lane, row);
    const int64_t vh = t * p.num_v_heads + hv;

    // The token's vectors, built by this warp alone.
    float qq = 0.f, kk = 0.f, qk = 0.f;
#pragma unroll
    for (int e = 0; e < kLatColsPerLane; ++e) {
      qq = fmaf(in.q[e], in.q[e], qq);
      kk = fmaf(in.k[e], in.k[e], kk);
      qk = fmaf(in.q[e], in.k[e], qk);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      qq += __shfl_xor_sync(0xffffffffu, qq, off);
      kk += __shfl_xor_sync(0xffffffffu, kk, off);
      qk += __shfl_xor_sync(0xffffffffu, qk, off);
    }
    const float rq = rsqrtf(qq + 1e-6f), rk = rsqrtf(kk + 1e-6f);
    const float q_scale = rq * p.scale;
    const float kq = qk * rk * q_scale;  // k̂·q̂·scale
    float kh[kLatColsPerLane], dc[kLatColsPerLane], dk[kLatColsPerLane], dq[kLatColsPerLane];
    bool above_zero = false;  // a log decay above 0: read as 0, recorded
#pragma unroll
    for (int e = 0; e < kLatColsPerLane; ++e) {
      if (log_decay) {
        above_zero = above_zero || in.g[e] > 0.f;
        dc[e] = __expf(in.g[e] > 0.f ? 0.f : in.g[e]);  // a NaN stays NaN
      } else {
        const float x = exp_a * (in.g[e] + dt_bias[e]);
        dc[e] = __expf(p.lower_bound * __fdividef(1.f, 1.f + __expf(-x)));  // exp(lower_bound·sigmoid(x))
      }
      kh[e] = in.k[e] * rk;
      dk[e] = dc[e] * kh[e];
      dq[e] = dc[e] * (in.q[e] * q_scale);
    }
    if (above_zero) record_fault(kFaultDecodeGate, t);
    const int c0 = kLatColsPerLane * lane;
    *reinterpret_cast<float4*>(&sh.khat[c0]) = make_float4(kh[0], kh[1], kh[2], kh[3]);
    *reinterpret_cast<float4*>(&sh.decay[c0]) = make_float4(dc[0], dc[1], dc[2], dc[3]);
    *reinterpret_cast<float4*>(&sh.dkhat[c0]) = make_float4(dk[0], dk[1], dk[2], dk[3]);
    *reinterpret_cast<float4*>(&sh.dqhat[c0]) = make_float4(dq[0], dq[1], dq[2], dq[3]);
    const float b = kGeneral && p.beta_probability ? in.beta : __fdividef(1.f, 1.f + __expf(-in.beta));
    __syncwarp();

    // Per row: (S·diag(decay)) k̂ and (S·diag(decay)) q̂ in eight independent
    // chains, one reduction over the row's four lanes.
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float skp[4] = {0.f, 0.f, 0.f, 0.f}, sqp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj) {
        const int c = 4 * (part + 4 * jj);
        const float4 vk = *reinterpret_cast<const float4*>(&sh.dkhat[c]);
        const float4 vq = *reinterpret_cast<const float4*>(&sh.dqhat[c]);
        const float* sg = &s[i][4 * jj];
        skp[0] = fmaf(sg[0], vk.x, skp[0]); skp[1] = fmaf(sg[1], vk.y, skp[1]);
        skp[2] = fmaf(sg[2], vk.z, skp[2]); skp[3] = fmaf(sg[3], vk.w, skp[3]);
        sqp[0] = fmaf(sg[0], vq.x, sqp[0]); sqp[1] = fmaf(sg[1], vq.y, sqp[1]);
        sqp[2] = fmaf(sg[2], vq.z, sqp[2]); sqp[3] = fmaf(sg[3], vq.w, sqp[3]);
      }
      float sk = (skp[0] + skp[1]) + (skp[2] + skp[3]), sq = (sqp[0] + sqp[1]) + (sqp[2] + sqp[3]);
      sk += __shfl_xor_sync(0xffffffffu, sk, 1);
      sq += __shfl_xor_sync(0xffffffffu, sq, 1);
      sk += __shfl_xor_sync(0xffffffffu, sk, 2);
      sq += __shfl_xor_sync(0xffffffffu, sq, 2);
      // S ← S·diag(decay) + b (v − S k̂) k̂ᵀ; o = scale · S q̂ = sq + coef · (k̂·q̂)
      const float coef = b * (in.v[i] - sk);
      if (part == 0) {
        const __nv_bfloat16 ob = __float2bfloat16_rn(fmaf(coef, kq, sq));
        p.out[vh * kDim + row + kDecodeRows * i] = *reinterpret_cast<const uint16_t*>(&ob);
      }
#pragma unroll
      for (int jj = 0; jj < kGroups; ++jj)
        decay_and_update4(&s[i][4 * jj], coef, sh.decay, sh.khat, 4 * (part + 4 * jj));
    }
    if (p.per_token_states != nullptr) store_rows(p.per_token_states, t * p.num_v_heads * int64_t{kDim} * kDim + head_off);
    if constexpr (kVerify) {
      if (token_slot >= 0 && token_slot < p.pool_size) {  // negative: none; past the pool: skipped, recorded
        store_rows(p.pool, token_slot * p.pool_stride + head_off);
      } else if (token_slot >= p.pool_size) {
        faults |= 1u << kFaultDecodeStateIndex;
      }
    }
    if (t + 1 < t1) __syncwarp();  // the next token rewrites this warp's vectors
  }

  if constexpr (!kVerify) store_rows(p.out_pool, slot * p.out_stride + head_off);
  report_decode_faults<kVerify>(p, tile, faults);
}

}  // namespace flashkda::sm90
