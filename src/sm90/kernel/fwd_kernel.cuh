// The fused KDA forward kernel: one CTA per (sequence, value head, V-slice) walks
// the sequence chunk by chunk. Per chunk:
//   load     cp.async of chunk c+1 into the other stage while chunk c is processed
//   prologue all 8 warps: norms, gates, decay prefix, decayed operands (prologue.cuh);
//            warp 0: L and its Neumann inverse, warp 1: Mqk; all: w (chunk_matrices.cuh)
//   state    warps 0..kStateWarps-1: the recurrence on the fp32 state in registers
//            (recurrence.cuh), 16 rows of V each
//   epilogue coalesced stores of the chunk's output rows (epilogue.cuh)
// See docs/design.md for the reasoning and docs/perf-log.md for what was measured.
#pragma once
#include "sm90/kernel/chunk_loader.cuh"
#include "sm90/kernel/chunk_matrices.cuh"
#include "sm90/kernel/epilogue.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/prologue.cuh"
#include "sm90/kernel/recurrence.cuh"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

// Two CTAs per SM: the second CTA's work fills the first one's barrier waits.
constexpr int kMinCtasPerSm = 2;

__device__ __forceinline__ int rows_in_chunk(int64_t remaining) {
  return static_cast<int>(remaining < kChunk ? remaining : kChunk);
}

template <int kStateWarps>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) kda_fwd_kernel(const __grid_constant__ FwdParams p) {
  constexpr int kVCta = 16 * kStateWarps;
  using Smem = SharedStorage<kVCta>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int d = tid % kHeadDim, half = tid / kHeadDim;  // prologue thread map
  const bool owns_state = warp < kStateWarps;

  const WorkTile w = get_work_tile(p);
  const int v0 = w.v_slice * kVCta;
  const int64_t num_chunks = (w.length + kChunk - 1) / kChunk;

  const float exp_a = expf(p.A_log[w.v_head]);
  const float dt_bias = p.dt_bias[static_cast<int64_t>(w.v_head) * kHeadDim + d];

  StateRows S;
  if (owns_state) load_state(S, p, w.seq, w.v_head, v0 + 16 * warp, lane);

  // beta of chunk c+1 is fetched into a register while chunk c runs.
  auto load_beta = [&](int64_t c) -> float {
    const int64_t row = c * kChunk + tid;
    if (tid < kChunk && row < w.length)
      return bf16_bits_to_float(p.beta[(w.token_begin + row) * p.num_v_heads + w.v_head]);
    return 0.f;
  };
  float beta_next = 0.f;
  if (num_chunks > 0) {
    load_chunk_async<kVCta>(s.stage[0], p, w.token_begin, rows_in_chunk(w.length),
                            w.qk_head, w.v_head, v0, tid);
    beta_next = load_beta(0);
  }

  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t tok0 = w.token_begin + c * kChunk;
    const int rows = rows_in_chunk(w.length - c * kChunk);
    const auto& st = s.stage[c & 1];
    if (c + 1 < num_chunks) {
      load_chunk_async<kVCta>(s.stage[(c + 1) & 1], p, tok0 + kChunk,
                              rows_in_chunk(w.length - (c + 1) * kChunk), w.qk_head,
                              w.v_head, v0, tid);
      cute::cp_async_wait<1>();
    } else {
      cute::cp_async_wait<0>();
    }
    if (tid < kChunk) s.beta_sig[tid] = sigmoid(beta_next);
    if (c + 1 < num_chunks) beta_next = load_beta(c + 1);
    __syncthreads();  // chunk c's inputs and beta are in shared memory

    row_norms(st, s.rnorm_q, s.rnorm_k, warp, lane);
    float G[kRowsPerThread];
    gate_prefix(st, exp_a, dt_bias, p.lower_bound_log2e, d, half, G, s.g_half);
    __syncthreads();
    finish_gate_prefix(G, d, half, rows, s.g_half, s.decay_last);
    __syncthreads();
    write_decayed_operands(s, st, G, p.scale, d, half);
    __syncthreads();
    if (warp == 0) build_inverse(s, lane);
    else if (warp == 1) build_mqk(s, lane);
    __syncthreads();
    build_w(s, warp, lane);
    __syncthreads();
    if (owns_state) recurrence_step(S, s, st, 16 * warp, lane);
    __syncthreads();
    store_out<kVCta>(s, p, tok0, rows, w.v_head, v0, tid);
  }

  if (owns_state && p.final_state_type != kStateNone) store_state(S, p, w.seq, w.v_head, v0 + 16 * warp, lane);
}

}  // namespace flashkda::sm90
