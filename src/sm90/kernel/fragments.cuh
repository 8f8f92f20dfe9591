// Register fragments of mma.m16n8k16 and the few operations on them the kernel needs.
//
// Thread `lane` of a warp has group g = lane / 4 and thread-in-group t = lane % 4.
//   A (16x16, row-major):  x0 = (g, 2t..2t+1)   x1 = (g+8, 2t..)   x2 = (g, 2t+8..)   x3 = (g+8, 2t+8..)
//   B (16x8, "col"):       x0 = rows k = 2t..2t+1 of column n = g;   x1 = rows k = 2t+8..2t+9
//   C (16x8, fp32):        x0,x1 = (g, 2t..2t+1)   x2,x3 = (g+8, 2t..2t+1)
// Two C tiles side by side (columns 0-7 and 8-15) hold a 16x16 result whose
// bf16/fp16 packing is exactly an A fragment: that is how results feed the next
// product without leaving registers (FlashAttention does the same with P).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

struct FragA { uint32_t x[4]; };
struct FragB { uint32_t x[2]; };
struct FragC { float x[4]; };

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(FragC& d, const FragA& a, const FragB& b) {
  cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(d.x[0], d.x[1], d.x[2], d.x[3], a.x[0], a.x[1], a.x[2], a.x[3],
                                            b.x[0], b.x[1], d.x[0], d.x[1], d.x[2], d.x[3]);
}
__device__ __forceinline__ void mma_f16(FragC& d, const FragA& a, const FragB& b) {
  cute::SM80_16x8x16_F32F16F16F32_TN::fma(d.x[0], d.x[1], d.x[2], d.x[3], a.x[0], a.x[1], a.x[2], a.x[3],
                                          b.x[0], b.x[1], d.x[0], d.x[1], d.x[2], d.x[3]);
}

__device__ __forceinline__ void zero(FragC& c) { c.x[0] = c.x[1] = c.x[2] = c.x[3] = 0.f; }

// A fragment from a row-major 16-bit matrix in shared memory (row stride `ld` elements).
template <typename T>
__device__ __forceinline__ FragA load_a(const T* m, int ld, int row0, int col0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const T* p = m + (row0 + g) * ld + col0 + 2 * t;
  FragA a;
  a.x[0] = *reinterpret_cast<const uint32_t*>(p);
  a.x[1] = *reinterpret_cast<const uint32_t*>(p + 8 * ld);
  a.x[2] = *reinterpret_cast<const uint32_t*>(p + 8);
  a.x[3] = *reinterpret_cast<const uint32_t*>(p + 8 * ld + 8);
  return a;
}

// A fragment of a 16x16 block of a row-major matrix: one ldmatrix.x4 (rows 16-byte aligned).
template <typename T>
__device__ __forceinline__ FragA ldsm_a(const T* m, int ld, int row0, int col0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  const T* p = m + (row0 + r + 8 * (i & 1)) * ld + col0 + 8 * (i >> 1);
  FragA a;
  cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), a.x[0], a.x[1], a.x[2], a.x[3]);
  return a;
}

// ldsm_a for a matrix stored with sw128_offset (shared_storage.cuh).
__device__ __forceinline__ FragA ldsm_a_sw128(const __nv_bfloat16* m, int row0, int col0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  const __nv_bfloat16* p = m + sw128_offset(row0 + r + 8 * (i & 1), col0 + 8 * (i >> 1));
  FragA a;
  cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), a.x[0], a.x[1], a.x[2], a.x[3]);
  return a;
}

// B fragments of two adjacent n-tiles (n0..n0+7 and n0+8..n0+15) over k0..k0+15,
// from shared memory holding B transposed ([n][k], rows 16-byte aligned): one ldmatrix.x4.
template <typename T>
__device__ __forceinline__ void ldsm_b2(const T* m, int ld, int n0, int k0, int lane, FragB& b0, FragB& b1) {
  const int i = lane >> 3, r = lane & 7;
  const T* p = m + (n0 + r + 8 * (i >> 1)) * ld + k0 + 8 * (i & 1);
  cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), b0.x[0], b0.x[1], b1.x[0], b1.x[1]);
}

