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
// in both forms below). The order (ComposeQuarters): an element's K products in
// four quarters of the keys, each a chain of FMAs in ascending key order (the
// first starting from B_j, the others from 0), then the quarters added left to
// right. The register form runs the four chains in one thread; the staged form
// in one thread too from 16 rows a CTA on, and below that on four (or two)
// groups of warps whose sums meet in shared memory.
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
//              sm90_forward.h): one CTA an SM (140-192 KB of shared memory at
//              K = 128). A warp computes 4 rows, a lane a 4 x (K / 32) tile of
//              them (ComposeTiling).
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

// The key quarters of a step's sums (the order above). Every form adds them the
// same way, so the forms agree bit for bit whatever their split over threads.
struct ComposeQuarters {
  static constexpr int kCount = 4;
  template <int kDim>
  static constexpr int keys() {
    return kDim / kCount;
  }
  // One addition of ((q0 + q1) + q2) + q3, never contracted into an FMA.
  __device__ static __forceinline__ float add(float x, float quarter) { return __fadd_rn(x, quarter); }
};

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
  constexpr int kQuarters = ComposeQuarters::kCount, kQuarterKeys = ComposeQuarters::keys<kDim>();
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
    float q[kQuarters][kComposeRows];  // each row's four chains (ComposeQuarters)
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) {
      q[0][r] = c.key_rows ? 0.f : st->b[(c.row0 + r) * kHeadDim + col];
#pragma unroll
      for (int h = 1; h < kQuarters; ++h) q[h][r] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < kDim; k += 4) {
      const int h = k / kQuarterKeys;  // a constant once unrolled
#pragma unroll
      for (int r = 0; r < kComposeRows; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(&s_in[r][k]);
        q[h][r] = fmaf(x.x, m[k], q[h][r]);
        q[h][r] = fmaf(x.y, m[k + 1], q[h][r]);
        q[h][r] = fmaf(x.z, m[k + 2], q[h][r]);
        q[h][r] = fmaf(x.w, m[k + 3], q[h][r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kComposeRows; ++r) {
      s[r][0] = q[0][r];
#pragma unroll
      for (int h = 1; h < kQuarters; ++h) s[r][0] = ComposeQuarters::add(s[r][0], q[h][r]);
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

// The staged form's work split. A step is bound by its shared-memory loads, not
// by the latency of its FMA chains: four groups of warps over the key quarters
// of the earlier 4 x 4 thread tiles left issue active at 41-48 % and the step no
// faster (docs/perf-log.md). So a warp takes 4 rows and all of their columns, a
// lane a 4 x (kDim / 32) tile: a key's 4 rows of S_in are one 16-byte load that
// every lane shares, its M_j columns one 16-byte load contiguous across the lanes
// (ncu of the composition: 1/1M 70.4 -> 54.7 us, 12/8192 16.3 -> 15.7 us).
// The CTA's kRows / 4 row warps run the four key quarters (ComposeQuarters)
// themselves from 16 rows on; with 4 or 8 rows the CTA runs 4 / (kRows / 4)
// groups of them, group g running quarters g·kQuartersEach .., so that every SM
// sub-partition has a warp. Those groups put their quarters in shared memory,
// and each then adds up, shares and writes back kOwnRows of the tile's rows:
// with group 0 doing all of that after the barrier, its serial tail was most
// of the remaining step at one head. A lane's columns are runs of kColRun (one
// load of at most 16 bytes), the runs of a warp's lanes side by side.
template <int kDim, int kRows>
struct ComposeTiling {
  static constexpr int kTileRows = 4, kLanesC = 32;
  static constexpr int kTileCols = kDim / kLanesC;
  static constexpr int kRowWarps = kRows / kTileRows;
  static constexpr int kColRun = kTileCols < 4 ? kTileCols : 4, kRuns = kTileCols / kColRun;
  static constexpr int kRunStride = kColRun * kLanesC;  // columns between a lane's runs
  static_assert(kRowWarps * kTileRows == kRows && kRuns * kColRun == kTileCols, "tiles cover the rows and columns");
  static constexpr int kGroups = kRowWarps >= 4 ? 1 : 4 / kRowWarps;
  static constexpr int kQuartersEach = ComposeQuarters::kCount / kGroups;
  static_assert(kGroups * kQuartersEach == ComposeQuarters::kCount, "groups cover the quarters");
  static constexpr int kTileThreads = 32 * kRowWarps;  // one group: every tile once
  static constexpr int kThreads = kTileThreads * kGroups;
  // The tile rows each group adds up and writes (all of them with one group).
  static constexpr int kOwnRows = kTileRows / kGroups;
  static_assert(kOwnRows * kGroups == kTileRows, "groups cover the tile's rows");
  static constexpr bool kShared = kGroups > 1;  // the quarters meet in shared memory
  static constexpr int kQuarterKeys = ComposeQuarters::keys<kDim>();
  // The key loop unrolled to ~512 FMAs a thread, a body the instruction cache
  // holds (fully unrolled at 16 rows a column a thread, ~43 KB of instructions
  // put 40 % of the stall samples on instruction fetch: ncu, 12/8192).
  static constexpr int kKeyUnroll =
      512 / (kTileRows * kTileCols) < kQuarterKeys ? 512 / (kTileRows * kTileCols) : kQuarterKeys;
};

// The staged form's shared memory: two stages of (M_j's first kDim rows as
// stored, 128 columns; the CTA's rows of B_j); S_in by rows (a row's 4 keys are
// one 16-byte load that every lane of a warp shares, and a lane stores its tile
// as one run a row: stored transposed, a lane's columns would put every lane's
// 16-byte store in the same banks); and, with several groups, every quarter of
// every tile ([quarter][run][tile row][tile thread]: a warp's runs side by
// side). 16-byte aligned: the bulk copies' destinations and the 16-byte loads.
template <int kDim, int kRows>
struct alignas(16) ComposeStages {
  using Tiling = ComposeTiling<kDim, kRows>;
  static constexpr bool kShared = Tiling::kShared;
  float m[2][kDim][kHeadDim];
  float b[2][kRows][kHeadDim];
  float s_in[kRows][kDim];
  float quarters[kShared ? ComposeQuarters::kCount : 1][kShared ? Tiling::kRuns : 1]
                [kShared ? Tiling::kTileRows : 1][kShared ? Tiling::kTileThreads : 1][Tiling::kColRun];
  uint64_t full[2];  // the stage's copies have landed
};

// kColRun floats of shared memory as one load or store (16, 8 or 4 bytes).
template <int kN>
__device__ __forceinline__ void load_shared_run(const float* p, float (&v)[kN]) {
  if constexpr (kN == 4) {
    const float4 x = load_shared_float4(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else if constexpr (kN == 2) {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x, v[1] = x.y;
  } else {
    static_assert(kN == 1, "runs of 1, 2 or 4 columns");
    v[0] = *p;
  }
}

template <int kN>
__device__ __forceinline__ void store_shared_run(float* p, const float (&v)[kN]) {
  if constexpr (kN == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (kN == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
    static_assert(kN == 1, "runs of 1, 2 or 4 columns");
    *p = v[0];
  }
}

template <int kDim, int kRows>
__global__ void __launch_bounds__(ComposeTiling<kDim, kRows>::kThreads, 1)
    kda_segment_compose_staged_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  using Tiling = ComposeTiling<kDim, kRows>;
  constexpr int kTR = Tiling::kTileRows, kRun = Tiling::kColRun, kRuns = Tiling::kRuns;
  constexpr int kEach = Tiling::kQuartersEach, kOwn = Tiling::kOwnRows;
  constexpr bool kShared = Tiling::kShared;
  using Stages = ComposeStages<kDim, kRows>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Stages& sm = *reinterpret_cast<Stages*>(smem_raw);
  const int group = kShared ? static_cast<int>(threadIdx.x) / Tiling::kTileThreads : 0;  // 0: i0 a constant
  const int tid = threadIdx.x % Tiling::kTileThreads, warp = tid / 32, lane = tid % 32;
  const int r0 = kTR * warp;   // of the CTA's rows
  const int c0 = kRun * lane;  // the first run's first column
  auto run_col = [&](int u) { return c0 + u * Tiling::kRunStride; };
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
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2 && c.j_begin + i < c.j_end; ++i) fetch(c.j_begin + i, i);
  }
  // The group's rows of the tile: rows r0 + i0 .. r0 + i0 + kOwn − 1 of the CTA's.
  const int i0 = kOwn * group;
  float x[kRuns][kOwn][kRun];
  auto share_rows = [&] {  // x into S_in
#pragma unroll
    for (int u = 0; u < kRuns; ++u)
#pragma unroll
      for (int i = 0; i < kOwn; ++i) store_shared_run(&sm.s_in[r0 + i0 + i][run_col(u)], x[u][i]);
  };
#pragma unroll
  for (int u = 0; u < kRuns; ++u) load_tile_start<kDim>(p, c, c.row0 + r0 + i0, run_col(u), x[u]);
  share_rows();
  __syncthreads();
  for (int64_t j = c.j_begin; j < c.j_end; ++j) {
    const int64_t n = j - c.j_begin;
    const int stage = static_cast<int>(n & 1);
    cute::wait_barrier(sm.full[stage], static_cast<int>((n >> 1) & 1));
    // The thread's quarters, each element's chain in ascending key order (the
    // first quarter from B_j), then summed left to right into x.
    constexpr int kEachKeys = Tiling::kKeyUnroll / kEach;  // a quarter's keys an iteration
    static_assert(kEachKeys % 4 == 0, "S_in's keys are loaded 4 at a time");
    float acc[kEach][kRuns][kTR][kRun];
#pragma unroll
    for (int e = 0; e < kEach; ++e)
#pragma unroll
      for (int u = 0; u < kRuns; ++u)
#pragma unroll
        for (int i = 0; i < kTR; ++i) {
          if (group * kEach + e == 0 && !c.key_rows) {
            load_shared_run(&sm.b[stage][r0 + i][run_col(u)], acc[e][u][i]);
          } else {
#pragma unroll
            for (int q = 0; q < kRun; ++q) acc[e][u][i][q] = 0.f;
          }
        }
    // The thread's quarters side by side: an iteration takes kEachKeys keys of
    // each, so the chains interleave and the body stays kKeyUnroll keys long.
#pragma unroll 1
    for (int kb = 0; kb < Tiling::kQuarterKeys; kb += kEachKeys) {
#pragma unroll
      for (int t = 0; t < kEachKeys; t += 4)
#pragma unroll
        for (int e = 0; e < kEach; ++e) {
          const int k4 = (group * kEach + e) * Tiling::kQuarterKeys + kb + t;  // 4 keys from here
          float sv[kTR][4];
#pragma unroll
          for (int i = 0; i < kTR; ++i) load_shared_run(&sm.s_in[r0 + i][k4], sv[i]);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            float mv[kRuns][kRun];
#pragma unroll
            for (int u = 0; u < kRuns; ++u) load_shared_run(&sm.m[stage][k4 + kk][run_col(u)], mv[u]);
#pragma unroll
            for (int u = 0; u < kRuns; ++u)
#pragma unroll
              for (int i = 0; i < kTR; ++i)
#pragma unroll
                for (int q = 0; q < kRun; ++q) acc[e][u][i][q] = fmaf(sv[i][kk], mv[u][q], acc[e][u][i][q]);
          }
        }
    }
    if constexpr (kShared) {  // every group's quarters into shared memory
#pragma unroll
      for (int e = 0; e < kEach; ++e)
#pragma unroll
        for (int u = 0; u < kRuns; ++u)
#pragma unroll
          for (int i = 0; i < kTR; ++i) store_shared_run(&sm.quarters[group * kEach + e][u][i][tid][0], acc[e][u][i]);
    } else {  // one group: all four quarters are the thread's own
#pragma unroll
      for (int u = 0; u < kRuns; ++u)
#pragma unroll
        for (int i = 0; i < kTR; ++i)
#pragma unroll
          for (int q = 0; q < kRun; ++q) {
            x[u][i][q] = acc[0][u][i][q];
#pragma unroll
            for (int e = 1; e < kEach; ++e) x[u][i][q] = ComposeQuarters::add(x[u][i][q], acc[e][u][i][q]);
          }
    }
    __syncthreads();  // the stage and S_in are read by every thread; the quarters are shared
    if (threadIdx.x == 0 && j + 2 < c.j_end) fetch(j + 2, stage);
    if constexpr (kShared) {
      // The group's rows from all four quarters, in order: ((q0 + q1) + q2) + q3.
#pragma unroll
      for (int u = 0; u < kRuns; ++u)
#pragma unroll
        for (int i = 0; i < kOwn; ++i) {
          load_shared_run(&sm.quarters[0][u][i0 + i][tid][0], x[u][i]);
#pragma unroll
          for (int h = 1; h < ComposeQuarters::kCount; ++h) {
            float y[kRun];
            load_shared_run(&sm.quarters[h][u][i0 + i][tid][0], y);
#pragma unroll
            for (int q = 0; q < kRun; ++q) x[u][i][q] = ComposeQuarters::add(x[u][i][q], y[q]);
          }
        }
    }
    share_rows();
    if (writes_back(c, j)) {
      float* b = segment_state(p, c.first_slot + j * c.pieces, c.v_head)->b + (c.row0 + r0 + i0) * kHeadDim;
#pragma unroll
      for (int u = 0; u < kRuns; ++u)
#pragma unroll
        for (int i = 0; i < kOwn; ++i) {
          float* at = b + i * kHeadDim + run_col(u);
          if constexpr (kRun == 4) *reinterpret_cast<float4*>(at) = make_float4(x[u][i][0], x[u][i][1], x[u][i][2], x[u][i][3]);
          else
#pragma unroll
            for (int q = 0; q < kRun; ++q) at[q] = x[u][i][q];
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < kRuns; ++u) store_tile_result<kDim>(p, c, c.row0 + r0 + i0, run_col(u), x[u]);
}

}  // namespace flashkda::sm90
