// The segment scan's outputs by superposition (docs/design.md, "The segment
// scan"). A segment's outputs are affine in its incoming state S_in:
//   out_t = o⁰_t + S_in · P_t
// o⁰: the value rows' outputs from a zero state (the run that gives B); P_t [K]:
// the key rows' outputs (the run from the identity with v = 0 that gives M), row r
// being what row r of S_in contributes. Pass 1 computes both alongside (M, B) and
// leaves them here; once pass 2 has every S_in, the output kernel
// (segment_output_kernel.cuh) forms out token-parallel, so no second chain of
// chunk steps runs. The CPU twin: cpu::segment_summary_f64 (its `outputs`) and cpu::superpose.
#pragma once
#include <cstddef>
#include <cstdint>

#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

// One (chunk slot, value head), laid out for the output kernel's products:
//   resp  P as bf16, [token][key] in the record's 128-byte-swizzled K-major
//         layout (sw128_offset: the B operand of wgmma, as wq is), with 8-token
//         groups kDim · 16 bytes apart (resp_offset). One bf16 rounding of P, as
//         the step rounds Q_dec once where the state meets it (S·Q_decᵀ): P_t is
//         what Q_dec_t becomes after the segment's transitions, and S_in still
//         enters as hi + lo. A lo part (~2^-16) would cost 4 KB a chunk and head
//         written by pass 1 and read by the output kernel, a quarter of the bytes
//         both move (docs/perf-log.md, "P in one bf16").
//   out0  [kDim/16 row blocks][32 lanes][8]: o⁰ᵀ of 16 V rows x 16 tokens, the two
//         fp32 C tiles (tokens 0-7, 8-15) of the warp that owns the rows, which
//         are also the wgmma accumulators the output kernel starts from
// The bulk copy moves it whole; 1024-byte aligned in shared memory (swizzle atoms).
template <int kDim>
struct alignas(kSw128AtomBytes) ChunkOutputs {
  static constexpr int kBlocks = kDim / 16;
  static constexpr int kGroupBytes = kDim * 16;  // 8 tokens x kDim keys of bf16
  __nv_bfloat16 resp[kChunk * kDim];
  float out0[kBlocks][32][8];
};
static_assert(sizeof(ChunkOutputs<kHeadDim>) == 12288 && sizeof(ChunkOutputs<64>) == 6144,
              "16 tokens x (V fp32 + K bf16) a chunk and head");
static_assert(offsetof(ChunkOutputs<64>, resp) % kSw128AtomBytes == 0 &&
                  offsetof(ChunkOutputs<kHeadDim>, resp) % kSw128AtomBytes == 0,
              "P's swizzle atoms start 1024-byte aligned");

// Element offset of (token, key) in resp: sw128_offset with 8-token
// groups of kDim keys (K = 64: one 64-key atom a group).
template <int kDim>
__host__ __device__ constexpr int resp_offset(int token, int key) {
  return (token / 8) * (kDim * 8) + (key / 64) * 512 + (token % 8) * 64 + ((((key % 64) / 8) ^ (token % 8)) * 8) +
         key % 8;
}
static_assert(resp_offset<kHeadDim>(13, 100) == sw128_offset(13, 100), "K = 128: the record's layout");

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
      // The tile (keys x tokens) as a bf16 A fragment, transposed in registers
      // into the B fragments of the same matrix (a_to_b): lane (g, t) then holds
      // keys 2t, 2t+1 (+8) of tokens g (+8), one 4-byte word of [token][key] each.
      FragB b0, b1;
      a_to_b(to_a_bf16(o[0], o[1]), b0, b1);
      const int g = lane >> 2, key = 16 * block + 2 * (lane & 3);
      auto word = [&](int token, int k) { return reinterpret_cast<uint32_t*>(t->resp + resp_offset<kDim>(token, k)); };
      *word(g, key) = b0.x[0];
      *word(g, key + 8) = b0.x[1];
      *word(g + 8, key) = b1.x[0];
      *word(g + 8, key + 8) = b1.x[1];
    }
  }
};

}  // namespace flashkda::sm90
