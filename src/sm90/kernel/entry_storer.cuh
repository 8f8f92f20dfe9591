// Periodic bf16 key-major checkpoint entries (fla's `h`) written by warps that
// hold no state: the entry storer, a warpgroup after the state warps.
//
// The state warps' stop shrinks to the state's bf16 image transposed into a
// shared-memory stage (one stmatrix.trans for two key tiles: 8 a thread) and
// an arrival; the storer copies the stage to the entry as whole 128-byte lines
// while the chain goes on. The stops written by the state warps themselves
// (checkpoints.cuh, store_state_key_major_bf16) take 32 movmatrix, 16 shuffles
// and 16 scattered 8-byte stores a thread (eight cache lines an instruction) on
// the chain, with the next step's loads queued behind them (docs/perf-log.md).
//
// Stage: [key][row of the CTA's kVCta rows] bf16, a key's rows one run of
// kVCta·2 bytes, its 16-byte chunks swizzled by chunk ^ (key % 8) so that the
// eight keys of an 8x8 block (one stmatrix row each) land in eight bank groups.
//
// Hand-over, two named barriers (kStageFull, kStageFree) of all the CTA's
// threads; a stage's next write waits for the storer's release of the last:
//   state warps: [bar.sync free, after the first stop] → stage → bar.arrive full
//   storer:      bar.sync full → copy → [bar.arrive free, but after the last]
// The storer finds the entries and their count from the CTA's checkpoint cursor
// itself (periodic_entries_stored), as the state warps' stops do: nothing else
// crosses.
//
// Registers: one allocation serves every warp of a kernel, and a warp after the
// state warps put three warps on some SM sub-partitions, which held the kernel
// to 168 registers a thread (spilling the state). So the storer is a whole
// warpgroup that gives its registers to the state warps (setmaxnreg, which
// works on warpgroups) down to storer_registers.
#pragma once
#include <cstdint>

#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/recurrence.cuh"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// Named barriers: 0 is __syncthreads. With the storer the state warps' own
// CTA barrier (the chunk loop's) is kStateWarpsBarrier over their threads only.
constexpr int kStateWarpsBarrier = 1;
constexpr int kStageFull = 2;
constexpr int kStageFree = 3;

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

constexpr int kStorerThreads = 128;  // a warpgroup
// The storer's registers: its copy loop's four 16-byte vectors in flight and
// their addresses, and once its cursor. 40 behind one state warpgroup (which
// gets 216); behind two, whose share of what the storer gives is half as much a
// thread, 56 (they get 224): at 40 its set-up spilled there.
constexpr int storer_registers(int state_threads) { return state_threads > kStorerThreads ? 56 : 40; }

// Registers a thread at the kernel's entry (the kernel's one allocation:
// kCtaThreads threads, kCtas CTAs an SM), and what the state warps take once the
// storer has given its own up: both multiples of 8, as setmaxnreg requires.
constexpr int entry_registers(int cta_threads, int ctas) { return (65536 / (cta_threads * ctas)) / 8 * 8; }
constexpr int state_registers(int state_threads, int cta_threads, int ctas) {
  return (entry_registers(cta_threads, ctas) +
          (entry_registers(cta_threads, ctas) - storer_registers(state_threads)) * kStorerThreads / state_threads) /
         8 * 8;
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <int kVCta>
struct EntryStage {
  static constexpr int kChunksPerKey = kVCta / 8;  // 16-byte chunks of 8 rows
  static constexpr int kChunks = kHeadDim * kChunksPerKey;
  static constexpr size_t kBytes = size_t{kChunks} * 16;
  static_assert(kChunksPerKey % 8 == 0, "the swizzle permutes chunks within 128-byte groups");
  static_assert(kChunks % kStorerThreads == 0, "whole chunks a storer thread");

  // The byte offset of chunk c (rows 8c..8c+7) of key k.
  __device__ static uint32_t offset(int k, int c) { return (k * kChunksPerKey + (c ^ (k & 7))) * 16; }
};

// The warp's 16 rows (rows 16·warp.. of the CTA) as the stage's bf16 image: per
// pair of key tiles one stmatrix.trans of four 8x8 blocks, block b = (tile j +
// b / 2, rows 8(b % 2)..), lane l addressing key 8(j + b / 2) + l % 8 of block
// b = l / 8. Each storage row of a transposed block is one key's 8 rows.
template <int kVCta>
__device__ __forceinline__ void stage_state_key_major(const StateRows& S, unsigned char* stage, int warp, int lane) {
  using Stage = EntryStage<kVCta>;
  const int b = lane >> 3, r = lane & 7;
  const int chunk = 2 * warp + (b & 1);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; j += 2) {
    const int key = 8 * (j + (b >> 1)) + r;
    cute::SM90_U16x8_STSM_T::copy(pack_bf16(S.tile[j].x[0], S.tile[j].x[1]),
                                  pack_bf16(S.tile[j].x[2], S.tile[j].x[3]),
                                  pack_bf16(S.tile[j + 1].x[0], S.tile[j + 1].x[1]),
                                  pack_bf16(S.tile[j + 1].x[2], S.tile[j + 1].x[3]),
                                  *reinterpret_cast<cute::uint128_t*>(stage + Stage::offset(key, chunk)));
  }
}

