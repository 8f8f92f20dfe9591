// The warpgroup MMA (wgmma) forms the recurrence uses: A from registers (the
// state, or Uᵀ, as the same per-warp 16x16 fragments mma.sync takes), B from
// shared memory through a descriptor, D in the mma.sync C-tile layout (warp w of
// the warpgroup holds rows 16w..16w+15; n8-tile j in registers 4j..4j+3). Per
// SM, wgmma moves about twice the MACs per cycle of mma.sync, the limit of the
// recurrence loop (docs/perf-log.md, "wgmma in the recurrence").
//
// B layouts (shared_storage.cuh, sw128_offset): 128-byte swizzle, atoms of 8
// rows x 128 B, 1024-byte aligned, the two 64-column atoms of an 8-row group
// adjacent (groups 2048 B apart). Descriptor: start address, LBO, SBO (bytes,
// all >> 4), swizzle mode 1 (128 B) in bits 62-63.
//   K-major (B = Xᵀ for X [n][k], k contiguous): SBO = 2048, the stride of
//     8-row groups; LBO unused. Key step kk starts (kk / 4) atoms and
//     (kk % 4) · 32 bytes further.
//   MN-major (B = X for X [k][n], n contiguous; transposed flag set):
//     LBO = 1024, the stride of 64-column atoms; SBO = 2048, of 8-row groups.
// The layouts and the fragment mapping were checked against a float64 product
// on the H200 before use (the GPU tests compare every result to the oracle).
#pragma once
#include <cstdint>

#include "sm90/kernel/fragments.cuh"

namespace flashkda::sm90 {

__device__ __forceinline__ uint64_t sw128_descriptor(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

// The descriptor of the operand `bytes` further on (16-byte multiples): the
// start address is bits 0-13 in 16-byte units, and a CTA's shared memory (under
// 228 KB) never carries out of them. One add where rebuilding the descriptor
// from the address took a chain of four uniform instructions before each wgmma.
__device__ __forceinline__ uint64_t sw128_descriptor_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Shared-memory writes of the generic proxy (cp.async, st.shared) become
// visible to wgmma's reads only through this fence (then a barrier).
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// After a wait: the compiler must not move reads of these accumulators above it
// (the wgmma asm statements say they write them at issue, not at completion).
template <int N>
__device__ __forceinline__ void fence_accumulators(FragC (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i].x[e])::"memory");
}

// d[0..3] += a · B, B K-major (32 columns: four n8-tiles), one k16 step.
__device__ __forceinline__ void wgmma_m64n32k16(FragC (&d)[4], const FragA& a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;\n"
      : "+f"(d[0].x[0]), "+f"(d[0].x[1]), "+f"(d[0].x[2]), "+f"(d[0].x[3]), "+f"(d[1].x[0]), "+f"(d[1].x[1]),
        "+f"(d[1].x[2]), "+f"(d[1].x[3]), "+f"(d[2].x[0]), "+f"(d[2].x[1]), "+f"(d[2].x[2]), "+f"(d[2].x[3]),
        "+f"(d[3].x[0]), "+f"(d[3].x[1]), "+f"(d[3].x[2]), "+f"(d[3].x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "l"(desc_b));
}

// d[0..1] += a · B, B K-major (16 columns: two n8-tiles), one k16 step.
__device__ __forceinline__ void wgmma_m64n16k16(FragC (&d)[2], const FragA& a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;\n"
      : "+f"(d[0].x[0]), "+f"(d[0].x[1]), "+f"(d[0].x[2]), "+f"(d[0].x[3]), "+f"(d[1].x[0]), "+f"(d[1].x[1]),
        "+f"(d[1].x[2]), "+f"(d[1].x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "l"(desc_b));
}

// d[0..7] += a · B, B MN-major (64 columns, one swizzle atom: eight n8-tiles), one k16 step.
__device__ __forceinline__ void wgmma_m64n64k16_bt(FragC (&d)[8], const FragA& a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0].x[0]), "+f"(d[0].x[1]), "+f"(d[0].x[2]), "+f"(d[0].x[3]), "+f"(d[1].x[0]), "+f"(d[1].x[1]),
        "+f"(d[1].x[2]), "+f"(d[1].x[3]), "+f"(d[2].x[0]), "+f"(d[2].x[1]), "+f"(d[2].x[2]), "+f"(d[2].x[3]),
        "+f"(d[3].x[0]), "+f"(d[3].x[1]), "+f"(d[3].x[2]), "+f"(d[3].x[3]), "+f"(d[4].x[0]), "+f"(d[4].x[1]),
        "+f"(d[4].x[2]), "+f"(d[4].x[3]), "+f"(d[5].x[0]), "+f"(d[5].x[1]), "+f"(d[5].x[2]), "+f"(d[5].x[3]),
        "+f"(d[6].x[0]), "+f"(d[6].x[1]), "+f"(d[6].x[2]), "+f"(d[6].x[3]), "+f"(d[7].x[0]), "+f"(d[7].x[1]),
        "+f"(d[7].x[2]), "+f"(d[7].x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "l"(desc_b));
}

// d[0..15] += a · B, B MN-major (128 columns: sixteen n8-tiles), one k16 step.
__device__ __forceinline__ void wgmma_m64n128k16_bt(FragC (&d)[16], const FragA& a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0].x[0]), "+f"(d[0].x[1]), "+f"(d[0].x[2]), "+f"(d[0].x[3]), "+f"(d[1].x[0]), "+f"(d[1].x[1]),
        "+f"(d[1].x[2]), "+f"(d[1].x[3]), "+f"(d[2].x[0]), "+f"(d[2].x[1]), "+f"(d[2].x[2]), "+f"(d[2].x[3]),
        "+f"(d[3].x[0]), "+f"(d[3].x[1]), "+f"(d[3].x[2]), "+f"(d[3].x[3]), "+f"(d[4].x[0]), "+f"(d[4].x[1]),
        "+f"(d[4].x[2]), "+f"(d[4].x[3]), "+f"(d[5].x[0]), "+f"(d[5].x[1]), "+f"(d[5].x[2]), "+f"(d[5].x[3]),
        "+f"(d[6].x[0]), "+f"(d[6].x[1]), "+f"(d[6].x[2]), "+f"(d[6].x[3]), "+f"(d[7].x[0]), "+f"(d[7].x[1]),
        "+f"(d[7].x[2]), "+f"(d[7].x[3]), "+f"(d[8].x[0]), "+f"(d[8].x[1]), "+f"(d[8].x[2]), "+f"(d[8].x[3]),
        "+f"(d[9].x[0]), "+f"(d[9].x[1]), "+f"(d[9].x[2]), "+f"(d[9].x[3]), "+f"(d[10].x[0]), "+f"(d[10].x[1]),
        "+f"(d[10].x[2]), "+f"(d[10].x[3]), "+f"(d[11].x[0]), "+f"(d[11].x[1]), "+f"(d[11].x[2]), "+f"(d[11].x[3]),
        "+f"(d[12].x[0]), "+f"(d[12].x[1]), "+f"(d[12].x[2]), "+f"(d[12].x[3]), "+f"(d[13].x[0]), "+f"(d[13].x[1]),
        "+f"(d[13].x[2]), "+f"(d[13].x[3]), "+f"(d[14].x[0]), "+f"(d[14].x[1]), "+f"(d[14].x[2]), "+f"(d[14].x[3]),
        "+f"(d[15].x[0]), "+f"(d[15].x[1]), "+f"(d[15].x[2]), "+f"(d[15].x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "l"(desc_b));
}

}  // namespace flashkda::sm90
