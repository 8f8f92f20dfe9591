// The sequential part: the recurrent state in registers, in fp32.
//
// A warp owns 16 rows of V of the state S ([V, K]) as sixteen m16n8 fp32
// accumulator tiles (tile j = key columns 8j..8j+7): 64 registers a thread, the
// whole sequence long. Per chunk, with the state as the A operand (M = V):
//   Uᵀ   = Vᵀ A_wᵀ − S wᵀ                    [16 V rows x 16 tokens]
//   outᵀ = S Q_decᵀ + Uᵀ Mqkᵀ
//   S    = S·diag(2^G_last) + Uᵀ K_res       (straight into the accumulators)
// The fp32 accumulators convert in place to the bf16 A fragments of the next
// product, so S never leaves the registers. The two products with S (S [wᵀ
// Q_decᵀ] and the update) run as wgmma over the 64 rows of a warpgroup, the
// 16x16 ones as mma.sync per warp; the tiles of S are both the mma.sync C
// layout and the wgmma accumulator layout.
#pragma once
#include "sm90/kernel/fragments.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/state_location.cuh"
#include "sm90/kernel/tile_scheduler.cuh"
#include "sm90/kernel/wgmma.cuh"

namespace flashkda::sm90 {

struct StateRows {
  FragC tile[kHeadDim / 8];
};

// The tiles of the caller's kDim key columns (K = 64: the first eight; the others
// stay zero and are never touched, so the compiler keeps no registers for them).
template <int kDim>
__device__ __forceinline__ FragC (&key_tiles(StateRows& S))[kDim / 8] {
  return *reinterpret_cast<FragC(*)[kDim / 8]>(&S.tile[0]);
}

// The warp's rows row0.. of the state at `l` (zero where it has none), rows of
// kDim keys (the columns past them zero); bf16 states widen exactly. The type
// test per element runs once per CTA; the straight-line form of store_state
// (with_state_element) here made the checkpoint variant's chunk loop 77
// instructions longer and its checkpoints slower (docs/perf-log.md), so it stays.
template <int kDim>
__device__ __forceinline__ void load_state(StateRows& S, const StateLocation& l, int row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t off = l.offset + static_cast<int64_t>(row0 + g + 8 * hr) * kDim + 8 * j + 2 * t;
      float2 x = make_float2(0.f, 0.f);
      if (8 * j >= kDim) {
        // padding columns: zero
      } else if (l.in_type == kStateFP32) {
        x = *reinterpret_cast<const float2*>(static_cast<const float*>(l.in) + off);
      } else if (l.in_type == kStateBF16) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(l.in) + off);
        x = make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
      }
      S.tile[j].x[2 * hr] = x.x;
      S.tile[j].x[2 * hr + 1] = x.y;
    }
  }
}

// Calls f(T{}) once with T the element type of a state buffer (float or
// __nv_bfloat16; nothing for kStateNone), so that the stores inside f are
// straight-line code. A type test per element compiled to a branch per store,
// which made a checkpoint cost more than its bytes (docs/perf-log.md).
template <class F>
__device__ __forceinline__ void with_state_element(int32_t type, F&& f) {
  if (type == kStateFP32) f(float{});
  else if (type == kStateBF16) f(__nv_bfloat16{});
}

// Two adjacent elements of a row (8 or 4 bytes, aligned: even column).
__device__ __forceinline__ void store_pair(float* at, float x0, float x1) {
  *reinterpret_cast<float2*>(at) = make_float2(x0, x1);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* at, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(at) = pack_bf16(x0, x1);
}

