// Asynchronous 16-byte loads (cp.async) into shared memory. All offsets are 64-bit.
//   prologue kernel:   q, k, g rows of one chunk (rows past the sequence zero-filled)
//   recurrence kernel: one ChunkOperands record and this CTA's slice of v
#pragma once
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/copy_sm90_desc.hpp>

#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool pred) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *reinterpret_cast<const cute::uint128_t*>(gmem_src), *reinterpret_cast<cute::uint128_t*>(smem_dst), pred);
}

// `rows` valid rows of a bf16 (T = uint16_t) or fp32 (T = float) tensor (element
// (t, h, c) at t·tok_stride + h·head_stride + c) at head offset head_off =
// h·head_stride, columns col0..col0+kCols-1, into dst[16][ld]; invalid rows, and
// the columns from kValidCols on (a 64-wide head in 128-wide tiles), become zeros.
// The copies per thread are a compile-time count, fully unrolled: a run-time
// loop here cost the prologue kernel ~200 integer instructions a warp per chunk
// (loop control and 64-bit address arithmetic), a fifth of its issue slots.
template <int kCols, int kThreadCount, int kValidCols = kCols, class T>
__device__ __forceinline__ void load_token_rows_async(T* dst, int ld, const T* base, int64_t tok0, int rows,
                                                      int32_t tok_stride, int64_t head_off, int col0, int tid) {
  constexpr int kPerVec = 16 / sizeof(T);
  constexpr int kVecPerRow = kCols / kPerVec;
  constexpr int kVectors = kChunk * kVecPerRow;
  static_assert(kVectors % kThreadCount == 0, "every thread copies the same number of vectors");
#pragma unroll
  for (int j = 0; j < kVectors / kThreadCount; ++j) {
    const int idx = tid + j * kThreadCount;
    const int r = idx / kVecPerRow, c = idx % kVecPerRow;
    bool valid = r < rows;
    if constexpr (kValidCols < kCols) valid = valid && kPerVec * c < kValidCols;
    const T* src = valid ? base + (tok0 + r) * tok_stride + head_off + col0 + kPerVec * c : base;
    cp_async_16(dst + r * ld + kPerVec * c, src, valid);
  }
}

// The recurrence kernel's per-thread cursor over one sequence's chunks: the
// 64-bit address arithmetic is done once, and a chunk only adds a stride. In
// the latency-bound recurrence these integer instructions share the issue slots
// of the state update (docs/perf-log.md, "loader cursor"). Strides are re-read
// from the kernel parameters rather than kept in registers: the 8-warp variant
// has none to spare.
//   record  the records of consecutive chunks are HV records apart; this thread
//           copies vectors tid, tid + kThreadCount, ... of each
//   v       one 16-byte vector per thread: 16 token rows x kVCols/8 vectors
// kDim: the caller's head dim; only the vectors its recurrence reads are loaded
// (record_vector, shared_storage.cuh).
template <int kVCols, int kThreadCount, int kDim>
struct ChunkCursor {
  static constexpr int kVecPerRow = kVCols / 8;
  static_assert(kChunk * kVecPerRow == kThreadCount, "one v vector per thread");
  static constexpr int kRecordVectors = record_vectors<kDim>();
  static constexpr int kRecordCopies = (kRecordVectors + kThreadCount - 1) / kThreadCount;
  static constexpr bool kRecordTail = kRecordVectors % kThreadCount != 0;

  const cute::uint128_t* record;  // this thread's first vector of chunk 0's record
  const uint16_t* v;              // this thread's v vector of chunk 0
  int v_row, v_dst;               // token row within the chunk; element offset in the v tile

  __device__ __forceinline__ ChunkCursor(const FwdParams& p, const ChunkOperands* first_record, int64_t tok0,
                                         int head, int col0, int ld_v, int tid) {
    record = reinterpret_cast<const cute::uint128_t*>(first_record) + tid;
    v_row = tid / kVecPerRow;
    const int vc = tid % kVecPerRow;
    v = p.v + (tok0 + v_row) * p.v_tok + static_cast<int64_t>(head) * p.v_head + col0 + 8 * vc;
    v_dst = v_row * ld_v + 8 * vc;
  }

  // cp.async of chunk c's record (unless kBulkRecords: the kernel's one bulk copy,
  // bulk_copy_record) and v rows into (ops, v_tile); token rows at or past `rows`
  // read as zeros.
  template <bool kBulkRecords>
  __device__ __forceinline__ void issue(const FwdParams& p, ChunkOperands& ops, uint16_t* v_tile, int64_t c,
                                        int rows, int tid) const {
    if constexpr (!kBulkRecords) {
      const cute::uint128_t* src = record + c * p.num_v_heads * kOperandVectors;
      auto* dst = reinterpret_cast<cute::uint128_t*>(&ops) + tid;
#pragma unroll
      for (int j = 0; j < kRecordCopies; ++j) {
        if (!kRecordTail || j + 1 < kRecordCopies || tid + j * kThreadCount < kRecordVectors) {
          const int off = record_copy_offset<kDim, kThreadCount>(j, tid);
          cp_async_16(dst + off, src + off, true);
        }
      }
    }
    const bool valid = v_row < rows;
    // A zero-filling copy reads nothing, but its address must still be valid.
    cp_async_16(v_tile + v_dst, valid ? v + c * (int64_t{kChunk} * p.v_tok) : p.v, valid);
  }
};

// kBytes (a multiple of 16, both ends 16-byte aligned) from global to shared
// memory by the bulk-copy engine, completing on `full` (an mbarrier expecting
// its bytes). Its writes are in the async proxy, which wgmma reads through, so
// no proxy fence stands between them; the threads' reads after the mbarrier
// wait see them too.
template <uint32_t kBytes>
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint64_t& full) {
  static_assert(kBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  cute::set_barrier_transaction_bytes(full, kBytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(kBytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(&full)))
               : "memory");
}

// The CTA's stage barriers for bulk copies: thread 0 initialises them, each to
// complete after `arrivals` arrivals (one a bulk_copy) and their bytes, and makes
// them visible to the async proxy; the CTA barrier then orders them before any
// thread's first wait or copy. Every thread of the CTA calls it.
template <int kCount>
__device__ __forceinline__ void init_stage_barriers(uint64_t (&full)[kCount], int arrivals) {
  if (threadIdx.x == 0) {
    for (int st = 0; st < kCount; ++st) cute::initialize_barrier(full[st], arrivals);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// One whole record (K = 128 reads all of it).
__device__ __forceinline__ void bulk_copy_record(ChunkOperands& dst, const ChunkOperands* src, uint64_t& full) {
  bulk_copy<sizeof(ChunkOperands)>(&dst, src, full);
}

}  // namespace flashkda::sm90
