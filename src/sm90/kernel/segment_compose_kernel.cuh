// Kernel 3 of the segment scan (pass 2): the summaries of pass 1 composed along
// each (sequence, value head) in fp32. A forward (kSplitNone):
//   S_in(1)     = b of segment 0            (its final state, from pass 1)
//   S_in(j + 1) = S_in(j) · M_j + B_j       j = 1 .. G − 2, written over b of segment j
// Resuming a context-parallel forward (kSplitResume), from the initial state:
//   S_in(0)     = the sequence's initial state (zero without one)
//   S_in(j + 1) = S_in(j) · M_j + B_j       j = 0 .. G − 2, written over b of segment j
// With outputs by superposition (p.superpose) pass 1 summarised the last segment
// too, and the chain runs one step further, to the final state:
//   S_final     = S_in(G − 1) · M_{G−1} + B_{G−1}     into final_state / the pool slot
// A summaries call (kSplitSummaries), the whole sequence's (M, B), whose rows
// compose like rows of S: a row of B as S_in above, a row of M without the B_j term:
//   X(1)     = (M_0, B_0)                                     the first segment's
//   X(j + 1) = (X_M(j) · M_j,  X_B(j) · M_j + B_j)            j = 1 .. G − 1
// and X(G) into summaries_M / summaries_B.
// Rows are independent, so a CTA owns kComposeRows rows of one (sequence,
// head) and a thread one key column of them. The chain of segments is
// sequential, so a step's latency is what counts: a thread first issues all
// K loads of its column of M_j at once (one L2 round trip per step, not one
// per key), then runs K · kComposeRows FMAs against S_in broadcast from
// shared memory. fp32 FMAs in a fixed order: M is a product of contractions and
// needs fp32, and the result is the same bits on every run.
// K = kDim, the caller's head dim: with 64, pass 1 computed rows 0..63 of M and
// B only, and their columns past 63 are zero (shared_storage.cuh), so the
// products run over the first 64 rows and columns.
#pragma once
#include "sm90/fwd_launch.h"
#include "sm90/kernel/params.h"
#include "sm90/kernel/state_location.cuh"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

constexpr int kComposeRows = kHeadDim / static_cast<int>(kComposeCtasPerSeqHead);  // rows of S per CTA
// kDim threads a CTA, one key column each; fwd_launch.h's kComposeCtasPerSeqHead
// is the grid of K = 128.
template <int kDim>
constexpr int compose_ctas_per_head() {
  return kDim / kComposeRows;
}
static_assert(compose_ctas_per_head<kHeadDim>() == kComposeCtasPerSeqHead, "the CTAs of a head cover its rows");

// Element (row, col) of an initial state of kDim keys a row, as fp32 (0 without one).
template <int kDim>
__device__ __forceinline__ float initial_state_at(const StateLocation& l, int row, int col) {
  const int64_t i = l.offset + static_cast<int64_t>(row) * kDim + col;
  if (l.in_type == kStateFP32) return static_cast<const float*>(l.in)[i];
  if (l.in_type == kStateBF16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(l.in)[i]) << 16);
  return 0.f;
}

// Grid: kComposeCtasPerHead CTAs per (sequence, value head) and per kind of
// rows; a summaries call has two kinds (B rows, then M rows), the others one.
template <int kDim>
__global__ void __launch_bounds__(kDim)
    kda_segment_compose_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  constexpr int kCtasPerHead = compose_ctas_per_head<kDim>();
  __shared__ __align__(16) float s_in[kComposeRows][kDim];
  const int kinds = p.split_mode == kSplitSummaries ? 2 : 1;
  const int64_t idx = blockIdx.x;
  const int row0 = static_cast<int>(idx % kCtasPerHead) * kComposeRows;
  const int64_t rest = idx / kCtasPerHead;
  const bool key_rows = rest % kinds == 1;  // rows of M: no B_j term
  const int64_t sh = rest / kinds;
  const int v_head = static_cast<int>(sh % p.num_v_heads);
  const int64_t n = sh / p.num_v_heads;
  const SegmentTile first = segment_of_sequence(p, n, 0);
  const int col = threadIdx.x;

  // The chain: its start and the segments it composes.
  float s[kComposeRows];
  int64_t j_begin = 1, j_end = first.count - 1;  // a forward: S_in(1) .. S_in(G − 1)
  if (p.split_mode == kSplitSummaries) {
    const SegmentState* st0 = segment_state(p, first.slot, v_head);
    const float* x0 = key_rows ? st0->m : st0->b;
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r] = x0[(row0 + r) * kHeadDim + col];
    j_end = first.count;
  } else if (p.split_mode == kSplitResume) {
    const StateLocation l = state_location<kDim>(p, static_cast<int>(n), v_head);
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r] = initial_state_at<kDim>(l, row0 + r, col);
    j_begin = 0;
  } else {
    // One segment: pass 1 wrote its final state. Two without superposition:
    // S_in(1) is segment 0's own final state.
    if (first.count < (p.superpose ? 2 : 3)) return;
    const float* b0 = segment_state(p, first.slot, v_head)->b;
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r] = b0[(row0 + r) * kHeadDim + col];
    if (p.superpose) j_end = first.count;
  }
  const bool write_back = p.split_mode != kSplitSummaries;  // S_in(j + 1) over b of segment j
  const bool to_final = p.superpose != 0;                    // the last step's result is the final state

  for (int64_t j = j_begin; j < j_end; ++j) {
    SegmentState* st = segment_state(p, first.slot + j, v_head);
    float m[kDim];  // column col of M_j: K loads in flight together
#pragma unroll
    for (int k = 0; k < kDim; ++k) m[k] = st->m[k * kHeadDim + col];
    __syncthreads();  // every thread is done reading the previous S_in
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s_in[r][col] = s[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r] = key_rows ? 0.f : st->b[(row0 + r) * kHeadDim + col];
#pragma unroll
    for (int k = 0; k < kDim; k += 4) {
#pragma unroll
      for (int r = 0; r < kComposeRows; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(&s_in[r][k]);
        s[r] = fmaf(x.x, m[k], s[r]);
        s[r] = fmaf(x.y, m[k + 1], s[r]);
        s[r] = fmaf(x.z, m[k + 2], s[r]);
        s[r] = fmaf(x.w, m[k + 3], s[r]);
      }
    }
    if (write_back && !(to_final && j + 1 == j_end)) {
#pragma unroll
      for (int r = 0; r < kComposeRows; ++r) st->b[(row0 + r) * kHeadDim + col] = s[r];
    }
  }
  if (to_final) {
    const StateLocation l = state_location<kDim>(p, static_cast<int>(n), v_head);
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) {
      const int64_t i = l.offset + static_cast<int64_t>(row0 + r) * kDim + col;
      if (l.out_type == kStateFP32) static_cast<float*>(l.out)[i] = s[r];
      else if (l.out_type == kStateBF16) static_cast<__nv_bfloat16*>(l.out)[i] = __float2bfloat16_rn(s[r]);
    }
  }
  if (p.split_mode == kSplitSummaries) {
    float* out = (key_rows ? p.summaries_M : p.summaries_B) + (n * p.num_v_heads + v_head) * kDim * kDim;
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) out[(row0 + r) * kDim + col] = s[r];
  }
}

}  // namespace flashkda::sm90
