// Helpers for the CPU-backend tests: run a backend on a HostProblem and keep its
// outputs, build problems with K != V, and compare results.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/sequences.h"
#include "cpu/cpu_backends.h"
#include "tests/common/kda_problem.h"

namespace flashkda::testing {

// validate(a, backend) fails with `code` and a message containing `needle`.
inline void expect_invalid(const ForwardArgs& a, Backend backend, StatusCode code, const std::string& needle) {
  const Status st = validate(a, backend);
  EXPECT_EQ(st.code, code) << st.message;
  EXPECT_NE(st.message.find(needle), std::string::npos) << "message: " << st.message;
}

struct RunResult {
  std::vector<uint16_t> out;         // bf16 [B, T, HV, V]
  std::vector<float> out_unrounded;  // the same before its bf16 rounding
  std::vector<float> final_f32;      // when final dtype is fp32
  std::vector<uint16_t> final_bf16;  // when final dtype is bf16

  std::vector<float> out_float() const { return bf16_vector_to_float(out); }
  // The final state as floats, whatever its dtype (empty when absent).
  std::vector<float> final_float() const {
    return final_bf16.empty() ? final_f32 : bf16_vector_to_float(final_bf16);
  }
};

enum class Which { kReference, kChunked };

inline RunResult run_backend(const HostProblem& p, Which which, int threads = 0) {
  RunResult r;
  // Poison the outputs so that an element a backend forgets to write is caught.
  r.out.assign(p.out_elems(), float_to_bf16(std::nanf("")));
  void* fin = nullptr;
  if (p.spec.final_state == DType::kFP32) {
    r.final_f32.assign(p.state_elems(), std::nanf(""));
    fin = r.final_f32.data();
  } else if (p.spec.final_state == DType::kBF16) {
    r.final_bf16.assign(p.state_elems(), float_to_bf16(std::nanf("")));
    fin = r.final_bf16.data();
  }
  r.out_unrounded.assign(p.out_elems(), std::nanf(""));
  const ForwardArgs args = p.host_args(r.out.data(), fin);
  const Status st = which == Which::kReference ? cpu::reference_forward_f64(args, r.out_unrounded.data(), threads)
                                               : cpu::chunked_forward_f32(args, threads, r.out_unrounded.data());
  EXPECT_TRUE(st.ok()) << st.message;
  return r;
}

// Varlen with GVA and an empty sequence: lengths 37, 0, 64, 21; H = 2, HV = 4, K = V = 32.
inline HostProblem varlen_gva_problem(uint64_t seed) {
  ProblemSpec spec;
  spec.seqlens = {37, 0, 64, 21};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 32;
  return make_problem(spec, seed);
}

// segment_summaries of `inputs` over the (begin, end) pairs `segs` into M, B (resized).
inline Status summaries_of(const ForwardArgs& inputs, const std::vector<int64_t>& segs, Backend backend,
                           std::vector<float>& M, std::vector<float>& B) {
  const int64_t S = static_cast<int64_t>(segs.size() / 2), HV = value_heads(inputs);
  M.assign(static_cast<size_t>(S * HV * inputs.head_dim_k * inputs.head_dim_k), 0.f);
  B.assign(static_cast<size_t>(S * HV * inputs.head_dim_v * inputs.head_dim_k), 0.f);
  SegmentSummaryArgs s;
  s.inputs = inputs;
  s.segments = segs.data();
  s.num_segments = S;
  s.M = M.data();
  s.B = B.data();
  return segment_summaries(s, backend);
}

// Sequence n's fp32 initial state [HV, V, K] in p.
inline std::vector<float> initial_of(const HostProblem& p, int64_t n) {
  const int64_t per_seq = p.HV * p.V * p.K;
  return std::vector<float>(p.init_f32.begin() + n * per_seq, p.init_f32.begin() + (n + 1) * per_seq);
}

// The final state (fp32, [HV, V, K]) of `backend` run on the first `tokens` tokens
// of sequence n of p alone, from the fp32 state `init` (tokens = 0: init itself).
inline std::vector<float> prefix_state(const HostProblem& p, int64_t n, int64_t tokens, Backend backend,
                                       const std::vector<float>& init) {
  if (tokens == 0) return init;
  const std::vector<SequenceSpan> spans = sequence_spans(p.host_args(nullptr, nullptr), p.cu_seqlens.data());
  const int64_t b = spans[static_cast<size_t>(n)].token_begin;
  HostProblem run = p;
  run.spec.seqlens.clear();
  run.cu_seqlens.clear();
  run.B = 1;
  run.N = 1;
  run.T = tokens;
  auto take = [&](const std::vector<uint16_t>& x, int64_t width) {
    return std::vector<uint16_t>(x.begin() + b * width, x.begin() + (b + tokens) * width);
  };
  run.q = take(p.q, p.H * p.K);
  run.k = take(p.k, p.H * p.K);
  run.v = take(p.v, p.HV * p.V);
  run.g = take(p.g, p.HV * p.K);
  run.beta = take(p.beta, p.HV);
  run.init_f32 = init;
  return run_backend(run, backend == Backend::kCpuReference ? Which::kReference : Which::kChunked).final_f32;
}

// make_problem with a value head dim V that may differ from K: v and the initial
// state are redrawn (same distribution) at the new V.
inline HostProblem make_problem_kv(ProblemSpec spec, int64_t K, int64_t V, uint64_t seed) {
  spec.head_dim = K;
  HostProblem p = make_problem(spec, seed);
  if (V == K) return p;
  p.V = V;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> normal(0.f, 1.f);
  p.v.resize(static_cast<size_t>(p.B * p.T * p.HV * V));
  for (auto& e : p.v) e = float_to_bf16(normal(rng));
  std::vector<float> s(p.state_elems());
  for (auto& e : s) e = 0.1f * normal(rng);
  p.init_f32.clear();
  p.init_bf16.clear();
  if (spec.initial_state == DType::kFP32) p.init_f32 = s;
  if (spec.initial_state == DType::kBF16) {
    p.init_bf16.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) p.init_bf16[i] = float_to_bf16(s[i]);
  }
  return p;
}

