// Shared-memory layout of the forward kernel for one CTA.
//
// Operand matrices that feed mma fragments are padded so that the fragment
// loads of a warp (8 rows x 4 words) hit 32 distinct banks:
//   [16][128] rows padded to 136 elements (272 B = 68 words: rows land 4 banks apart),
//   [*][16]   rows padded to 24 elements  (48 B = 12 words: rows land 12 banks apart).
// Both paddings keep every row 16-byte aligned for cp.async / ldmatrix.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashkda::sm90 {

constexpr int kChunk = 16;     // tokens per chunk (see docs/design.md: why 16)
constexpr int kHeadDim = 128;  // K = V handled by this kernel
constexpr int kLdRow = kHeadDim + 8;
constexpr int kLdT = kChunk + 8;
constexpr int kThreads = 256;  // every CTA: 8 warps share the token-parallel work
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 2;     // raw-input ring: chunk c in use, chunk c+1 in flight

template <int kVCta>
struct SharedStorage {
  static constexpr int kLdV = kVCta + 8;

  // Raw inputs of one chunk as loaded from global memory (rows past the end of
  // the sequence are zero-filled by cp.async and contribute nothing).
  struct Stage {
    alignas(16) uint16_t q[kChunk][kHeadDim];
    alignas(16) uint16_t k[kChunk][kHeadDim];
    alignas(16) uint16_t g[kChunk][kHeadDim];
    alignas(16) uint16_t v[kChunk][kLdV];  // this CTA's slice of V
  };
  Stage stage[kStages];

  // Per-chunk operands built by the prologue (see prologue.cuh, chunk_matrices.cuh).
  alignas(16) __nv_bfloat16 kdec[kChunk][kLdRow];   // k̂·2^G           (A of L)
  alignas(16) __nv_bfloat16 kinv[kChunk][kLdRow];   // k̂·2^-G          (B of L and Mqk)
  alignas(16) __nv_bfloat16 qdec[kChunk][kLdRow];   // scale·q̂·2^G     (A of Mqk, B of S·Q_decᵀ)
  alignas(16) __nv_bfloat16 wneg[kChunk][kLdRow];   // −A_w·K_dec       (B of S·wᵀ)
  alignas(16) __half kdecT[kHeadDim][kLdT];         // (k̂·2^G)ᵀ, fp16  (B of w)
  alignas(16) __nv_bfloat16 kresT[kHeadDim][kLdT];  // (k̂·2^(G_last−G))ᵀ (B of the state update)
  alignas(16) __nv_bfloat16 mqk[kChunk][kLdT];      // lower-incl(Q_dec K_invᵀ)
  alignas(16) __half aw_f16[kChunk][kLdT];          // A_w = INV·diag(b), fp16 (A of w)
  alignas(16) __nv_bfloat16 aw_hi[kChunk][kLdT];    // A_w split in two bf16 terms
  alignas(16) __nv_bfloat16 aw_lo[kChunk][kLdT];    //   (B of uᵀ = Vᵀ A_wᵀ)
  alignas(16) __nv_bfloat16 out[kChunk][kLdV];      // staging for coalesced stores

  float rnorm_q[kChunk];     // 1/sqrt(|q|²+1e-6)
  float rnorm_k[kChunk];
  float beta_sig[kChunk];    // sigmoid(beta), 0.5 on pad rows (harmless: their k, v are 0)
  float g_half[kHeadDim];    // prefix of the first 8 rows, handed to the threads of rows 8-15
  float decay_last[kHeadDim];  // 2^G_last
};

}  // namespace flashkda::sm90
