// The gate's scale a = exp(A_log) as the fp32 backends (kCpuChunked, kCuda) form it.
#pragma once

namespace flashkda {

// exp(A_log) overflows fp32 above A_log ~ 88.7, and inf · (g + dt_bias) is NaN
// where g + dt_bias is 0, where the contract's gate is sigmoid(0). Clamped to
// 2^100 it stays finite, and the gate's sigmoid is already saturated at that
// scale for every |g + dt_bias| above ~2^-95, so only the infinities change.
// A NaN A_log stays NaN (it reaches every output of its head, as documented).
constexpr float kMaxGateScale = 0x1p100f;

inline constexpr float clamp_gate_scale(float exp_a) { return exp_a > kMaxGateScale ? kMaxGateScale : exp_a; }

}  // namespace flashkda
