// Kernel 4 of the segment scan with outputs by superposition (segment_outputs.cuh):
//   out_t = o⁰_t + S_in · P_t
// for every token of every segment, token-parallel: the chain of chunk steps ran
// once, in pass 1. One CTA takes p.output_chunks chunks of one (segment
// piece, value head) (a segment is one piece unless the device chose it:
// tile_scheduler.cuh); warp w owns V rows 16w..16w+15 (kDim / 16 warps):
//   S_in     rows 16w.. of the segment's incoming state (pass 2 left it in the
//            previous segment's b, fp32), split once into bf16 hi + lo A fragments
//   load     each chunk's ChunkOutputs (o⁰ in accumulator order, P swizzled for
//            wgmma) by one bulk copy, kOutputStages chunks in flight
//   product  each warpgroup's accumulators (64 V rows x 16 tokens) start as o⁰ᵀ;
//            += S_in·P as wgmma, S_in from registers (hi + lo) and P from shared
//            memory (one bf16: segment_outputs.cuh). As mma.sync the products
//            bound the kernel (docs/perf-log.md).
//   store    bf16 through the staging tile, as the recurrence stores out (epilogue.cuh),
//            a chunk late: chunk c's tile leaves while chunk c + 1's products run
//            (the kernel waits on latency, not bandwidth: 1/1M 366 -> 357 µs)
// Segment 0 ran from the true initial state in pass 1: its o⁰ is its output (a
// listed plan, FwdParams::seg_plan, wrote its out directly instead).
#pragma once
#include "sm90/kernel/chunk_loader.cuh"
#include "sm90/kernel/epilogue.cuh"
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/grid_dependency.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/recurrence.cuh"
#include "sm90/kernel/segment_outputs.cuh"
#include "sm90/kernel/tile_scheduler.cuh"
#include "sm90/kernel/wgmma.cuh"

namespace flashkda::sm90 {

// Two chunks ahead cover a DRAM round trip at ~0.5 µs a chunk; three leave slack
// and keep the CTA within a third of an SM's shared memory at K = 128.
constexpr int kOutputStages = 3;

template <int kDim>
struct SegmentOutputSmem {
  ChunkOutputs<kDim> stage[kOutputStages];  // 1024-byte aligned (swizzle atoms)
  alignas(16) __nv_bfloat16 out[kDim / 16][kChunk][kLdT];  // [warp][token][v]
  uint64_t full[kOutputStages];
};

template <int kDim>
constexpr int segment_output_threads() {
  return 32 * (kDim / 16);
}
// The dynamic allocation is only promised 16-byte alignment: one atom of slack.
template <int kDim>
constexpr size_t segment_output_smem_bytes() {
  return sizeof(SegmentOutputSmem<kDim>) + kSw128AtomBytes;
}

template <int kDim>
__global__ void __launch_bounds__(segment_output_threads<kDim>(), 2)
    kda_segment_output_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  constexpr int kKeySteps = kDim / 16;
  using Smem = SegmentOutputSmem<kDim>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + ((kSw128AtomBytes - raw_addr % kSw128AtomBytes) % kSw128AtomBytes));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // blockIdx.x = (i · HV + hv) · output_parts + part, i a segment slot or, with
  // a listed plan (below), a piece of a segment of its list: the part's chunks
  // of that piece of its segment.
  const int64_t idx = blockIdx.x;
  const int64_t part = idx % p.output_parts;
  const int64_t sh = idx / p.output_parts;
  const int v_head = static_cast<int>(sh % p.num_v_heads);
  // A listed plan: this launch runs beside the composition
  // (grid_dependency.cuh), `pieces` entries i for each listed segment past the
  // first (the segment 0s wrote their out in their own launch,
  // kPassFirstSegments); a last segment's entries past its end find no chunks.
  const bool beside = p.seg_plan != nullptr;
  const int64_t i = sh / p.num_v_heads;
  SegmentTile t;
  int64_t piece = 0;  // which of the segment's pieces (a listed plan's entries)
  if (beside) {
    const int64_t pieces = p.seg_plan->pieces;
    if (pieces == kWholeSequences || i >= static_cast<int64_t>(p.seg_plan->segments) * pieces) {
      leave_early(beside);
      return;
    }
    const SegmentRef ref = p.seg_list[i / pieces];
    t = segment_of_sequence(p, ref.seq, ref.index, pieces);
    piece = i % pieces;
  } else {
    t = locate_segment(p, i);
  }
  const int64_t chunks = (t.length + kChunk - 1) / kChunk;
  const int64_t piece_begin = piece * p.seg_chunks;
  const int64_t piece_end = piece_begin + p.seg_chunks < chunks ? piece_begin + p.seg_chunks : chunks;
  const int64_t c0 = piece_begin + part * p.output_chunks;
  if (!t.valid || c0 >= piece_end) {
    leave_early(beside);
    return;
  }
  wait_for_launch_before(beside);
  const int64_t c1 = c0 + p.output_chunks < piece_end ? c0 + p.output_chunks : piece_end;
  const ChunkOutputs<kDim>* const first = chunk_outputs<kDim>(p, t.first_slot, v_head);

  init_stage_barriers(s.full, 1);
  auto issue = [&](int64_t c, int stage) {
    if (tid == 0 && c < c1)
      bulk_copy<sizeof(ChunkOutputs<kDim>)>(&s.stage[stage], first + c * p.num_v_heads, s.full[stage]);
  };