// The warp's rows row0.. at `l`, rows of kDim keys (value-major: row i, key j at
// offset + i·kDim + j).
template <int kDim>
__device__ __forceinline__ void store_state(const StateRows& S, const StateLocation& l, int row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  with_state_element(l.out_type, [&](auto element) {
    using T = decltype(element);
    T* rows = static_cast<T*>(l.out) + l.offset + static_cast<int64_t>(row0 + g) * kDim + 2 * t;
#pragma unroll
    for (int j = 0; j < kDim / 8; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        store_pair(rows + 8 * hr * kDim + 8 * j, S.tile[j].x[2 * hr], S.tile[j].x[2 * hr + 1]);
  });
}

// The warp's rows row0.. of a key-major state at `l` (row i, key j at
// offset + j·kDim + i; zero where it has none). Once per CTA, element by element:
// a thread's two rows of a key are 8 rows apart.
template <int kDim>
__device__ __forceinline__ void load_state_key_major(StateRows& S, const StateLocation& l, int row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t off = l.offset + static_cast<int64_t>(8 * j + 2 * t + e) * kDim + row0 + g + 8 * hr;
        float x = 0.f;
        if (8 * j >= kDim) {
          // padding columns: zero
        } else if (l.in_type == kStateFP32) {
          x = static_cast<const float*>(l.in)[off];
        } else if (l.in_type == kStateBF16) {
          x = __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(l.in)[off]) << 16);
        }
        S.tile[j].x[2 * hr + e] = x;
      }
}

// The warp's rows row0.. into a key-major state at `l` (row i, key j at
// offset + j·kDim + i), element by element in its dtype; once per CTA, after the
// chunk loop. Written as a strided store (row stride 1, key stride kDim): in the
// shape of the movmatrix form of the checkpoint entries, or of store_state's pairs,
// the kernels' chunk loops took other registers and another schedule (2 more
// registers, 96/8192 with checkpoints 0.8 % slower, docs/perf-log.md); this form
// leaves them as without it (SASS compared loop by loop).
template <int kDim>
__device__ __forceinline__ void store_state_key_major(const StateRows& S, const StateLocation& l, int row0, int lane) {
  constexpr int64_t kRowStride = 1, kKeyStride = kDim;
  const int g = lane >> 2, t = lane & 3;
  with_state_element(l.out_type, [&](auto element) {
    using T = decltype(element);
    T* at = static_cast<T*>(l.out) + l.offset + (row0 + g) * kRowStride + 2 * t * kKeyStride;
#pragma unroll
    for (int j = 0; j < kDim / 8; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int e = 0; e < 2; ++e) at[8 * hr * kRowStride + (8 * j + e) * kKeyStride] = T(S.tile[j].x[2 * hr + e]);
  });
}

// The segment scan's starting rows (tile_scheduler.cuh, StateFrom): zero, the
// identity's rows row0.. (for M), or fp32 rows of a workspace state (its first
// kDim columns; the others are zero).
template <int kDim>
__device__ __forceinline__ void load_state_rows(StateRows& S, StateFrom from, const float* rows, int row0,
                                                int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + g + 8 * hr, col = 8 * j + 2 * t;
      float2 x = make_float2(0.f, 0.f);
      if (8 * j >= kDim) {
        // padding columns: zero
      } else if (from == StateFrom::kIdentity) {
        x = make_float2(row == col ? 1.f : 0.f, row == col + 1 ? 1.f : 0.f);
      } else if (from == StateFrom::kBuffer) {
        x = *reinterpret_cast<const float2*>(rows + static_cast<int64_t>(row) * kHeadDim + col);
      }
      S.tile[j].x[2 * hr] = x.x;
      S.tile[j].x[2 * hr + 1] = x.y;
    }
  }
}

template <int kDim>
__device__ __forceinline__ void store_state_rows(const StateRows& S, float* rows, int row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kDim / 8; ++j) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + g + 8 * hr, col = 8 * j + 2 * t;
      *reinterpret_cast<float2*>(rows + static_cast<int64_t>(row) * kHeadDim + col) =
          make_float2(S.tile[j].x[2 * hr], S.tile[j].x[2 * hr + 1]);
    }
  }
}