// B fragments of two adjacent n-tiles (n0..n0+7, n0+8..n0+15) over k = 0..15 from
// shared memory holding B itself row-major ([k][n], rows 16-byte aligned): one
// transposing ldmatrix.x4.
template <typename T>
__device__ __forceinline__ void ldsm_b2_trans(const T* m, int ld, int n0, int lane, FragB& b0, FragB& b1) {
  const int i = lane >> 3, r = lane & 7;
  const T* p = m + (r + 8 * (i & 1)) * ld + n0 + 8 * (i >> 1);
  cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(p), b0.x[0], b0.x[1], b1.x[0], b1.x[1]);
}

// ldsm_b2 for a 16x16 matrix stored with tile16_offset (shared_storage.cuh).
__device__ __forceinline__ void ldsm_b2_tile16(const __nv_bfloat16* m, int lane, FragB& b0, FragB& b1) {
  const int i = lane >> 3, r = lane & 7;
  const __nv_bfloat16* p = m + tile16_offset(r + 8 * (i >> 1), 8 * (i & 1));
  cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), b0.x[0], b0.x[1], b1.x[0], b1.x[1]);
}

// A fragment of Xᵀ for a 16x16 block of a row-major [k][m] matrix X in shared
// memory (rows = k, 16-byte aligned rows): ldmatrix with transpose.
template <typename T>
__device__ __forceinline__ FragA load_a_trans(const T* m, int ld, int k0, int m0, int lane) {
  const int mat = lane >> 3, r = lane & 7;
  const T* p = m + (k0 + r + 8 * (mat >> 1)) * ld + m0 + 8 * (mat & 1);
  FragA a;
  cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(p), a.x[0], a.x[1], a.x[2], a.x[3]);
  return a;
}

// Two C tiles (columns 0-7, 8-15) of a 16x16 fp32 result, as a bf16 / fp16 A fragment.
__device__ __forceinline__ FragA to_a_bf16(const FragC& c0, const FragC& c1) {
  return {{pack_bf16(c0.x[0], c0.x[1]), pack_bf16(c0.x[2], c0.x[3]), pack_bf16(c1.x[0], c1.x[1]),
           pack_bf16(c1.x[2], c1.x[3])}};
}
__device__ __forceinline__ FragA to_a_f16(const FragC& c0, const FragC& c1) {
  return {{pack_f16(c0.x[0], c0.x[1]), pack_f16(c0.x[2], c0.x[3]), pack_f16(c1.x[0], c1.x[1]),
           pack_f16(c1.x[2], c1.x[3])}};
}

// The same 16x16 result as hi + lo bf16 A fragments (hi = bf16(x), lo = bf16(x − hi)).
__device__ __forceinline__ void split_a_bf16(const FragC& c0, const FragC& c1, FragA& hi, FragA& lo) {
  hi = to_a_bf16(c0, c1);
  const FragC* c[2] = {&c0, &c1};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const FragC& src = *c[i >> 1];
    const int e = 2 * (i & 1);
    lo.x[i] = pack_bf16(src.x[e] - __uint_as_float(hi.x[i] << 16),
                        src.x[e + 1] - __uint_as_float(hi.x[i] & 0xffff0000u));
  }
}

// The B fragments (n-tiles 0 and 1) of a 16x16 matrix held as an A fragment,
// by transposing its four 8x8 blocks in the register file (movmatrix).
__device__ __forceinline__ void a_to_b(const FragA& a, FragB& b_n0, FragB& b_n1) {
  cute::SM75_U32x1_MOVM_T::copy(a.x[0], b_n0.x[0]);
  cute::SM75_U32x1_MOVM_T::copy(a.x[1], b_n0.x[1]);
  cute::SM75_U32x1_MOVM_T::copy(a.x[2], b_n1.x[0]);
  cute::SM75_U32x1_MOVM_T::copy(a.x[3], b_n1.x[1]);
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Accurate logistic function: 1 / (1 + 2^(-x·log2 e)). Saturates cleanly to 0 and 1.
// (tanh.approx would be one MUFU op cheaper but carries ~2^-11 relative error,
// which the prefix sum accumulates over a chunk into the decays: docs/design.md,
// "Accuracy".)
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1/sqrt(x) for a normal x: the MUFU op alone (rsqrtf adds a rescue of subnormal
// inputs, five more instructions).
__device__ __forceinline__ float rsqrt_approx(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float sigmoid(float x) {
  return rcp_approx(1.f + ex2_approx(-1.4426950408889634f * x));
}

}  // namespace flashkda::sm90
