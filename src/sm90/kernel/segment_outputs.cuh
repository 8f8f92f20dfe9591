// The segment scan's outputs by superposition (docs/design.md, "The segment
// scan"). A segment's outputs are affine in its incoming state S_in:
//   out_t = o⁰_t + S_in · P_t
// o⁰: the value rows' outputs from a zero state (the run that gives B); P_t [K]:
// the key rows' outputs (the run from the identity with v = 0 that gives M), row r
// being what row r of S_in contributes. Pass 1 computes both alongside (M, B) and
// leaves them here; once pass 2 has every S_in, the output kernel
// (segment_output_kernel.cuh) forms out token-parallel, so no second chain of
// chunk steps runs. The CPU twin: cpu::segment_outputs_f64 and cpu::superpose.
#pragma once
#include <cstdint>

#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// One (chunk slot, value head), in mma fragment order, so that pass 1 stores and
// the output kernel loads whole 16-byte vectors per lane:
//   out0  [kDim/16 row blocks][32 lanes][8]: o⁰ᵀ of 16 V rows x 16 tokens, the two
//         fp32 C tiles (tokens 0-7, 8-15) of the warp that owns the rows
//   resp  [kDim/16 key blocks][32 lanes][8]: P of 16 keys x 16 tokens as the bf16
//         B fragments of the output product (k = key, n = token): n-tiles 0 and 1
//         of the high part, then of the low part (hi + lo: P enters the outputs
//         as the state does in the step, to ~2^-16)
template <int kDim>
struct ChunkOutputs {
  static constexpr int kBlocks = kDim / 16;
  float out0[kBlocks][32][8];
  uint32_t resp[kBlocks][32][8];
};
static_assert(sizeof(ChunkOutputs<kHeadDim>) == 16384 && sizeof(ChunkOutputs<64>) == 8192,
              "16 tokens x (V + K) fp32 words a chunk and head");

template <int kDim>
__device__ __forceinline__ ChunkOutputs<kDim>* chunk_outputs(const FwdParams& p, int64_t slot, int v_head) {
  return static_cast<ChunkOutputs<kDim>*>(p.chunk_outputs) + slot * p.num_v_heads + v_head;
}

// Pass 1's store of a warp's out tile (16 state rows from `row0`, a multiple of
// 16) for chunk c of its run: value rows as o⁰, key rows as P. Like the out
// cursor (epilogue.cuh), the lane's address is computed once.
template <int kDim>
struct OutputFragmentCursor {
  ChunkOutputs<kDim>* first;  // chunk 0 of the run
  int block, lane;

  __device__ __forceinline__ OutputFragmentCursor(const FwdParams& p, int64_t first_slot, int v_head, int row0,
                                                  int lane_)
      : first(chunk_outputs<kDim>(p, first_slot, v_head)), block(row0 / 16), lane(lane_) {}

  __device__ __forceinline__ void store(const FwdParams& p, const FragC (&o)[2], int64_t c, bool value_rows) const {
    ChunkOutputs<kDim>* t = first + c * p.num_v_heads;
    if (value_rows) {
      float4* dst = reinterpret_cast<float4*>(&t->out0[block][lane][0]);
      dst[0] = make_float4(o[0].x[0], o[0].x[1], o[0].x[2], o[0].x[3]);
      dst[1] = make_float4(o[1].x[0], o[1].x[1], o[1].x[2], o[1].x[3]);
    } else {
      // The tile (keys x tokens) as hi + lo A fragments, transposed in registers
      // into the B fragments of the same matrix (a_to_b).
      FragA hi, lo;
      split_a_bf16(o[0], o[1], hi, lo);
      FragB h0, h1, l0, l1;
      a_to_b(hi, h0, h1);
      a_to_b(lo, l0, l1);
      uint4* dst = reinterpret_cast<uint4*>(&t->resp[block][lane][0]);
      dst[0] = make_uint4(h0.x[0], h0.x[1], h1.x[0], h1.x[1]);
      dst[1] = make_uint4(l0.x[0], l0.x[1], l1.x[0], l1.x[1]);
    }
  }
};

}  // namespace flashkda::sm90
