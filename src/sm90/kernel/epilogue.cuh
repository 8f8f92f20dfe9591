// Epilogue of the recurrence kernel: a warp's 16 tokens x 16 values of output
// from its staging tile to global memory, one 16-byte store per lane (two lanes
// per token row: a full 32-byte sector), only rows that belong to the sequence.
// Like the loads (chunk_loader.cuh), the lane's address is computed once and a
// chunk only adds a stride.
#pragma once
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// kDim: values per head of out (its rows are [token][value head][kDim]).
template <int kDim>
struct OutCursor {
  uint16_t* dst;  // this lane's 8 values of chunk 0
  int row, col;   // token row within the chunk, first column in the staging tile

  __device__ __forceinline__ OutCursor(const FwdParams& p, int64_t tok0, int v_head, int v_col0, int lane)
      : row(lane >> 1), col(8 * (lane & 1)) {
    dst = p.out + ((tok0 + row) * p.num_v_heads + v_head) * kDim + v_col0 + col;
  }

  __device__ __forceinline__ void store(const FwdParams& p, const __nv_bfloat16 (*tile)[kLdT], int64_t c,
                                        int rows) const {
    if (row < rows)
      *reinterpret_cast<uint4*>(dst + c * (kChunk * p.num_v_heads * kDim)) =
          *reinterpret_cast<const uint4*>(&tile[row][col]);
  }
};

}  // namespace flashkda::sm90