inline bool all_finite(const std::vector<float>& x) {
  for (float e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

struct Errors {
  double out = 0;    // rel RMS of the bf16 outputs (both backends round to bf16)
  double state = 0;  // rel RMS of the final state (as floats), 0 when absent
};

// `floor_rel`: the element-wise check's absolute floor, relative to rms(out).
inline Errors chunked_vs_reference(const HostProblem& p, const char* label, int threads = 0, double floor_rel = 1e-6) {
  const RunResult ref = run_backend(p, Which::kReference);
  const RunResult chk = run_backend(p, Which::kChunked, threads);
  Errors e;
  // The bar applies to out before its bf16 rounding: after it, two roundings of
  // values that agree to ~1e-7 differ by one ulp in a few elements in 1e4, which
  // alone can reach ~1e-4 of relative RMS on small problems.
  e.out = rel_rms(chk.out_unrounded.data(), ref.out_unrounded.data(), ref.out_unrounded.size());
  const auto ro = ref.out_float(), co = chk.out_float();
  const auto rs = ref.final_float(), cs = chk.final_float();
  if (!rs.empty()) e.state = rel_rms(cs.data(), rs.data(), rs.size());
  // Element-wise: the two bf16 outputs are roundings of values that agree to
  // ~1e-7 relative, so they are equal or one bf16 ulp apart (an ulp is at most
  // 2^-7 relative); a floor of floor_rel·rms(out) covers values near zero.
  double ss = 0;
  for (float x : ro) ss += double(x) * x;
  const double floor_abs = floor_rel * std::sqrt(ss / static_cast<double>(ro.size() ? ro.size() : 1));
  size_t differ = 0, beyond_one_ulp = 0;
  for (size_t i = 0; i < ro.size(); ++i) {
    if (chk.out[i] != ref.out[i]) ++differ;
    if (!(std::abs(double(co[i]) - ro[i]) <= std::abs(double(ro[i])) / 128 + floor_abs)) ++beyond_one_ulp;
  }
  EXPECT_EQ(beyond_one_ulp, 0u) << label << ": bf16 outputs more than one ulp apart";
  std::printf("[ errors ] %-40s out %.3e (%zu/%zu bf16 differ)  final_state %.3e\n", label, e.out,
              differ, ro.size(), e.state);
  return e;
}

}  // namespace flashkda::testing
