// Kernel 3 of the segment scan (pass 2): the summaries of pass 1 composed along
// each (sequence, value head) in fp32. A forward (kSplitNone):
//   S_in(1)     = b of segment 0            (its final state, from pass 1)
//   S_in(j + 1) = S_in(j) · M_j + B_j       j = 1 .. G − 2, written over b of segment j
// Resuming a context-parallel forward (kSplitResume), from the initial state:
//   S_in(0)     = the sequence's initial state (zero without one), copied for
//                 pass 3's segment 0 (resumed_initial_state)
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
// thread one key column of them (or a 4 x 4 tile: ComposeTiling), against S_in
// from shared memory, in fp32 FMAs in a fixed order: M is a product of
// contractions and needs fp32, and the result is the same bits on every run (and
// in both forms below).
// The chain of segments is sequential, so a step's latency is what counts. Two
// forms of a step:
//   registers  (kda_segment_compose_kernel, kComposeRows = 4 rows a CTA): a
//              thread issues all K loads of its column of M_j at once, one L2
//              round trip a step. Small, many CTAs an SM: any grid.
//   staged     (kda_segment_compose_staged_kernel, kRows = 4..32): M_j and the
//              CTA's rows of B_j arrive in shared memory by bulk copies issued
//              two steps ahead, so a step waits on its stage's mbarrier, not on a
//              round trip to L2. With few (sequence, head) pairs the register
//              form is bound by L2 bandwidth (32 CTAs a head each read all of
//              M_j: 24 MB a step at 12 heads) or by its load latency (one
//              head); the staged form takes as many rows a CTA
//              as keep its grid within the SM count (staged_compose_rows,
//              sm90_forward.h): one CTA an SM at K = 128 (137-180 KB of shared
//              memory); K = 64's smaller stages may share an SM. From 16 rows a
//              CTA a thread computes a 4 x 4 tile of them (ComposeTiling).
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
  int64_t pieces;    // segment slots between segments (segment_pieces)
  int64_t segments;  // the sequence's
};

// Grid: kDim / kRows CTAs per (sequence, value head) and per kind of rows; a
// summaries call has two kinds (B rows, then M rows), the others one. With the
// listed plan (FwdParams::seg_plan), per (listed cut sequence, value head): FwdParams::max_cut of them.
template <int kDim, int kRows>
__device__ __forceinline__ ComposeChain compose_chain(const FwdParams& p) {
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
  if (p.seg_plan != nullptr) {  // a listed plan: the sequences cut, listed
    if (c.seq >= p.seg_plan->cut) return c;
    c.seq = p.seg_cut[c.seq];
  }
  const SegmentTile first = segment_of_sequence(p, c.seq, 0, segment_pieces(p));
  c.first_slot = first.slot;
  c.pieces = first.pieces;
  c.segments = first.count;
  c.active = true;
  c.j_begin = 1;  // a forward: S_in(1) .. S_in(G − 1)
  c.j_end = first.count - 1;
  if (p.split_mode == kSplitSummaries) {
    c.j_end = first.count;
  } else if (p.split_mode == kSplitResume) {
    c.j_begin = 0;
  } else {
    // One segment: pass 1 wrote its final state. Two without superposition:
    // S_in(1) is segment 0's own final state.
    c.active = composed(first.count, p.superpose != 0);
    if (p.superpose) c.j_end = first.count;
  }
  c.write_back = p.split_mode != kSplitSummaries;
  c.to_final = p.superpose != 0;
  return c;
}

// Whether step j's result goes over b of segment j (not when it is the final state).
__device__ __forceinline__ bool writes_back(const ComposeChain& c, int64_t j) {
  return c.write_back && !(c.to_final && j + 1 == c.j_end);
}

// Element (i, q) of a thread's tile (rows row.., columns col..) of a caller's
// state at `l`: [V, K] rows, or [K, V] where key-major (a compile-time choice, so
// that a row's columns stay one contiguous run for the value-major loads).
template <int kDim, bool kKeyMajor>
__device__ __forceinline__ int64_t state_tile_element(const StateLocation& l, int row, int col, int i, int q) {
  return l.offset + (kKeyMajor ? static_cast<int64_t>(col + q) * kDim + row + i
                               : static_cast<int64_t>(row + i) * kDim + col + q);
}

