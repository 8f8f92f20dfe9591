// The sequential part: the recurrent state in registers, in fp32.
//
// A warp owns 16 rows of V of the state S ([V, K]) as sixteen m16n8 fp32
// accumulator tiles (tile j = key columns 8j..8j+7): 64 registers a thread, the
// whole sequence long. Per chunk, with the state as the A operand (M = V):
//   Uᵀ   = Vᵀ A_wᵀ − S wᵀ                    [16 V rows x 16 tokens]
//   outᵀ = S Q_decᵀ + Uᵀ Mqkᵀ
//   S    = S·diag(2^G_last) + Uᵀ K_res       (straight into the accumulators)
// The fp32 accumulators convert in place to the bf16 A fragments of the next
// product, so S never leaves the registers and the warps owning different rows
// of V never wait for each other.
#pragma once
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

struct StateRows {
  FragC tile[kHeadDim / 8];
};

// Offset of element (row, col) of the state of (seq, v_head); 64-bit.
__device__ __forceinline__ int64_t state_offset(const FwdParams& p, int seq, int v_head, int row, int col) {
  return ((static_cast<int64_t>(seq) * p.num_v_heads + v_head) * kHeadDim + row) * kHeadDim + col;
}

__device__ __forceinline__ void load_state(StateRows& S, const FwdParams& p, int seq, int v_head, int row0,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t off = state_offset(p, seq, v_head, row0 + g + 8 * hr, 8 * j + 2 * t);
      float2 x = make_float2(0.f, 0.f);
      if (p.initial_state_type == kStateFP32) {
        x = *reinterpret_cast<const float2*>(static_cast<const float*>(p.initial_state) + off);
      } else if (p.initial_state_type == kStateBF16) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p.initial_state) + off);
        x = make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
      }
      S.tile[j].x[2 * hr] = x.x;
      S.tile[j].x[2 * hr + 1] = x.y;
    }
  }
}

__device__ __forceinline__ void store_state(const StateRows& S, const FwdParams& p, int seq, int v_head, int row0,
                                            int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t off = state_offset(p, seq, v_head, row0 + g + 8 * hr, 8 * j + 2 * t);
      const float x0 = S.tile[j].x[2 * hr], x1 = S.tile[j].x[2 * hr + 1];
      if (p.final_state_type == kStateFP32) {
        *reinterpret_cast<float2*>(static_cast<float*>(p.final_state) + off) = make_float2(x0, x1);
      } else if (p.final_state_type == kStateBF16) {
        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.final_state) + off) = pack_bf16(x0, x1);
      }
    }
  }
}

// B fragments of K_res (16 tokens x key columns 8j..8j+7), hi and lo, with one
// transposing ldmatrix.x4 from the token-major kres_hi / kres_lo: lane l points
// at token 8·((l >> 3) & 1) + (l & 7) of kres_hi (l < 16) or kres_lo, column 8j.
struct KresLane {
  int offset;  // elements from kres_hi[0][0]
  __device__ __forceinline__ explicit KresLane(int lane)
      : offset((lane >> 4) * kChunk * kLdRow + (8 * ((lane >> 3) & 1) + (lane & 7)) * kLdRow) {}
  __device__ __forceinline__ void load(const ChunkOperands& ops, int j, FragB& hi, FragB& lo) const {
    const __nv_bfloat16* p = &ops.kres_hi[0][0] + offset + 8 * j;
    cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(p), hi.x[0], hi.x[1], lo.x[0], lo.x[1]);
  }
};
static_assert(offsetof(ChunkOperands, kres_lo) == offsetof(ChunkOperands, kres_hi) + sizeof(ChunkOperands::kres_hi),
              "KresLane reaches kres_lo from kres_hi");

