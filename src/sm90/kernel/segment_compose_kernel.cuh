// Kernel 3 of the segment scan (pass 2): the true incoming state of every
// segment, composed along each (sequence, value head) in fp32:
//   S_in(1)     = b of segment 0            (its final state, from pass 1)
//   S_in(j + 1) = S_in(j) · M_j + B_j       j = 1 .. G − 2, written over b of segment j
// Rows of S are independent, so a CTA owns kComposeRows rows of one (sequence,
// head) and a thread one key column of them. The chain of segments is
// sequential, so a step's latency is what counts: a thread first issues all
// 128 loads of its column of M_j at once (one L2 round trip per step, not one
// per key), then runs 128 · kComposeRows FMAs against S_in broadcast from
// shared memory. fp32 FMAs in a fixed order: M is a product of contractions and
// needs fp32, and the result is the same bits on every run.
#pragma once
#include "sm90/fwd_launch.h"
#include "sm90/kernel/params.h"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

constexpr int kComposeThreads = kHeadDim;  // one key column each
constexpr int kComposeCtasPerHead = static_cast<int>(kComposeCtasPerSeqHead);  // fwd_launch.h sizes the grid
constexpr int kComposeRows = kHeadDim / kComposeCtasPerHead;                  // rows of S per CTA
static_assert(kComposeRows * kComposeCtasPerHead == kHeadDim, "the CTAs of a head cover its rows");

__global__ void __launch_bounds__(kComposeThreads) kda_segment_compose_kernel(const __grid_constant__ FwdParams p) {
  __shared__ __align__(16) float s_in[kComposeRows][kHeadDim];
  const int64_t idx = blockIdx.x;
  const int row0 = static_cast<int>(idx % kComposeCtasPerHead) * kComposeRows;
  const int64_t sh = idx / kComposeCtasPerHead;
  const int v_head = static_cast<int>(sh % p.num_v_heads);
  const int64_t n = sh / p.num_v_heads;
  const SegmentTile first = segment_of_sequence(p, n, 0);
  if (first.count < 3) return;  // S_in(1) is segment 0's own final state
  const int col = threadIdx.x;

  float s[kComposeRows];
  const float* b0 = segment_state(p, first.slot, v_head)->b;
#pragma unroll
  for (int r = 0; r < kComposeRows; ++r) s[r] = b0[(row0 + r) * kHeadDim + col];
  for (int64_t j = 1; j + 1 < first.count; ++j) {
    SegmentState* st = segment_state(p, first.slot + j, v_head);
    float m[kHeadDim];  // column col of M_j: 128 loads in flight together
#pragma unroll
    for (int k = 0; k < kHeadDim; ++k) m[k] = st->m[k * kHeadDim + col];
    __syncthreads();  // every thread is done reading the previous S_in
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s_in[r][col] = s[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r] = st->b[(row0 + r) * kHeadDim + col];
#pragma unroll
    for (int k = 0; k < kHeadDim; k += 4) {
#pragma unroll
      for (int r = 0; r < kComposeRows; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(&s_in[r][k]);
        s[r] = fmaf(x.x, m[k], s[r]);
        s[r] = fmaf(x.y, m[k + 1], s[r]);
        s[r] = fmaf(x.z, m[k + 2], s[r]);
        s[r] = fmaf(x.w, m[k + 3], s[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) st->b[(row0 + r) * kHeadDim + col] = s[r];
  }
}

}  // namespace flashkda::sm90
