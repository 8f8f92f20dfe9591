// Random KDA problems drawn from the spec's accuracy distribution, held in host
// memory, plus the relative-RMS error metric. Shared by the tests, flashkda-run
// and the benchmark so that all of them judge on the same inputs.
//
// Distribution (spec section 2): q, k = L2-normalised standard normal; v, g,
// beta standard normal; A_log ~ U(0,1); dt_bias ~ U(0,1); lower_bound = -5;
// scale = K^-0.5; initial state 0.1·N(0,1).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/bf16.h"
#include "flashkda/flashkda.h"

namespace flashkda::testing {

struct ProblemSpec {
  int64_t batch = 1;
  int64_t seqlen = 64;               // per batch row; ignored when seqlens is non-empty
  std::vector<int64_t> seqlens;      // non-empty: varlen (B = 1, T = sum)
  int64_t heads = 2;                 // H
  int64_t v_heads = 0;               // HV (0: = H)
  int64_t head_dim = 128;            // K = V
  DType initial_state = DType::kFP32;
  DType final_state = DType::kFP32;
  float lower_bound = -5.f;
};

struct HostProblem {
  ProblemSpec spec;
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0, N = 0;
  std::vector<uint16_t> q, k, v, g, beta;  // bf16 bits
  std::vector<float> A_log, dt_bias;
  std::vector<int64_t> cu_seqlens;         // empty unless varlen
  std::vector<uint16_t> init_bf16;         // [N, HV, V, K], when initial_state == kBF16
  std::vector<float> init_f32;             // [N, HV, V, K], when initial_state == kFP32
  float scale = 0.f;
  // The general inputs (ForwardArgs::gate_form, g_dtype, beta_is_probability,
  // beta_dtype; tests/common/general_inputs.h makes them): with an fp32 dtype, g
  // and beta are g_f32 and beta_f32 instead of the bf16 vectors above.
  GateForm gate_form = GateForm::kSafeGate;
  DType g_dtype = DType::kBF16;
  bool beta_is_probability = false;
  DType beta_dtype = DType::kBF16;
  std::vector<float> g_f32, beta_f32;

  int64_t tokens() const { return B * T; }
  size_t out_elems() const { return static_cast<size_t>(B * T * HV * V); }
  size_t state_elems() const { return static_cast<size_t>(N * HV * V * K); }

  // Arguments pointing at this problem's host buffers. `out` and `final_state`
  // (of the spec's final dtype, or nullptr) are the caller's.
  ForwardArgs host_args(void* out, void* final_state) const {
    ForwardArgs a;
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.g = g.data(); a.beta = beta.data();
    a.A_log = A_log.data(); a.dt_bias = dt_bias.data();
    a.gate_form = gate_form;
    a.g_dtype = g_dtype;
    a.beta_is_probability = beta_is_probability;
    a.beta_dtype = beta_dtype;
    if (g_dtype == DType::kFP32) a.g = g_f32.data();
    if (beta_dtype == DType::kFP32) a.beta = beta_f32.data();
    if (gate_form == GateForm::kLogDecay) a.A_log = a.dt_bias = nullptr;  // not read: may be null
    a.out = out;
    a.initial_state_dtype = spec.initial_state;
    a.initial_state = spec.initial_state == DType::kBF16 ? static_cast<const void*>(init_bf16.data())
                    : spec.initial_state == DType::kFP32 ? static_cast<const void*>(init_f32.data())
                                                         : nullptr;
    a.final_state_dtype = spec.final_state;
    a.final_state = spec.final_state == DType::kNone ? nullptr : final_state;
    if (!cu_seqlens.empty()) {
      a.cu_seqlens = cu_seqlens.data();
      a.cu_seqlens_host = cu_seqlens.data();
      a.num_seqs = N;
    }
    a.batch = B; a.seqlen = T; a.num_heads = H; a.num_v_heads = HV;
    a.head_dim_k = K; a.head_dim_v = V;
    a.scale = scale; a.lower_bound = spec.lower_bound;
    return a;
  }
};

// `blocks` blocks of [R, C] elements -> [C, R]: states [N, HV, V, K] <-> [N, HV, K, V]
// (ForwardArgs::states_key_major).
template <class T>
std::vector<T> transpose_blocks(const std::vector<T>& x, int64_t blocks, int64_t R, int64_t C) {
  std::vector<T> y(x.size());
  if (x.empty()) return y;  // no state
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) y[(b * C + c) * R + r] = x[(b * R + r) * C + c];
  return y;
}