// The state warps' side. `pending`: a stage handed over and not yet known to be
// released (the first stop of a CTA finds the stage free).
template <int kVCta>
struct EntryHandOff {
  static constexpr int kCtaThreads = 2 * kVCta + kStorerThreads;  // 16 rows a state warp, and the storer
  bool pending = false;

  // The next entry, from the warps' rows; every state thread calls it.
  __device__ __forceinline__ void hand_over(const StateRows& S, unsigned char* stage, int warp, int lane) {
    if (pending) named_barrier_sync(kStageFree, kCtaThreads);
    stage_state_key_major<kVCta>(S, stage, warp, lane);
    named_barrier_arrive(kStageFull, kCtaThreads);
    pending = true;
  }
};

// The storer: copies each staged entry to rows row0.. of its destination (row
// i, key k at dst + k·K + i), whole 16-byte chunks, a key's kVCta rows one run
// (a 128-byte line or two), kBatch loads in flight before their stores.
// `st`: the thread's index in the storer warpgroup. Thread st copies chunk
// st % kChunksPerKey of keys st / kChunksPerKey + kKeyStep·i: the swizzle
// (key % 8) is the same for all of them, so both addresses step by constants
// (at 32 registers, per-copy addresses were spilled).
// `entry`: the first entry's first element (row 0, key 0 of the value head),
// `stride`: from one entry to the next, `count`: the entries handed over.
template <int kVCta>
__device__ __forceinline__ void run_entry_storer(const unsigned char* stage, __nv_bfloat16* entry, int64_t stride,
                                                 int64_t count, int row0, int st) {
  using Stage = EntryStage<kVCta>;
  constexpr int kBatch = 4;
  constexpr int kPerThread = Stage::kChunks / kStorerThreads;
  constexpr int kKeyStep = kStorerThreads / Stage::kChunksPerKey;
  static_assert(kPerThread % kBatch == 0 && kKeyStep % 8 == 0, "whole batches a thread; one swizzle a thread");
  constexpr int kCtaThreads = EntryHandOff<kVCta>::kCtaThreads;
  const int key0 = st / Stage::kChunksPerKey, chunk = st % Stage::kChunksPerKey;
  const unsigned char* const from = stage + Stage::offset(key0, chunk);
  __nv_bfloat16* to = entry + static_cast<int64_t>(key0) * kHeadDim + row0 + 8 * chunk;
  for (int64_t e = 0; e < count; ++e, to += stride) {
    named_barrier_sync(kStageFull, kCtaThreads);
#pragma unroll
    for (int i0 = 0; i0 < kPerThread; i0 += kBatch) {
      uint4 x[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        x[i] = *reinterpret_cast<const uint4*>(from + (i0 + i) * kKeyStep * Stage::kChunksPerKey * 16);
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        *reinterpret_cast<uint4*>(to + (i0 + i) * kKeyStep * kHeadDim) = x[i];
    }
    // The stores above have read their registers, so the loads are done. After
    // the last entry no stage follows (and no arrival waits unmatched at exit).
    if (e + 1 < count) named_barrier_arrive(kStageFree, kCtaThreads);
  }
}

}  // namespace flashkda::sm90