#pragma unroll
  for (int st = 0; st < kOutputStages; ++st) issue(c0 + st, st);

  // The warp's rows of S_in as A fragments (keys 16kk..16kk+15), while the first copies fly.
  const bool from_state = t.index > 0;
  FragA s_hi[kKeySteps], s_lo[kKeySteps];
  if (from_state) {
    StateRows S_in;  // dies once split
    load_state_rows<kDim>(S_in, StateFrom::kBuffer, segment_state(p, t.slot - t.pieces, v_head)->b, 16 * warp, lane);
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) split_a_bf16(S_in.tile[2 * kk], S_in.tile[2 * kk + 1], s_hi[kk], s_lo[kk]);
  }

  const OutCursor<kDim> out(p, t.token_begin, v_head, 16 * warp, lane);
  auto store_out = [&](int64_t c) {
    const int64_t rem = t.length - c * kChunk;
    out.store(p, s.out[warp], c, static_cast<int>(rem < kChunk ? rem : kChunk));
  };
  int stage = 0, phase = 0;
  for (int64_t c = c0; c < c1; ++c) {
    cute::wait_barrier(s.full[stage], phase);
    const ChunkOutputs<kDim>& x = s.stage[stage];
    FragC acc[2];
    {
      const float4 a = *reinterpret_cast<const float4*>(&x.out0[warp][lane][0]);
      const float4 b = *reinterpret_cast<const float4*>(&x.out0[warp][lane][4]);
      acc[0] = {{a.x, a.y, a.z, a.w}};
      acc[1] = {{b.x, b.y, b.z, b.w}};
    }
    if (from_state) {
      // K-major B (resp_offset): 8-token groups kGroupBytes apart; key step kk
      // starts (kk / 4) atoms and (kk % 4) · 32 bytes further (wgmma.cuh).
      constexpr uint32_t kGroupBytes = ChunkOutputs<kDim>::kGroupBytes;
      const uint64_t resp = sw128_descriptor(x.resp, 16, kGroupBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
        const uint32_t step = (kk / 4) * kSw128AtomBytes + (kk % 4) * 32;
        wgmma_m64n16k16(acc, s_hi[kk], sw128_descriptor_advance(resp, step));
        wgmma_m64n16k16(acc, s_lo[kk], sw128_descriptor_advance(resp, step));
      }
      wgmma_commit();
      // The previous chunk's out tile goes out while this chunk's products run.
      if (c > c0) store_out(c - 1);
      wgmma_wait_all();
      fence_accumulators(acc);
    } else if (c > c0) {
      store_out(c - 1);
    }
    __syncwarp();  // the staging tile's reads above, before it is rewritten
    stage_out_tile(acc, s.out[warp], lane);
    __syncthreads();  // every warp is done with the stage before it is reused (and its tile is staged)
    issue(c + kOutputStages, stage);
    if (stage + 1 == kOutputStages) phase ^= 1;
    stage = stage + 1 == kOutputStages ? 0 : stage + 1;
  }
  store_out(c1 - 1);
}

}  // namespace flashkda::sm90
