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
// Rows are independent, so a CTA owns kRows rows of one (sequence, head) and a
// thread one key column of them, against S_in broadcast from shared memory, in
// fp32 FMAs in a fixed order: M is a product of contractions and needs fp32,
// and the result is the same bits on every run (and in both forms below).
// The chain of segments is sequential, so a step's latency is what counts. Two
// forms of a step:
//   registers  (kda_segment_compose_kernel, kComposeRows = 4 rows a CTA): a
//              thread issues all K loads of its column of M_j at once, one L2
//              round trip a step. Small, many CTAs an SM: any grid.
//   staged     (kda_segment_compose_staged_kernel, kRows = 4..32): M_j and the
//              CTA's rows of B_j arrive in shared memory by bulk copies issued
//              two steps ahead, so a step waits on its stage's mbarrier, not on a
//              round trip to L2. With few (sequence,
//              head) pairs the register form is bound by L2 bandwidth (32 CTAs a
//              head each read all of M_j: 24 MB a step at 12 heads) or by its
//              load latency (one head); the staged form takes as many rows a CTA
//              as keep its grid within the SM count (staged_compose_rows,
//              sm90_forward.h): one CTA an SM at K = 128 (137-180 KB of shared
//              memory); K = 64's smaller stages may share an SM.
// K = kDim, the caller's head dim: with 64, pass 1 computed rows 0..63 of M and
// B only, and their columns past 63 are zero (shared_storage.cuh), so the
// products run over the first 64 rows and columns.
#pragma once
#include <cute/arch/copy_sm90_desc.hpp>

#include "sm90/fwd_launch.h"
#include "sm90/kernel/chunk_loader.cuh"
#include "sm90/kernel/grid_dependency.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/state_location.cuh"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

