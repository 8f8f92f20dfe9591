// The per-element gate and beta formulas of the contract (flashkda.h), shared by
// the CPU backends (float64 oracle and decode, fp32 chunked) so that each form of
// g and beta means the same thing everywhere, and the constants kCuda's kernels
// use for the same purposes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/bf16.h"
#include "flashkda/flashkda.h"

namespace flashkda {

// exp(A_log) overflows fp32 above A_log ~ 88.7, and inf · (g + dt_bias) is NaN
// where g + dt_bias is 0, where the contract's gate is sigmoid(0). Clamped to
// 2^100 it stays finite, and the gate's sigmoid is already saturated at that
// scale for every |g + dt_bias| above ~2^-95, so only the infinities change.
// A NaN A_log stays NaN (it reaches every output of its head, as documented).
constexpr float kMaxGateScale = 0x1p100f;

inline constexpr float clamp_gate_scale(float exp_a) { return exp_a > kMaxGateScale ? kMaxGateScale : exp_a; }
// The float64 backends: exp(A_log) overflows double above A_log ~ 709.8. Clamped
// to the largest double, a zero g + dt_bias still gives sigmoid(0), and every
// other product is as saturated as the infinity made it: nothing else changes.
inline constexpr double clamp_gate_scale(double exp_a) {
  return exp_a > std::numeric_limits<double>::max() ? std::numeric_limits<double>::max() : exp_a;
}

// log2(e): the fp32 backends work with base-2 exponents (exp2 is the GPU's
// native exponential), γ = a·log2(e) for the natural-log decay a.
constexpr float kLog2e = 1.4426950408889634f;

// The chunked algorithm (spec section 3) forms 2^G and 2^-G from the base-2
// prefix sums G of γ over a 16-token chunk (G <= 0). The safe gate bounds them,
// |G| <= 16·5·log2(e) = 115.4 (lower_bound >= -5), and 2^±116 are normal fp32
// numbers (exponents -126..127), so a chunk whose G stays within [-116, 0] on
// every channel runs the plain algorithm, which covers every safe-gate chunk.
// Log decays (GateForm::kLogDecay) are unbounded: a chunk with any G below
// -kMaxChunkDecayLog2 takes the pairwise path, which forms only 2^(G_i - G_j)
// for i >= j (<= 1) and never 2^-G (docs/design.md, "Gate forms").
constexpr float kMaxChunkDecayLog2 = 116.f;

// Element i of a g or beta tensor of `dtype` (kBF16 or kFP32), as a float.
inline float load_gate_input(const void* data, DType dtype, int64_t i) {
  if (dtype == DType::kFP32) {
    float x;
    std::memcpy(&x, static_cast<const char*>(data) + i * int64_t{4}, sizeof x);
    return x;
  }
  return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
}

template <class F>
inline F sigmoid(F x) {
  return F(1) / (F(1) + std::exp(-x));
}

// The safe gate (GateForm::kSafeGate): bound·sigmoid(gate_scale·(g + dt_bias)),
// gate_scale = exp(A_log). With bound = lower_bound it is the natural-log decay a
// (the float64 backends); with bound = lower_bound·log2(e), folded in once per
// head, it is γ in base 2 (kCpuChunked).
template <class F>
inline F safe_gate(F g, F dt_bias, F gate_scale, F bound) {
  return bound * sigmoid(gate_scale * (g + dt_bias));
}

// A given natural-log decay (GateForm::kLogDecay) in base 2. Values below what
// fp32 can exponentiate (even -inf: a decay of exactly 0) are kept as they are:
// the pairwise path of the chunked algorithm sums them without cancellation.
inline float log_decay_log2(float a) { return a * kLog2e; }

// The delta rule's coefficient b: sigmoid(beta) for a logit, beta itself when the
// caller passes it already activated (beta_is_probability, fla's
// use_beta_sigmoid_in_kernel=False).
template <class F>
inline F beta_coefficient(F beta, bool is_probability) {
  return is_probability ? beta : sigmoid(beta);
}

}  // namespace flashkda
