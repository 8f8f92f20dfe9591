// Epilogue: the chunk's output rows from the staging buffer to global memory,
// 16 bytes per thread and store, only the rows that belong to the sequence.
#pragma once
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

template <int kVCta, class Smem>
__device__ __forceinline__ void store_out(const Smem& s, const FwdParams& p, int64_t tok0, int rows, int v_head,
                                          int v0, int tid) {
  constexpr int kVecPerRow = kVCta / 8;
  for (int idx = tid; idx < kChunk * kVecPerRow; idx += kThreads) {
    const int r = idx / kVecPerRow, c = idx % kVecPerRow;
    if (r < rows) {
      uint16_t* dst = p.out + ((tok0 + r) * p.num_v_heads + v_head) * kHeadDim + v0 + 8 * c;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&s.out[r][8 * c]);
    }
  }
}

}  // namespace flashkda::sm90