// A thread's tile of a caller's state (0 without one); the element type chosen once.
template <int kDim, bool kKeyMajor, int kTR, int kTC>
__device__ __forceinline__ void load_state_tile(const StateLocation& l, int row, int col, float (&x)[kTR][kTC]) {
  if (l.in_type == kStateFP32) {
    const float* in = static_cast<const float*>(l.in);
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q) x[i][q] = in[state_tile_element<kDim, kKeyMajor>(l, row, col, i, q)];
  } else if (l.in_type == kStateBF16) {
    const uint16_t* in = static_cast<const uint16_t*>(l.in);
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q)
        x[i][q] = __uint_as_float(uint32_t(in[state_tile_element<kDim, kKeyMajor>(l, row, col, i, q)]) << 16);
  } else {
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q) x[i][q] = 0.f;
  }
}

// A thread's tile into a caller's state, in its dtype.
template <int kDim, bool kKeyMajor, int kTR, int kTC>
__device__ __forceinline__ void store_state_tile(const StateLocation& l, int row, int col,
                                                 const float (&x)[kTR][kTC]) {
  if (l.out_type == kStateFP32) {
    float* out = static_cast<float*>(l.out);
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q) out[state_tile_element<kDim, kKeyMajor>(l, row, col, i, q)] = x[i][q];
  } else if (l.out_type == kStateBF16) {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(l.out);
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q)
        out[state_tile_element<kDim, kKeyMajor>(l, row, col, i, q)] = __float2bfloat16_rn(x[i][q]);
  }
}

// A thread's tile (kTR rows from row, kTC columns from col) of the chain's
// start: a resumed forward's initial state (0 without one), a summaries call's
// X(1) (segment 0's M or B), or a forward's S_in(1) (segment 0's b). The source
// and its element type are chosen once, then the tile's loads go together:
// element by element, the 16 elements of a 4 x 4 tile were 16 blocks of ~100
// instructions with their own branches and loads.
template <int kDim, int kTR, int kTC>
__device__ __forceinline__ void load_tile_start(const FwdParams& p, const ComposeChain& c, int row, int col,
                                                float (&x)[kTR][kTC]) {
  if (p.split_mode == kSplitResume) {
    const StateLocation l = state_location<kDim>(p, static_cast<int>(c.seq), c.v_head);
    if (l.key_major) load_state_tile<kDim, true>(l, row, col, x);
    else load_state_tile<kDim, false>(l, row, col, x);
    // Pass 3's segment 0 starts from this copy, not from the caller's tensor.
    float* copy = resumed_initial_state(p, c.first_slot, c.segments, c.pieces, c.v_head) + row * kHeadDim + col;
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q) copy[i * kHeadDim + q] = x[i][q];
    return;
  }
  const SegmentState* st0 = segment_state(p, c.first_slot, c.v_head);
  const float* x0 = (p.split_mode == kSplitSummaries && c.key_rows ? st0->m : st0->b) + row * kHeadDim + col;
#pragma unroll
  for (int i = 0; i < kTR; ++i)
#pragma unroll
    for (int q = 0; q < kTC; ++q) x[i][q] = x0[i * kHeadDim + q];
}

// A thread's tile of the chain's result: the final state (superposition), in its
// dtype, or the summaries call's X(G); the destination and its type chosen once.
template <int kDim, int kTR, int kTC>
__device__ __forceinline__ void store_tile_result(const FwdParams& p, const ComposeChain& c, int row, int col,
                                                  const float (&x)[kTR][kTC]) {
  if (c.to_final) {
    const StateLocation l = state_location<kDim>(p, static_cast<int>(c.seq), c.v_head);
    if (l.key_major) store_state_tile<kDim, true>(l, row, col, x);
    else store_state_tile<kDim, false>(l, row, col, x);
  }
  if (p.split_mode == kSplitSummaries) {
    float* out = (c.key_rows ? p.summaries_M : p.summaries_B) + (c.seq * p.num_v_heads + c.v_head) * kDim * kDim +
                 row * kDim + col;
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q) out[i * kDim + q] = x[i][q];
  }
}