// One chunk for the warp's 16 rows of V, columns vw..vw+15 of the CTA's slice
// `v` (row stride ldv); the warp's outᵀ tile goes to its staging tile out_tile.
// Uᵀ and K_res enter the state update as bf16 hi + lo: a single bf16 rounding of
// either is the largest term of the state's error (docs/design.md, "Accuracy").
__device__ __forceinline__ void recurrence_step(StateRows& S, const ChunkOperands& ops, const uint16_t* v, int ldv,
                                                int vw, __nv_bfloat16 (*out_tile)[kLdT], int lane) {
  const int g = lane >> 2, t = lane & 3;
  // Uᵀ accumulates in two halves, u (the terms in v and the even k-steps of S wᵀ)
  // and u_odd: the chain from the updated state to Uᵀ, the critical path of the
  // whole sequence, is then 4 dependent mma instead of 8 (the v terms do not
  // depend on the state and run ahead).
  FragC u[2], u_odd[2], o[2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    zero(u[nt]);
    zero(u_odd[nt]);
    zero(o[nt]);
  }
  // uᵀ = Vᵀ A_wᵀ with A_w = hi + lo: v is exact in bf16, so two terms give A_w to ~16 bits.
  // B fragments come in pairs of n-tiles, one ldmatrix.x4 each (ldsm_b2).
  const FragA vt = load_a_trans(v, ldv, 0, vw, lane);
  FragB aw_hi[2], aw_lo[2];
  ldsm_b2_tile16(ops.aw_hi, lane, aw_hi[0], aw_hi[1]);
  ldsm_b2_tile16(ops.aw_lo, lane, aw_lo[0], aw_lo[1]);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    mma_bf16(u[nt], vt, aw_hi[nt]);
    mma_bf16(u[nt], vt, aw_lo[nt]);
  }
  // − S wᵀ and S Q_decᵀ, both from the state before this chunk's update.
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const FragA sa = to_a_bf16(S.tile[2 * kk], S.tile[2 * kk + 1]);
    FragB wb[2], qb[2];
    ldsm_b2(&ops.wneg[0][0], kLdRow, 0, 16 * kk, lane, wb[0], wb[1]);
    ldsm_b2(&ops.qdec[0][0], kLdRow, 0, 16 * kk, lane, qb[0], qb[1]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      mma_bf16(kk % 2 ? u_odd[nt] : u[nt], sa, wb[nt]);
      mma_bf16(o[nt], sa, qb[nt]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) u[nt].x[e] += u_odd[nt].x[e];
  FragA ua_hi, ua_lo;
  split_a_bf16(u[0], u[1], ua_hi, ua_lo);
  // out += Uᵀ Mqkᵀ, hi·hi + lo·hi + hi·lo
  FragB m_hi[2], m_lo[2];
  ldsm_b2_tile16(ops.mqk_hi, lane, m_hi[0], m_hi[1]);
  ldsm_b2_tile16(ops.mqk_lo, lane, m_lo[0], m_lo[1]);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    mma_bf16(o[nt], ua_hi, m_hi[nt]);
    mma_bf16(o[nt], ua_lo, m_hi[nt]);
    mma_bf16(o[nt], ua_hi, m_lo[nt]);
  }
  // S = S·diag(2^G_last) + Uᵀ K_res, hi·hi + lo·hi + hi·lo
  const KresLane kl(lane);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    const float2 dl = *reinterpret_cast<const float2*>(&ops.decay_last[8 * j + 2 * t]);
    S.tile[j].x[0] *= dl.x;
    S.tile[j].x[1] *= dl.y;
    S.tile[j].x[2] *= dl.x;
    S.tile[j].x[3] *= dl.y;
    FragB kres_hi, kres_lo;
    kl.load(ops, j, kres_hi, kres_lo);
    mma_bf16(S.tile[j], ua_hi, kres_hi);
    mma_bf16(S.tile[j], ua_lo, kres_hi);
    mma_bf16(S.tile[j], ua_hi, kres_lo);
  }
  // outᵀ tile (V rows x tokens) → staging [token][v]
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int tok = 8 * nt + 2 * t;
    out_tile[tok][g] = __float2bfloat16_rn(o[nt].x[0]);
    out_tile[tok + 1][g] = __float2bfloat16_rn(o[nt].x[1]);
    out_tile[tok][g + 8] = __float2bfloat16_rn(o[nt].x[2]);
    out_tile[tok + 1][g + 8] = __float2bfloat16_rn(o[nt].x[3]);
  }
}

}  // namespace flashkda::sm90
