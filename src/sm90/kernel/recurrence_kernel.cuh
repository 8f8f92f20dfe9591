// Kernel 2, sequential: one CTA per (sequence, value head, V-slice) walks the
// sequence's chunks in order with its rows of the state in registers (fp32).
//   load      cp.async of chunk records and v, kStages deep (chunk_loader.cuh)
//   state     every warp: 16 rows of V, the recurrence step (recurrence.cuh)
//   epilogue  every warp stores its own 16x16 output tile (epilogue.cuh)
// One barrier per chunk: after it a stage is visible to all warps, and the stage
// refilled next was released by every warp before it.
#pragma once
#include "sm90/kernel/chunk_loader.cuh"
#include "sm90/kernel/epilogue.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/recurrence.cuh"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

// Chunk records in flight: the per-chunk step is a few hundred cycles, so three
// records ahead cover a DRAM round trip.
constexpr int kRecurrenceStages = 4;

template <int kStateWarps>
struct RecurrenceConfig {
  static constexpr int kThreads = 32 * kStateWarps;
  static constexpr int kVCta = 16 * kStateWarps;
  using Smem = RecurrenceSmem<kVCta, kRecurrenceStages, kStateWarps>;
};

// The state alone is 64 registers a thread; let the 1- and 2-warp-pair variants
// use more than 128 rather than spill (their occupancy is bounded by shared memory).
template <int kStateWarps>
__global__ void __launch_bounds__(RecurrenceConfig<kStateWarps>::kThreads, kStateWarps == 8 ? 2 : 1)
    kda_recurrence_kernel(const __grid_constant__ FwdParams p) {
  using Cfg = RecurrenceConfig<kStateWarps>;
  using Smem = typename Cfg::Smem;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  const SequenceTile w = get_sequence_tile(p);
  const int v0 = w.v_slice * Cfg::kVCta;
  const int64_t num_chunks = (w.length + kChunk - 1) / kChunk;

  auto issue_load = [&](int64_t c) {
    if (c < num_chunks) {
      auto& st = s.stage[c % kRecurrenceStages];
      load_record_async<Cfg::kThreads>(st.ops, chunk_record(p, w.first_slot + c, w.v_head), tid);
      const int64_t tok0 = w.token_begin + c * kChunk;
      const int64_t rem = w.length - c * kChunk;
      load_token_rows_async<Cfg::kVCta, Cfg::kThreads>(&st.v[0][0], Smem::kLdV, p.v, tok0,
                                                       static_cast<int>(rem < kChunk ? rem : kChunk), p.num_v_heads,
                                                       w.v_head, kHeadDim, v0, tid);
    }
    cute::cp_async_fence();  // one group per chunk, empty past the end: keeps the wait count uniform
  };

  StateRows S;
  load_state(S, p, w.seq, w.v_head, v0 + 16 * warp, lane);
  for (int c = 0; c < kRecurrenceStages - 1; ++c) issue_load(c);

  for (int64_t c = 0; c < num_chunks; ++c) {
    cute::cp_async_wait<kRecurrenceStages - 2>();
    __syncthreads();
    issue_load(c + kRecurrenceStages - 1);
    const auto& st = s.stage[c % kRecurrenceStages];
    recurrence_step(S, st.ops, &st.v[0][0], Smem::kLdV, 16 * warp, s.out[warp], lane);
    __syncwarp();
    const int64_t rem = w.length - c * kChunk;
    store_out_tile(s.out[warp], p, w.token_begin + c * kChunk, static_cast<int>(rem < kChunk ? rem : kChunk),
                   w.v_head, v0 + 16 * warp, lane);
    __syncwarp();
  }
  if (p.final_state_type != kStateNone) store_state(S, p, w.seq, w.v_head, v0 + 16 * warp, lane);
}

}  // namespace flashkda::sm90