// The register form: 4 rows a CTA, a thread one key column of them, its column
// of M_j in registers, S_in broadcast from shared memory.
template <int kDim>
__global__ void __launch_bounds__(kDim)
    kda_segment_compose_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  __shared__ __align__(16) float s_in[kComposeRows][kHeadDim];
  const int col = threadIdx.x;
  const ComposeChain c = compose_chain<kDim, kComposeRows>(p);
  if (!c.active) {
    leave_early(p.seg_plan != nullptr);
    return;
  }
  wait_for_launch_before(p.seg_plan != nullptr);
  float s[kComposeRows][1];  // the thread's rows of its column
  load_tile_start<kDim>(p, c, c.row0, col, s);
  for (int64_t j = c.j_begin; j < c.j_end; ++j) {
    SegmentState* st = segment_state(p, c.first_slot + j * c.pieces, c.v_head);
    float m[kDim];  // column col of M_j: K loads in flight together
#pragma unroll
    for (int k = 0; k < kDim; ++k) m[k] = st->m[k * kHeadDim + col];
    __syncthreads();  // every thread is done reading the previous S_in
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s_in[r][col] = s[r][0];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) s[r][0] = c.key_rows ? 0.f : st->b[(c.row0 + r) * kHeadDim + col];
#pragma unroll
    for (int k = 0; k < kDim; k += 4) {
#pragma unroll
      for (int r = 0; r < kComposeRows; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(&s_in[r][k]);
        s[r][0] = fmaf(x.x, m[k], s[r][0]);
        s[r][0] = fmaf(x.y, m[k + 1], s[r][0]);
        s[r][0] = fmaf(x.z, m[k + 2], s[r][0]);
        s[r][0] = fmaf(x.w, m[k + 3], s[r][0]);
      }
    }
    if (writes_back(c, j)) {
#pragma unroll
      for (int r = 0; r < kComposeRows; ++r) st->b[(c.row0 + r) * kHeadDim + col] = s[r][0];
    }
  }
  store_tile_result<kDim>(p, c, c.row0, col, s);
}

