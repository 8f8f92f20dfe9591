// Epilogue of the recurrence kernel: a warp's 16 tokens x 16 values of output
// from its staging tile to global memory, one 16-byte store per lane (two lanes
// per token row: a full 32-byte sector), only rows that belong to the sequence.
#pragma once
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

__device__ __forceinline__ void store_out_tile(const __nv_bfloat16 (*tile)[kLdT], const FwdParams& p, int64_t tok0,
                                               int rows, int v_head, int v_col0, int lane) {
  const int r = lane >> 1, half = lane & 1;
  if (r < rows) {
    uint16_t* dst = p.out + ((tok0 + r) * p.num_v_heads + v_head) * kHeadDim + v_col0 + 8 * half;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&tile[r][8 * half]);
  }
}

}  // namespace flashkda::sm90
