// The oracle: the token-by-token KDA recurrence of the contract (spec section 1)
// in float64 on the bf16 inputs. Deliberately literal: one token at a time, the
// six steps of the contract in order, no algebraic rearrangement.
//
// Parallel over (sequence, value head) pairs; every pair is independent and owns
// disjoint slices of `out` and `final_state`.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/bf16.h"
#include "common/sequences.h"
#include "cpu/cpu_backends.h"
#include "cpu/parallel.h"

namespace flashkda::cpu {
namespace {

inline double sigmoid_f64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One (sequence, value head): the recurrence over the tokens of `span`.
void reference_one(const ForwardArgs& args, const SequenceSpan& span, int64_t n, int64_t hv, float* out_unrounded) {
  const int64_t H = args.num_heads;
  const int64_t HV = value_heads(args);
  const int64_t K = args.head_dim_k;
  const int64_t V = args.head_dim_v;
  const int64_t h = hv / (HV / H);  // q/k head of this value head (GVA)

  const auto* q = static_cast<const uint16_t*>(args.q);
  const auto* k = static_cast<const uint16_t*>(args.k);
  const auto* v = static_cast<const uint16_t*>(args.v);
  const auto* g = static_cast<const uint16_t*>(args.g);
  const auto* beta = static_cast<const uint16_t*>(args.beta);
  auto* out = static_cast<uint16_t*>(args.out);

  // S [V][K], value-first, starts at initial_state[n][hv] (or zero).
  std::vector<double> S(static_cast<size_t>(V * K), 0.0);
  const int64_t state_off = (n * HV + hv) * V * K;
  if (args.initial_state != nullptr && args.initial_state_dtype == DType::kFP32) {
    const float* s0 = static_cast<const float*>(args.initial_state) + state_off;
    for (int64_t i = 0; i < V * K; ++i) S[i] = s0[i];
  } else if (args.initial_state != nullptr && args.initial_state_dtype == DType::kBF16) {
    const uint16_t* s0 = static_cast<const uint16_t*>(args.initial_state) + state_off;
    for (int64_t i = 0; i < V * K; ++i) S[i] = bf16_to_float(s0[i]);
  }

  const double A = std::exp(static_cast<double>(args.A_log[hv]));
  const float* dt_bias = args.dt_bias + hv * K;
  const double lower_bound = args.lower_bound;
  const double scale = args.scale;

  std::vector<double> qn(K), kn(K), decay(K), vv(V);
  for (int64_t t = span.token_begin; t < span.token_begin + span.length; ++t) {
    const uint16_t* qt = q + (t * H + h) * K;
    const uint16_t* kt = k + (t * H + h) * K;
    const uint16_t* vt = v + (t * HV + hv) * V;
    const uint16_t* gt = g + (t * HV + hv) * K;

    // 1. L2 normalisation, eps inside the root.
    double qss = 0, kss = 0;
    for (int64_t d = 0; d < K; ++d) {
      qn[d] = bf16_to_float(qt[d]);
      kn[d] = bf16_to_float(kt[d]);
      qss += qn[d] * qn[d];
      kss += kn[d] * kn[d];
    }
    const double qinv = 1.0 / std::sqrt(qss + 1e-6);
    const double kinv = 1.0 / std::sqrt(kss + 1e-6);
    for (int64_t d = 0; d < K; ++d) {
      qn[d] *= qinv;
      kn[d] *= kinv;
    }
    // 2. Gate: a = lower_bound · sigmoid(exp(A_log) · (g + dt_bias)); decay = exp(a).
    for (int64_t d = 0; d < K; ++d) {
      const double x = A * (static_cast<double>(bf16_to_float(gt[d])) + dt_bias[d]);
      decay[d] = std::exp(lower_bound * sigmoid_f64(x));
    }
    // 3. b = sigmoid(beta).
    const double b = sigmoid_f64(bf16_to_float(beta[t * HV + hv]));
    for (int64_t e = 0; e < V; ++e) vv[e] = bf16_to_float(vt[e]);

    uint16_t* ot = out + (t * HV + hv) * V;
    for (int64_t e = 0; e < V; ++e) {
      double* row = S.data() + e * K;
      // 4. S ← S · diag(exp(a)).
      for (int64_t d = 0; d < K; ++d) row[d] *= decay[d];
      // 5. S ← S + b · (v − S k̂) k̂ᵀ (row e of it).
      double sk = 0;
      for (int64_t d = 0; d < K; ++d) sk += row[d] * kn[d];
      const double coef = b * (vv[e] - sk);
      for (int64_t d = 0; d < K; ++d) row[d] += coef * kn[d];
      // 6. o = scale · S q̂ with the updated state.
      double o = 0;
      for (int64_t d = 0; d < K; ++d) o += row[d] * qn[d];
      ot[e] = float_to_bf16(static_cast<float>(scale * o));
      if (out_unrounded != nullptr) out_unrounded[(t * HV + hv) * V + e] = static_cast<float>(scale * o);
    }
  }

  if (args.final_state != nullptr && args.final_state_dtype == DType::kFP32) {
    float* s1 = static_cast<float*>(args.final_state) + state_off;
    for (int64_t i = 0; i < V * K; ++i) s1[i] = static_cast<float>(S[i]);
  } else if (args.final_state != nullptr && args.final_state_dtype == DType::kBF16) {
    uint16_t* s1 = static_cast<uint16_t*>(args.final_state) + state_off;
    for (int64_t i = 0; i < V * K; ++i) s1[i] = float_to_bf16(static_cast<float>(S[i]));
  }
}

}  // namespace

Status reference_forward_f64(const ForwardArgs& args, float* out_unrounded) {
  const int64_t H = args.num_heads;
  const int64_t HV = value_heads(args);
  if (H <= 0 || HV <= 0 || HV % H != 0 || args.head_dim_k <= 0 || args.head_dim_v <= 0)
    return Status::Invalid("reference_forward_f64: bad head counts or head dims");
  const std::vector<SequenceSpan> spans = sequence_spans(args, args.cu_seqlens);
  const int64_t tasks = static_cast<int64_t>(spans.size()) * HV;

  // Longest sequences are not reordered: the oracle is about clarity, and the
  // (n, hv) pairs are handed out one at a time, which balances well enough.
  parallel_for(tasks, 0, [&](int64_t i) {
    reference_one(args, spans[static_cast<size_t>(i / HV)], i / HV, i % HV, out_unrounded);
  });
  return Status::Ok();
}

}  // namespace flashkda::cpu