// One 16-byte shared-memory load. As float4 dereferences in a long unrolled
// loop, the compiler split them into four scalar loads each (4x the load
// instructions). Volatile: it must not move across the step's barriers, nor
// merge with the same address in the next step.
__device__ __forceinline__ float4 load_shared_float4(const float* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

// The staged form's thread tiles: kTileRows x kTileCols elements of the CTA's
// kRows x kDim a thread. A column of 4 or 8 rows (a key column a thread, as in
// the register form) where the CTA has few rows; 4 x 4 from 16 rows on, where a
// column a thread was bound by its shared-memory loads (one 16-byte S_in load
// per four FMAs; a 4 x 4 tile: two per sixteen). Lanes of a warp take 32
// consecutive columns (a column a thread) or 4 row groups x 8 column groups
// (4 x 4 tiles), so that each load of a key's S_in rows and M_j columns is one
// shared-memory wavefront.
template <int kDim, int kRows>
struct ComposeTiling {
  static constexpr int kTileRows = kRows >= 16 ? 4 : kRows;
  static constexpr int kTileCols = kRows >= 16 ? 4 : 1;
  static constexpr int kRowGroups = kRows / kTileRows, kColGroups = kDim / kTileCols;
  static constexpr int kThreads = kRowGroups * kColGroups;
  static constexpr int kLanesR = kTileCols > 1 ? 4 : 1, kLanesC = 32 / kLanesR;
  static_assert(kRowGroups % kLanesR == 0 && kColGroups % kLanesC == 0, "warps tile the CTA's rows and columns");
  // The key loop: ~512 FMAs a thread an iteration, a body the instruction cache
  // holds (fully unrolled at 16 rows a column a thread, ~43 KB of instructions
  // put 40 % of the stall samples on instruction fetch: ncu, 12/8192).
  static constexpr int kKeyUnroll = 512 / (kTileRows * kTileCols) < kDim ? 512 / (kTileRows * kTileCols) : kDim;
};

// The staged form's shared memory: two stages of (M_j's first kDim rows as
// stored, 128 columns; the CTA's rows of B_j), and S_in transposed ([key][row]:
// a key's rows side by side for the tiles' 16-byte loads). 16-byte aligned: the
// bulk copies' destinations and the 16-byte loads.
template <int kDim, int kRows>
struct alignas(16) ComposeStages {
  float m[2][kDim][kHeadDim];
  float b[2][kRows][kHeadDim];
  float s_in_t[kDim][kRows];
  uint64_t full[2];  // the stage's copies have landed
};

template <int kDim, int kRows>
__global__ void __launch_bounds__(ComposeTiling<kDim, kRows>::kThreads, 1)
    kda_segment_compose_staged_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  using Tiling = ComposeTiling<kDim, kRows>;
  constexpr int kTR = Tiling::kTileRows, kTC = Tiling::kTileCols;
  using Stages = ComposeStages<kDim, kRows>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Stages& sm = *reinterpret_cast<Stages*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  constexpr int kColBlocks = Tiling::kColGroups / Tiling::kLanesC;
  const int r0 = kTR * ((warp / kColBlocks) * Tiling::kLanesR + lane / Tiling::kLanesC);  // of the CTA's rows
  const int c0 = kTC * ((warp % kColBlocks) * Tiling::kLanesC + lane % Tiling::kLanesC);
  const ComposeChain c = compose_chain<kDim, kRows>(p);
  if (!c.active) {
    leave_early(p.seg_plan != nullptr);
    return;
  }
  wait_for_launch_before(p.seg_plan != nullptr);
  // Rows of M need no B_j: one copy a stage, else two (each arrives on the barrier).
  init_stage_barriers(sm.full, c.key_rows ? 1 : 2);
  auto fetch = [&](int64_t j, int stage) {
    const SegmentState* st = segment_state(p, c.first_slot + j * c.pieces, c.v_head);
    bulk_copy<sizeof(sm.m[0])>(&sm.m[stage][0][0], st->m, sm.full[stage]);
    if (!c.key_rows) bulk_copy<sizeof(sm.b[0])>(&sm.b[stage][0][0], st->b + c.row0 * kHeadDim, sm.full[stage]);
  };
  if (tid == 0) {
    for (int i = 0; i < 2 && c.j_begin + i < c.j_end; ++i) fetch(c.j_begin + i, i);
  }
  float x[kTR][kTC];
  load_tile_start<kDim>(p, c, c.row0 + r0, c0, x);
  auto share_tile = [&] {  // x into S_in (transposed)
#pragma unroll
    for (int q = 0; q < kTC; ++q)
#pragma unroll
      for (int i = 0; i < kTR; i += 4)
        *reinterpret_cast<float4*>(&sm.s_in_t[c0 + q][r0 + i]) =
            make_float4(x[i][q], x[i + 1][q], x[i + 2][q], x[i + 3][q]);
  };
  share_tile();
  __syncthreads();
  for (int64_t j = c.j_begin; j < c.j_end; ++j) {
    const int64_t n = j - c.j_begin;
    const int stage = static_cast<int>(n & 1);
    cute::wait_barrier(sm.full[stage], static_cast<int>((n >> 1) & 1));
#pragma unroll
    for (int i = 0; i < kTR; ++i)
#pragma unroll
      for (int q = 0; q < kTC; ++q) x[i][q] = c.key_rows ? 0.f : sm.b[stage][r0 + i][c0 + q];
    // Every element's FMAs in ascending key order, as in the register form.
#pragma unroll Tiling::kKeyUnroll
    for (int k = 0; k < kDim; ++k) {
      float sv[kTR], mv[kTC];
#pragma unroll
      for (int i = 0; i < kTR; i += 4) {
        const float4 v = load_shared_float4(&sm.s_in_t[k][r0 + i]);
        sv[i] = v.x, sv[i + 1] = v.y, sv[i + 2] = v.z, sv[i + 3] = v.w;
      }
      static_assert(kTC == 4 || kTC == 1, "a key's M_j columns as one load");
      if constexpr (kTC == 4) {
        const float4 v = load_shared_float4(&sm.m[stage][k][c0]);
        mv[0] = v.x, mv[1] = v.y, mv[2] = v.z, mv[3] = v.w;
      } else {
        mv[0] = sm.m[stage][k][c0];
      }
#pragma unroll
      for (int i = 0; i < kTR; ++i)
#pragma unroll
        for (int q = 0; q < kTC; ++q) x[i][q] = fmaf(sv[i], mv[q], x[i][q]);
    }
    __syncthreads();  // the stage and S_in are read by every thread
    if (tid == 0 && j + 2 < c.j_end) fetch(j + 2, stage);
    share_tile();
    if (writes_back(c, j)) {
      float* b = segment_state(p, c.first_slot + j * c.pieces, c.v_head)->b + (c.row0 + r0) * kHeadDim + c0;
#pragma unroll
      for (int i = 0; i < kTR; ++i) {
        if constexpr (kTC == 4) *reinterpret_cast<float4*>(b + i * kHeadDim) = make_float4(x[i][0], x[i][1], x[i][2], x[i][3]);
        else b[i * kHeadDim] = x[i][0];
      }
    }
    __syncthreads();
  }
  store_tile_result<kDim>(p, c, c.row0 + r0, c0, x);
}

}  // namespace flashkda::sm90
