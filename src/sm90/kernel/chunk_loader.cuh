// Asynchronous 16-byte loads (cp.async) into shared memory. All offsets are 64-bit.
//   prologue kernel:   q, k, g rows of one chunk (rows past the sequence zero-filled)
//   recurrence kernel: one ChunkOperands record and this CTA's slice of v
#pragma once
#include <cute/arch/copy_sm80.hpp>

#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool pred) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *reinterpret_cast<const cute::uint128_t*>(gmem_src), *reinterpret_cast<cute::uint128_t*>(smem_dst), pred);
}

// `rows` valid rows of a [token][heads][width] bf16 tensor at head `head`,
// columns col0..col0+kCols-1, into dst[16][ld]; invalid rows become zeros.
template <int kCols, int kThreadCount>
__device__ __forceinline__ void load_token_rows_async(uint16_t* dst, int ld, const uint16_t* base, int64_t tok0,
                                                      int rows, int64_t heads, int head, int width, int col0,
                                                      int tid) {
  constexpr int kVecPerRow = kCols / 8;
  for (int idx = tid; idx < kChunk * kVecPerRow; idx += kThreadCount) {
    const int r = idx / kVecPerRow, c = idx % kVecPerRow;
    const bool valid = r < rows;
    const uint16_t* src = valid ? base + ((tok0 + r) * heads + head) * width + col0 + 8 * c : base;
    cp_async_16(dst + r * ld + 8 * c, src, valid);
  }
}

template <int kThreadCount>
__device__ __forceinline__ void load_record_async(ChunkOperands& dst, const ChunkOperands* src, int tid) {
  auto* d = reinterpret_cast<cute::uint128_t*>(&dst);
  const auto* s = reinterpret_cast<const cute::uint128_t*>(src);
  for (int i = tid; i < kOperandVectors; i += kThreadCount) cp_async_16(d + i, s + i, true);
}

}  // namespace flashkda::sm90