inline HostProblem make_problem(const ProblemSpec& spec, uint64_t seed) {
  HostProblem p;
  p.spec = spec;
  p.H = spec.heads;
  p.HV = spec.v_heads > 0 ? spec.v_heads : spec.heads;
  p.K = p.V = spec.head_dim;
  if (!spec.seqlens.empty()) {
    p.B = 1;
    p.cu_seqlens.push_back(0);
    for (int64_t L : spec.seqlens) p.cu_seqlens.push_back(p.cu_seqlens.back() + L);
    p.T = p.cu_seqlens.back();
    p.N = static_cast<int64_t>(spec.seqlens.size());
  } else {
    p.B = spec.batch;
    p.T = spec.seqlen;
    p.N = spec.batch;
  }
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.K));

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  const int64_t BT = p.B * p.T;

  auto fill_normalised = [&](std::vector<uint16_t>& x, int64_t heads, int64_t dim) {
    x.resize(static_cast<size_t>(BT * heads * dim));
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t r = 0; r < BT * heads; ++r) {
      double ss = 0;
      for (auto& e : row) { e = normal(rng); ss += double(e) * e; }
      const float inv = static_cast<float>(1.0 / std::sqrt(ss));
      for (int64_t d = 0; d < dim; ++d) x[static_cast<size_t>(r * dim + d)] = float_to_bf16(row[d] * inv);
    }
  };
  auto fill_normal = [&](std::vector<uint16_t>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) e = float_to_bf16(normal(rng));
  };
  fill_normalised(p.q, p.H, p.K);
  fill_normalised(p.k, p.H, p.K);
  fill_normal(p.v, static_cast<size_t>(BT * p.HV * p.V));
  fill_normal(p.g, static_cast<size_t>(BT * p.HV * p.K));
  fill_normal(p.beta, static_cast<size_t>(BT * p.HV));
  p.A_log.resize(static_cast<size_t>(p.HV));
  for (auto& e : p.A_log) e = uniform(rng);
  p.dt_bias.resize(static_cast<size_t>(p.HV * p.K));
  for (auto& e : p.dt_bias) e = uniform(rng);
  if (spec.initial_state != DType::kNone) {
    std::vector<float> s(p.state_elems());
    for (auto& e : s) e = 0.1f * normal(rng);
    if (spec.initial_state == DType::kFP32) {
      p.init_f32 = std::move(s);
    } else {
      p.init_bf16.resize(s.size());
      for (size_t i = 0; i < s.size(); ++i) p.init_bf16[i] = float_to_bf16(s[i]);
    }
  }
  return p;
}

// ‖x − ref‖₂ / ‖ref‖₂ (NaN anywhere in x gives NaN, which fails any `<=` bar).
template <typename X, typename R>
double rel_rms(const X* x, const R* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(x[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <typename X, typename R>
double rel_rms(const std::vector<X>& x, const std::vector<R>& ref) {
  return rel_rms(x.data(), ref.data(), x.size());
}

inline std::vector<float> bf16_vector_to_float(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_float(x[i]);
  return y;
}

// No dense initial or final state (a pool's call, or one that keeps no state).
inline void clear_states(ForwardArgs& a) {
  a.initial_state = nullptr;
  a.initial_state_dtype = DType::kNone;
  a.final_state = nullptr;
  a.final_state_dtype = DType::kNone;
}

// The states in `pool_size` slots of `pool` (dtype `dtype`, dense slots unless a
// stride is set afterwards), sequence n's at slot slots[n] (int32).
inline void use_state_pool(ForwardArgs& a, void* pool, DType dtype, int64_t pool_size, const int32_t* slots) {
  clear_states(a);
  a.state_pool = pool;
  a.state_pool_dtype = dtype;
  a.pool_size = pool_size;
  a.state_indices = slots;
}

}  // namespace flashkda::testing
