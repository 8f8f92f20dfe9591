// Problems with the general inputs (ForwardArgs::gate_form, g_dtype,
// beta_is_probability, beta_dtype): the spec's distribution with its gate and beta
// activated on the host, as fla's fused_kda_gate and an engine's sigmoid hand them
// over, and log decays far stronger than the safe gate allows.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "tests/common/kda_problem.h"

namespace flashkda::testing {

// The contract's a = lower_bound·sigmoid(exp(A_log)(g + dt_bias)) of every element
// of p's g, in double (the general inputs' g), [B·T, HV, K].
inline std::vector<double> safe_gate_log_decays(const HostProblem& p) {
  std::vector<double> a(p.g.size());
  const int64_t HV = p.HV, K = p.K;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t hv = static_cast<int64_t>(i / K) % HV, d = static_cast<int64_t>(i % K);
    const double x = std::exp(double(p.A_log[hv])) * (double(bf16_to_float(p.g[i])) + double(p.dt_bias[hv * K + d]));
    a[i] = double(p.spec.lower_bound) / (1.0 + std::exp(-x));
  }
  return a;
}

// p with beta as the logit or, when beta_probability, as b = sigmoid(beta), in
// beta_dtype (bf16 or fp32).
inline HostProblem with_beta_form(HostProblem p, bool beta_probability, DType beta_dtype) {
  p.beta_is_probability = beta_probability;
  p.beta_dtype = beta_dtype;
  std::vector<float> b(p.beta.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const float x = bf16_to_float(p.beta[i]);
    b[i] = beta_probability ? static_cast<float>(1.0 / (1.0 + std::exp(-double(x)))) : x;
  }
  if (beta_dtype == DType::kFP32) {
    p.beta_f32 = b;
  } else if (beta_probability) {
    for (size_t i = 0; i < b.size(); ++i) p.beta[i] = float_to_bf16(b[i]);
  }
  return p;
}

// p with g replaced by the log decays `a` (in g_dtype: bf16 or fp32) and beta as
// with_beta_form gives it. A_log and dt_bias stay (the log decay does not read
// them; host_args passes null).
inline HostProblem with_general_inputs(HostProblem p, const std::vector<double>& a, DType g_dtype,
                                       bool beta_probability, DType beta_dtype) {
  p.gate_form = GateForm::kLogDecay;
  p.g_dtype = g_dtype;
  if (g_dtype == DType::kFP32) {
    p.g_f32.assign(a.begin(), a.end());
  } else {
    for (size_t i = 0; i < a.size(); ++i) p.g[i] = float_to_bf16(static_cast<float>(a[i]));
  }
  return with_beta_form(std::move(p), beta_probability, beta_dtype);
}

// p with the raw gate kept (the safe gate), g in g_dtype (fp32: the same values,
// widened exactly), and beta as with_beta_form gives it.
inline HostProblem with_raw_gate_inputs(HostProblem p, DType g_dtype, bool beta_probability, DType beta_dtype) {
  p.g_dtype = g_dtype;
  if (g_dtype == DType::kFP32) p.g_f32 = bf16_vector_to_float(p.g);
  return with_beta_form(std::move(p), beta_probability, beta_dtype);
}

// Log decays of the safe gate with some far stronger: key channel d of token t
// (of the flattened B·T axis) gets `strong` when (d + t / 16) % every == 0, so every
// chunk has channels past 2^-116 and most keep the mild decays; and, where
// whole_chunks, every channel of the tokens of chunks 1, 4, 7, ... as well.
inline std::vector<double> with_strong_decays(const HostProblem& p, std::vector<double> a, double strong, int every,
                                              bool whole_chunks) {
  const int64_t HV = p.HV, K = p.K;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i / (HV * K)), d = static_cast<int64_t>(i % K);
    if ((d + t / 16) % every == 0 || (whole_chunks && (t / 16) % 3 == 1)) a[i] = strong;
  }
  return a;
}

}  // namespace flashkda::testing