// A warp's outᵀ tile (16 V rows x 16 tokens, two C tiles: tokens 0-7, 8-15) →
// staging [token][v] in bf16: its four 8x8 blocks, each transposed on the way,
// by one stmatrix (lanes 8i..8i+7 address the token rows of block i: V rows
// 8(i & 1).., tokens 8(i >> 1)..). Element by element it was eight 2-byte stores
// and four byte permutes a lane, in the state update's shadow where the out
// tile's global stores wait for them.
__device__ __forceinline__ void stage_out_tile(const FragC (&o)[2], __nv_bfloat16 (*out_tile)[kLdT], int lane) {
  const int block = lane >> 3;
  cute::SM90_U16x8_STSM_T::copy(
      pack_bf16(o[0].x[0], o[0].x[1]), pack_bf16(o[0].x[2], o[0].x[3]), pack_bf16(o[1].x[0], o[1].x[1]),
      pack_bf16(o[1].x[2], o[1].x[3]),
      *reinterpret_cast<cute::uint128_t*>(&out_tile[8 * (block >> 1) + (lane & 7)][8 * (block & 1)]));
}

// Waits for the state update's wgmma before S is read again.
template <int kDim>
__device__ __forceinline__ void finish_state_update(StateRows& S) {
  wgmma_wait_all();
  fence_accumulators(key_tiles<kDim>(S));
}

// One chunk for the warp's 16 rows of V, columns vw..vw+15 of the CTA's slice
// `v` (row stride ldv); the warp's outᵀ tile goes to its staging tile out_tile.
// The four warps of a warpgroup (64 rows of V) run the two products with the
// state as wgmma (wgmma.cuh); the small 16x16 products stay mma.sync, per warp.
// Uᵀ and K_res enter the state update as bf16 hi + lo: a single bf16 rounding of
// either is the largest term of the state's error (docs/design.md, "Accuracy").
// kDim = 64: the products run over the first 64 keys only (the others are zero,
// shared_storage.cuh): four k16 steps, and an n64 state update on eight tiles.
// The caller's work that the next chunk does not wait for runs in the shadows
// of the two products, off the chain of dependent steps: during_first() (the
// kernel: a later chunk's loads) while the first runs, during_update() (the out
// tile's stores, staged by then) while the state update runs. Issued before the
// step, they held it back by 4 % where one chain bounds the call (docs/perf-log.md).
// kStagedOut = false (the segment scan's pass 1 with outputs by superposition):
// the out tile is not staged as bf16; during_update(o) receives it in fp32.
struct NoWork {
  __device__ __forceinline__ void operator()() const {}
};
template <int kDim, bool kStagedOut = true, class First = NoWork, class Update = NoWork>
__device__ __forceinline__ void recurrence_step(StateRows& S, const ChunkOperands& ops, const uint16_t* v, int ldv,
                                                int vw, __nv_bfloat16 (*out_tile)[kLdT], int lane,
                                                const First& during_first = First{},
                                                const Update& during_update = Update{}) {
  constexpr int kKeySteps = kDim / 16;
  const int t = lane & 3;
  // [−S wᵀ | S Q_decᵀ] (16 V rows x 32: tokens of −w, then of Q_dec), from the
  // state before this chunk's update: kDim / 16 k16 steps over the keys.
  FragC uo[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) zero(uo[i]);
  FragA sa[kKeySteps];
#pragma unroll
  for (int kk = 0; kk < kKeySteps; ++kk) sa[kk] = to_a_bf16(S.tile[2 * kk], S.tile[2 * kk + 1]);
  const uint64_t wq = sw128_descriptor(ops.wq, 16, kSw128GroupBytes);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeySteps; ++kk) {
    constexpr uint32_t kKStepBytes = 16 * 2;  // 16 keys of a 128-byte swizzled row
    wgmma_m64n32k16(uo, sa[kk], sw128_descriptor_advance(wq, (kk / 4) * kSw128AtomBytes + (kk % 4) * kKStepBytes));
  }
  wgmma_commit();
  // uᵀ's state-free part Vᵀ A_wᵀ with A_w = hi + lo (v is exact in bf16), while the wgmma runs.
  // Its operands are read before during_first issues the caller's copies: after
  // them, an ldmatrix whose destination registers were the copies' address
  // registers waited for the copies to leave the memory pipeline.
  const FragA vt = load_a_trans(v, ldv, 0, vw, lane);
  FragB aw_hi[2], aw_lo[2];
  ldsm_b2_tile16(ops.aw_hi, lane, aw_hi[0], aw_hi[1]);
  ldsm_b2_tile16(ops.aw_lo, lane, aw_lo[0], aw_lo[1]);
  during_first();
  FragC uv[2];
  zero(uv[0]);
  zero(uv[1]);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    mma_bf16(uv[nt], vt, aw_hi[nt]);
    mma_bf16(uv[nt], vt, aw_lo[nt]);
  }
  FragB m_hi[2], m_lo[2];
  ldsm_b2_tile16(ops.mqk_hi, lane, m_hi[0], m_hi[1]);
  ldsm_b2_tile16(ops.mqk_lo, lane, m_lo[0], m_lo[1]);
  wgmma_wait_all();
  fence_accumulators(uo);
  FragC o[2] = {uo[2], uo[3]};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) uo[nt].x[e] += uv[nt].x[e];
  FragA ua_hi, ua_lo;
  split_a_bf16(uo[0], uo[1], ua_hi, ua_lo);
  // S = S·diag(2^G_last) + Uᵀ K_res, hi·hi + lo·hi + hi·lo