constexpr int kComposeRows = kHeadDim / static_cast<int>(kComposeCtasPerSeqHead);  // register form: rows of S a CTA
// kDim threads a CTA, one key column each; fwd_launch.h's kComposeCtasPerSeqHead
// is the register form's grid at K = 128.
template <int kDim, int kRows = kComposeRows>
constexpr int compose_ctas_per_head() {
  return kDim / kRows;
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

// One CTA's chain: rows row0 .. row0 + kRows − 1 of one (sequence, value head),
// of B (or S) or, in a summaries call, of M; the segments j_begin .. j_end − 1
// it composes.
struct ComposeChain {
  bool active;
  bool key_rows;    // rows of M: no B_j term
  bool write_back;  // S_in(j + 1) over b of segment j
  bool to_final;    // the last step's result is the final state
  int v_head, row0;
  int64_t seq, first_slot, j_begin, j_end;
};

// Grid: kDim / kRows CTAs per (sequence, value head) and per kind of rows; a
// summaries call has two kinds (B rows, then M rows), the others one. Fills
// s[r] with the chain's start at column col.
template <int kDim, int kRows>
__device__ __forceinline__ ComposeChain compose_chain(const FwdParams& p, int col, float (&s)[kRows]) {
  constexpr int kCtasPerHead = compose_ctas_per_head<kDim, kRows>();
  const int kinds = p.split_mode == kSplitSummaries ? 2 : 1;
  const int64_t idx = blockIdx.x;
  ComposeChain c{};
  c.row0 = static_cast<int>(idx % kCtasPerHead) * kRows;
  const int64_t rest = idx / kCtasPerHead;
  c.key_rows = rest % kinds == 1;
  const int64_t sh = rest / kinds;
  c.v_head = static_cast<int>(sh % p.num_v_heads);
  c.seq = sh / p.num_v_heads;
  const SegmentTile first = segment_of_sequence(p, c.seq, 0);
  c.first_slot = first.slot;
  c.active = true;
  c.j_begin = 1;  // a forward: S_in(1) .. S_in(G − 1)
  c.j_end = first.count - 1;
  if (p.split_mode == kSplitSummaries) {
    const SegmentState* st0 = segment_state(p, first.slot, c.v_head);
    const float* x0 = c.key_rows ? st0->m : st0->b;
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = x0[(c.row0 + r) * kHeadDim + col];
    c.j_end = first.count;
  } else if (p.split_mode == kSplitResume) {
    const StateLocation l = state_location<kDim>(p, static_cast<int>(c.seq), c.v_head);
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = initial_state_at<kDim>(l, c.row0 + r, col);
    c.j_begin = 0;
  } else {
    // One segment: pass 1 wrote its final state. Two without superposition:
    // S_in(1) is segment 0's own final state.
    if (first.count < (p.superpose ? 2 : 3)) {
      c.active = false;
      return c;
    }
    const float* b0 = segment_state(p, first.slot, c.v_head)->b;
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = b0[(c.row0 + r) * kHeadDim + col];
    if (p.superpose) c.j_end = first.count;
  }
  c.write_back = p.split_mode != kSplitSummaries;
  c.to_final = p.superpose != 0;
  return c;
}

// One 16-byte shared-memory load. As a float4 dereference, the compiler split
// S_in's loads into four scalar loads each from 16 rows a CTA on (4x the load
// instructions of the FMAs' operands). Volatile: it must not move across the
// step's barriers, nor merge with the same address in the next step.
__device__ __forceinline__ float4 load_shared_float4(const float* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

// x (B_j at column col, or 0 for rows of M) += s_in · M_j at column col; s_in
// [kRows][kHeadDim] in shared memory, m(k) = M_j[k][col] from registers (the
// loop fully unrolled: kKeyUnroll = kDim / 4) or shared memory. Four keys of M
// at a time go to registers first. kKeyUnroll: groups of four keys unrolled;
// fully unrolled at 16 rows the step was ~43 KB of instructions, and 40 % of
// the warps' stall samples were instruction fetches (ncu, 12/8192).
template <int kDim, int kKeyUnroll, int kRows, class MColumn>
__device__ __forceinline__ void compose_step(float (&x)[kRows], const float (*s_in)[kHeadDim], const MColumn& m) {
#pragma unroll kKeyUnroll
  for (int k = 0; k < kDim; k += 4) {
    const float m0 = m(k), m1 = m(k + 1), m2 = m(k + 2), m3 = m(k + 3);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 v = load_shared_float4(&s_in[r][k]);
      x[r] = fmaf(v.x, m0, x[r]);
      x[r] = fmaf(v.y, m1, x[r]);
      x[r] = fmaf(v.z, m2, x[r]);
      x[r] = fmaf(v.w, m3, x[r]);
    }
  }
}

// After step j: S_in(j + 1) over b of segment j, unless it is the final state.
__device__ __forceinline__ bool writes_back(const ComposeChain& c, int64_t j) {
  return c.write_back && !(c.to_final && j + 1 == c.j_end);
}
template <int kRows>
__device__ __forceinline__ void write_back_step(const FwdParams& p, const ComposeChain& c, int64_t j, int col,
                                                const float (&s)[kRows]) {
  if (writes_back(c, j)) {
    float* b = segment_state(p, c.first_slot + j, c.v_head)->b;
#pragma unroll
    for (int r = 0; r < kRows; ++r) b[(c.row0 + r) * kHeadDim + col] = s[r];
  }
}
// With outputs by superposition, after a CTA barrier that follows
// write_back_step: this CTA's rows of S_in(j + 1) are written, and the output
// kernel's CTAs of segment j + 1 may read them once every CTA has said so.
__device__ __forceinline__ void publish_step(const FwdParams& p, const ComposeChain& c, int64_t j) {
  if (p.superpose && writes_back(c, j) && threadIdx.x == 0) publish_composed(segment_state(p, c.first_slot + j, c.v_head));
}

// The chain's result: the final state (superposition) or the summaries call's X(G).
template <int kDim, int kRows>
__device__ __forceinline__ void finish_compose_chain(const FwdParams& p, const ComposeChain& c, int col,
                                                     const float (&s)[kRows]) {
  if (c.to_final) {
    const StateLocation l = state_location<kDim>(p, static_cast<int>(c.seq), c.v_head);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = l.offset + static_cast<int64_t>(c.row0 + r) * kDim + col;
      if (l.out_type == kStateFP32) static_cast<float*>(l.out)[i] = s[r];
      else if (l.out_type == kStateBF16) static_cast<__nv_bfloat16*>(l.out)[i] = __float2bfloat16_rn(s[r]);
    }
  }
  if (p.split_mode == kSplitSummaries) {
    float* out = (c.key_rows ? p.summaries_M : p.summaries_B) + (c.seq * p.num_v_heads + c.v_head) * kDim * kDim;
#pragma unroll
    for (int r = 0; r < kRows; ++r) out[(c.row0 + r) * kDim + col] = s[r];
  }
}

