// Asynchronous loads of one chunk's raw inputs (q, k, g and this CTA's slice of
// v) into a shared-memory stage, 16 bytes per cp.async, rows past the end of the
// sequence zero-filled. All offsets are 64-bit.
#pragma once
#include <cute/arch/copy_sm80.hpp>

#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool pred) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *reinterpret_cast<const cute::uint128_t*>(gmem_src), *reinterpret_cast<cute::uint128_t*>(smem_dst), pred);
}

// Rows of `heads` x kHeadDim-wide tokens: one 16-byte vector = 8 elements.
__device__ __forceinline__ void load_rows_async(uint16_t (*dst)[kHeadDim], const uint16_t* base, int64_t tok0,
                                                int rows, int64_t heads, int head, int tid) {
  constexpr int kVecPerRow = kHeadDim / 8;
  for (int idx = tid; idx < kChunk * kVecPerRow; idx += kThreads) {
    const int r = idx / kVecPerRow, c = idx % kVecPerRow;
    const bool valid = r < rows;
    const uint16_t* src = valid ? base + ((tok0 + r) * heads + head) * kHeadDim + 8 * c : base;
    cp_async_16(&dst[r][8 * c], src, valid);
  }
}

template <int kVCta>
__device__ __forceinline__ void load_chunk_async(typename SharedStorage<kVCta>::Stage& st, const FwdParams& p,
                                                 int64_t tok0, int rows, int qk_head, int v_head, int v0, int tid) {
  load_rows_async(st.q, p.q, tok0, rows, p.num_heads, qk_head, tid);
  load_rows_async(st.k, p.k, tok0, rows, p.num_heads, qk_head, tid);
  load_rows_async(st.g, p.g, tok0, rows, p.num_v_heads, v_head, tid);
  constexpr int kVecPerRow = kVCta / 8;
  for (int idx = tid; idx < kChunk * kVecPerRow; idx += kThreads) {
    const int r = idx / kVecPerRow, c = idx % kVecPerRow;
    const bool valid = r < rows;
    const uint16_t* src =
        valid ? p.v + ((tok0 + r) * p.num_v_heads + v_head) * kHeadDim + v0 + 8 * c : p.v;
    cp_async_16(&st.v[r][8 * c], src, valid);
  }
  cute::cp_async_fence();
}

}  // namespace flashkda::sm90