#pragma unroll
  for (int j = 0; j < kDim / 8; ++j) {
    const float2 dl = *reinterpret_cast<const float2*>(&ops.decay_last[8 * j + 2 * t]);
    S.tile[j].x[0] *= dl.x;
    S.tile[j].x[1] *= dl.y;
    S.tile[j].x[2] *= dl.x;
    S.tile[j].x[3] *= dl.y;
  }
  // MN-major: LBO = the stride of the 64-key atoms, SBO = of the 8-token groups.
  const uint64_t kres_hi = sw128_descriptor(ops.kres_hi, kSw128AtomBytes, kSw128GroupBytes);
  static_assert(offsetof(ChunkOperands, kres_lo) == offsetof(ChunkOperands, kres_hi) + sizeof(ops.kres_hi),
                "K_res lo follows K_res hi");
  const uint64_t kres_lo = sw128_descriptor_advance(kres_hi, sizeof(ops.kres_hi));
  wgmma_fence();
  if constexpr (kDim == kHeadDim) {
    wgmma_m64n128k16_bt(S.tile, ua_hi, kres_hi);
    wgmma_m64n128k16_bt(S.tile, ua_lo, kres_hi);
    wgmma_m64n128k16_bt(S.tile, ua_hi, kres_lo);
  } else {
    static_assert(kDim == 64, "one 64-column swizzle atom");
    wgmma_m64n64k16_bt(key_tiles<kDim>(S), ua_hi, kres_hi);
    wgmma_m64n64k16_bt(key_tiles<kDim>(S), ua_lo, kres_hi);
    wgmma_m64n64k16_bt(key_tiles<kDim>(S), ua_hi, kres_lo);
  }
  wgmma_commit();
  // out += Uᵀ Mqkᵀ, hi·hi + lo·hi + hi·lo, while the state update runs
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    mma_bf16(o[nt], ua_hi, m_hi[nt]);
    mma_bf16(o[nt], ua_lo, m_hi[nt]);
    mma_bf16(o[nt], ua_hi, m_lo[nt]);
  }
  if constexpr (kStagedOut) {
    stage_out_tile(o, out_tile, lane);
    __syncwarp();  // the staged tile, before during_update reads it
    during_update();
  } else {
    during_update(o);
  }
  finish_state_update<kDim>(S);
}


}  // namespace flashkda::sm90
