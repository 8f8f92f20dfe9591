// The CPU backends. Arguments reaching them have passed flashkda::validate();
// every pointer is a host pointer.
#pragma once
#include "flashkda/flashkda.h"

namespace flashkda::cpu {

// The oracle: the token-by-token recurrence of the contract in float64.
// `out_unrounded` (optional, host, same shape as out): also receives out before
// its bf16 rounding, so that backends are judged against the oracle itself
// (spec section 2) and not against a second rounding of it.
Status reference_forward_f64(const ForwardArgs& args, float* out_unrounded = nullptr);

// The chunk-16 algorithm in fp32 with the kernels' decomposition (base-2 exponents,
// L and Mqk, the inverse by forward substitution, the WY form), parallel over
// (sequence, value head). num_threads <= 0: std::thread::hardware_concurrency().
// `out_unrounded` as for the oracle: out before its bf16 rounding.
Status chunked_forward_f32(const ForwardArgs& args, int num_threads = 0, float* out_unrounded = nullptr);

// Decode (flashkda::decode on the CPU backends): the token recurrence in float64
// on each sequence's pooled state, written back in place or to the out pool.
Status decode_f64(const DecodeArgs& args);

// INV = (I + L)^{-1} for a strictly lower-triangular 16x16 L (row-major), by
// fp32 forward substitution: exact to fp32 rounding for every |L_ij| <= 1. The
// kernel's warp-0 inverse (src/sm90/kernel/unit_lower_inverse.cuh) is the same algorithm.
void unit_lower_inverse_16(const float* L, float* inv);

}  // namespace flashkda::cpu
