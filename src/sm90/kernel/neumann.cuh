// (I + L)^{-1} of a strictly lower-triangular 16x16 L, by one warp in registers.
//
// With N = −L, N^16 = 0 and (I + L)^{-1} = Σ_{j<16} N^j = (I + N)(I + N²)(I + N⁴)(I + N⁸):
// three squarings N → N² → N⁴ → N⁸ and three products INV ← INV + INV·N^(2^j),
// six 16x16 products = twelve mma.m16n8k16. Operands are fp16 (the entries of
// INV and of the powers are bounded by 1 in practice, and fp16 carries 3 more
// mantissa bits than bf16); accumulation and the running INV stay fp32, which
// is more accurate than the published design's fp16 accumulators at the same
// instruction count. Transposes for the B operand are movmatrix (a_to_b).
#pragma once
#include "sm90/kernel/fragments.cuh"

namespace flashkda::sm90 {

// P = X · Y for 16x16 X, Y held as fp16 A fragments; Y's B fragments given.
__device__ __forceinline__ void matmul16(FragC (&p)[2], const FragA& x, const FragB& y_n0, const FragB& y_n1) {
  zero(p[0]);
  zero(p[1]);
  mma_f16(p[0], x, y_n0);
  mma_f16(p[1], x, y_n1);
}

// inv ← inv + inv · P, with P's B fragments given.
__device__ __forceinline__ void accumulate_product(FragC (&inv)[2], const FragB& p_n0, const FragB& p_n1) {
  const FragA inv_a = to_a_f16(inv[0], inv[1]);
  mma_f16(inv[0], inv_a, p_n0);
  mma_f16(inv[1], inv_a, p_n1);
}

// n = −L as two fp32 C tiles (columns 0-7, 8-15); returns INV the same way.
__device__ __forceinline__ void neumann_inverse(const FragC (&n)[2], FragC (&inv)[2], int lane) {
  const int g = lane >> 2, t = lane & 3;
  // INV = I + N
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 8 * nt + 2 * t + (e & 1);
      inv[nt].x[e] = n[nt].x[e] + (row == col ? 1.f : 0.f);
    }
  FragA pow_a = to_a_f16(n[0], n[1]);  // N^(2^j) as A operand
  FragB pow_b0, pow_b1;                // and as B operand
  a_to_b(pow_a, pow_b0, pow_b1);
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    FragC sq[2];
    matmul16(sq, pow_a, pow_b0, pow_b1);  // N^(2^(j+1))
    pow_a = to_a_f16(sq[0], sq[1]);
    a_to_b(pow_a, pow_b0, pow_b1);
    accumulate_product(inv, pow_b0, pow_b1);
  }
}

}  // namespace flashkda::sm90