// The register form.
template <int kDim>
__global__ void __launch_bounds__(kDim)
    kda_segment_compose_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  __shared__ __align__(16) float s_in[kComposeRows][kHeadDim];
  allow_dependent_grids();  // the output kernel: it waits on SegmentState::composed
  const int col = threadIdx.x;
  float s[kComposeRows];
  const ComposeChain c = compose_chain<kDim, kComposeRows>(p, col, s);
  if (!c.active) return;
  for (int64_t j = c.j_begin; j < c.j_end; ++j) {
    const SegmentState* st = segment_state(p, c.first_slot + j, c.v_head);
    float m[kDim];  // column col of M_j: K loads in flight together
#pragma unroll
    for (int k = 0; k < kDim; ++k) m[k] = st->m[k * kHeadDim + col];
    __syncthreads();  // every thread is done reading the previous S_in
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s_in[r][col] = s[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r] = c.key_rows ? 0.f : st->b[(c.row0 + r) * kHeadDim + col];
    compose_step<kDim, kDim / 4>(s, s_in, [&](int k) { return m[k]; });
    write_back_step(p, c, j, col, s);
    if (p.superpose) {
      __syncthreads();
      publish_step(p, c, j);
    }
  }
  finish_compose_chain<kDim>(p, c, col, s);
}

// The staged form's key loop: 512 FMAs a thread an iteration at K = 128 (4 rows:
// the whole loop, as in the register form; at K = 64 and 4 rows the whole loop
// is 256), a body of ~11 KB that the instruction cache holds. Two groups at 4
// rows measured 13 % slower at H = 1, T = 1M.
template <int kRows>
constexpr int staged_key_unroll() {
  return 128 / kRows < kHeadDim / 4 ? 128 / kRows : kHeadDim / 4;
}

// The staged form's shared memory: two stages of (M_j's first kDim rows as
// stored, 128 columns; the CTA's rows of B_j), and S_in. 16-byte aligned: the
// bulk copies' destinations and S_in's float4 reads.
template <int kDim, int kRows>
struct alignas(16) ComposeStages {
  float m[2][kDim][kHeadDim];
  float b[2][kRows][kHeadDim];
  float s_in[kRows][kHeadDim];
  uint64_t full[2];  // the stage's copies have landed
};

template <int kDim, int kRows>
__global__ void __launch_bounds__(kDim, 1)
    kda_segment_compose_staged_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  using Stages = ComposeStages<kDim, kRows>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Stages& sm = *reinterpret_cast<Stages*>(smem_raw);
  allow_dependent_grids();  // the output kernel: it waits on SegmentState::composed
  const int col = threadIdx.x;
  float s[kRows];
  const ComposeChain c = compose_chain<kDim, kRows>(p, col, s);
  if (!c.active) return;
  // Rows of M need no B_j: one copy a stage, else two (each arrives on the barrier).
  init_stage_barriers(sm.full, c.key_rows ? 1 : 2);
  auto fetch = [&](int64_t j, int stage) {
    const SegmentState* st = segment_state(p, c.first_slot + j, c.v_head);
    bulk_copy<sizeof(sm.m[0])>(&sm.m[stage][0][0], st->m, sm.full[stage]);
    if (!c.key_rows) bulk_copy<sizeof(sm.b[0])>(&sm.b[stage][0][0], st->b + c.row0 * kHeadDim, sm.full[stage]);
  };
  if (col == 0) {
    for (int i = 0; i < 2 && c.j_begin + i < c.j_end; ++i) fetch(c.j_begin + i, i);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) sm.s_in[r][col] = s[r];
  __syncthreads();
  for (int64_t j = c.j_begin; j < c.j_end; ++j) {
    const int64_t i = j - c.j_begin;
    const int stage = static_cast<int>(i & 1);
    cute::wait_barrier(sm.full[stage], static_cast<int>((i >> 1) & 1));
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = c.key_rows ? 0.f : sm.b[stage][r][col];
    compose_step<kDim, staged_key_unroll<kRows>()>(s, sm.s_in, [&](int k) { return sm.m[stage][k][col]; });
    __syncthreads();  // the stage and S_in are read by every thread
    if (col == 0 && j + 2 < c.j_end) fetch(j + 2, stage);
#pragma unroll
    for (int r = 0; r < kRows; ++r) sm.s_in[r][col] = s[r];
    write_back_step(p, c, j, col, s);
    __syncthreads();
    publish_step(p, c, j);
  }
  finish_compose_chain<kDim>(p, c, col, s);
}

}  // namespace flashkda::sm90
