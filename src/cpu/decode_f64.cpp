// CPU decode: for each sequence with a non-negative pool index, the contract's
// token recurrence (spec section 1) in float64 on its pooled state; out and the
// state written back in the state dtype. It is also the oracle of the GPU decode.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/gate.h"
#include "common/sequences.h"
#include "cpu/cpu_backends.h"
#include "cpu/parallel.h"

namespace flashkda::cpu {
namespace {

double load_state(const void* pool, DType t, int64_t i) {
  return t == DType::kFP32 ? static_cast<const float*>(pool)[i] : bf16_to_float(static_cast<const uint16_t*>(pool)[i]);
}
void store_state(void* pool, DType t, int64_t i, double x) {
  if (t == DType::kFP32) static_cast<float*>(pool)[i] = static_cast<float>(x);
  else static_cast<uint16_t*>(pool)[i] = float_to_bf16(static_cast<float>(x));
}

void decode_one(const DecodeArgs& a, int64_t n, int64_t hv) {
  const int64_t H = a.num_heads, HV = a.num_v_heads > 0 ? a.num_v_heads : H;
  const int64_t K = a.head_dim_k, V = a.head_dim_v, h = hv / (HV / H);
  // [N] indices, or [N, C] with speculative verify: the starting slot is column
  // num_accepted_tokens[n] − 1 (0 without it) and token t's state goes to column t.
  const int64_t C = speculative_verify(a) ? a.verify_slots : 1;
  auto index = [&](const void* p, int64_t i) { return index_at(p, a.index_type, i); };
  const int64_t start = a.num_accepted_tokens != nullptr ? index(a.num_accepted_tokens, n) - 1 : 0;
  const int64_t slot = index(a.state_indices, n * C + start);
  if (slot < 0) return;  // padding entry: nothing is read or written
  const int64_t stride = a.pool_stride > 0 ? a.pool_stride : HV * V * K;
  const int64_t out_stride = a.state_out_stride > 0 ? a.state_out_stride : stride;
  const int64_t t0 = a.cu_seqlens != nullptr ? a.cu_seqlens[n] : n * a.tokens_per_seq;
  const int64_t t1 = a.cu_seqlens != nullptr ? a.cu_seqlens[n + 1] : t0 + a.tokens_per_seq;

  const auto* q = static_cast<const uint16_t*>(a.q);
  const auto* k = static_cast<const uint16_t*>(a.k);
  const auto* v = static_cast<const uint16_t*>(a.v);
  auto* out = static_cast<uint16_t*>(a.out);

  std::vector<double> S(static_cast<size_t>(V * K));
  const int64_t base = slot * stride + hv * V * K;
  for (int64_t i = 0; i < V * K; ++i) S[i] = load_state(a.state_pool, a.state_dtype, base + i);

  std::vector<double> qn(K), kn(K), decay(K);
  // The safe gate's per-head scale (A_log may be null with a log decay).
  const bool log_decay = a.gate_form == GateForm::kLogDecay;
  const double exp_A = log_decay ? 0.0 : clamp_gate_scale(std::exp(static_cast<double>(a.A_log[hv])));
  for (int64_t t = t0; t < t1; ++t) {
    double qss = 0, kss = 0;
    for (int64_t d = 0; d < K; ++d) {
      qn[d] = bf16_to_float(q[(t * H + h) * K + d]);
      kn[d] = bf16_to_float(k[(t * H + h) * K + d]);
      qss += qn[d] * qn[d];
      kss += kn[d] * kn[d];
    }
    const double qi = 1.0 / std::sqrt(qss + 1e-6), ki = 1.0 / std::sqrt(kss + 1e-6);
    for (int64_t d = 0; d < K; ++d) {
      qn[d] *= qi;
      kn[d] *= ki;
      const double g = load_gate_input(a.g, a.g_dtype, (t * HV + hv) * K + d);
      decay[d] = std::exp(log_decay ? g : safe_gate<double>(g, a.dt_bias[hv * K + d], exp_A, a.lower_bound));
    }
    const double beta_t = load_gate_input(a.beta, a.beta_dtype, t * HV + hv);
    const double b = beta_coefficient(beta_t, a.beta_is_probability);
    for (int64_t e = 0; e < V; ++e) {
      double* row = S.data() + e * K;
      double sk = 0;
      for (int64_t d = 0; d < K; ++d) {
        row[d] *= decay[d];
        sk += row[d] * kn[d];
      }
      const double coef = b * (bf16_to_float(v[(t * HV + hv) * V + e]) - sk);
      double o = 0;
      for (int64_t d = 0; d < K; ++d) {
        row[d] += coef * kn[d];
        o += row[d] * qn[d];
      }
      out[(t * HV + hv) * V + e] = float_to_bf16(static_cast<float>(a.scale * o));
    }
    if (a.per_token_states != nullptr)
      for (int64_t i = 0; i < V * K; ++i) store_state(a.per_token_states, a.state_dtype, (t * HV + hv) * V * K + i, S[i]);
    if (C > 1) {  // verify: this token's state to its own slot
      const int64_t s = index(a.state_indices, n * C + (t - t0));
      if (s >= 0)
        for (int64_t i = 0; i < V * K; ++i) store_state(a.state_pool, a.state_dtype, s * stride + hv * V * K + i, S[i]);
    }
  }
  if (C > 1) return;  // the last token's state went to its slot above
  void* dst = a.state_out_pool != nullptr ? a.state_out_pool : a.state_pool;
  const int64_t dst_base = slot * out_stride + hv * V * K;
  for (int64_t i = 0; i < V * K; ++i) store_state(dst, a.state_dtype, dst_base + i, S[i]);
}

// Whether two sequences name one slot anywhere in state_indices (every column of
// a verify call's [N, C] indices, so also the slots only written). Such a call
// runs the sequences one after the other, as the API promises for the CPU
// backends: run as independent tasks, they raced on the slot and the result
// changed from call to call.
bool shares_a_slot(const DecodeArgs& a) {
  const int64_t C = speculative_verify(a) ? a.verify_slots : 1;
  std::vector<std::pair<int64_t, int64_t>> uses;  // (slot, sequence)
  uses.reserve(static_cast<size_t>(a.num_seqs * C));
  for (int64_t n = 0; n < a.num_seqs; ++n)
    for (int64_t j = 0; j < C; ++j) {
      const int64_t slot = index_at(a.state_indices, a.index_type, n * C + j);
      if (slot >= 0) uses.emplace_back(slot, n);
    }
  std::sort(uses.begin(), uses.end());
  for (size_t i = 1; i < uses.size(); ++i)
    if (uses[i].first == uses[i - 1].first && uses[i].second != uses[i - 1].second) return true;
  return false;
}

}  // namespace

Status decode_f64(const DecodeArgs& a) {
  const int64_t HV = a.num_v_heads > 0 ? a.num_v_heads : a.num_heads;
  if (shares_a_slot(a)) {
    // A value head's part of a slot is its own memory: heads stay parallel.
    parallel_for(HV, 0, [&](int64_t hv) {
      for (int64_t n = 0; n < a.num_seqs; ++n) decode_one(a, n, hv);
    });
    return Status::Ok();
  }
  parallel_for(a.num_seqs * HV, 0, [&](int64_t i) { decode_one(a, i / HV, i % HV); });
  return Status::Ok();
}

}  // namespace flashkda::cpu
