// Asynchronous 16-byte loads (cp.async) into shared memory. All offsets are 64-bit.
//   prologue kernel:   q, k, g rows of one chunk (rows past the sequence zero-filled)
//   recurrence kernel: one ChunkOperands record and this CTA's slice of v
#pragma once
#include <cstddef>

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

// Byte offset inside a (padded) ChunkOperands of vector v of the unpadded record.
__device__ __forceinline__ int record_vector_offset(int v) {
  constexpr int kRows = kChunk * kRowVecs, kT16 = kChunk * kTVecs, kTK = kHeadDim * kTVecs;
  auto row_major = [](int base, int vec, int vecs_per_row, int ld) {
    return base + (vec / vecs_per_row) * ld * 2 + (vec % vecs_per_row) * 16;
  };
  if (v < kRows) return row_major(offsetof(ChunkOperands, wneg), v, kRowVecs, kLdRow);
  v -= kRows;
  if (v < kRows) return row_major(offsetof(ChunkOperands, qdec), v, kRowVecs, kLdRow);
  v -= kRows;
  if (v < kTK) return row_major(offsetof(ChunkOperands, kresT), v, kTVecs, kLdT);
  v -= kTK;
  if (v < 4 * kT16) {
    const int field = v / kT16;  // mqk_hi, mqk_lo, aw_hi, aw_lo are consecutive, equal-sized
    return row_major(offsetof(ChunkOperands, mqk_hi) + field * int(sizeof(ChunkOperands::mqk_hi)), v % kT16, kTVecs,
                     kLdT);
  }
  v -= 4 * kT16;
  return offsetof(ChunkOperands, decay_last) + v * 16;
}

template <int kThreadCount>
__device__ __forceinline__ void load_record_async(ChunkOperands& dst, const uint4* src, int tid) {
  auto* base = reinterpret_cast<unsigned char*>(&dst);
  for (int v = tid; v < kRecordVectors; v += kThreadCount) cp_async_16(base + record_vector_offset(v), src + v, true);
}

__device__ __forceinline__ void store_record(const ChunkOperands& src, uint4* dst, int tid) {
  const auto* base = reinterpret_cast<const unsigned char*>(&src);
  for (int v = tid; v < kRecordVectors; v += blockDim.x)
    dst[v] = *reinterpret_cast<const uint4*>(base + record_vector_offset(v));
}

}  // namespace flashkda::sm90
