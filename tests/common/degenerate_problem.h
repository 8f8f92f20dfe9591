// Degenerate KDA problems: the inputs a model produces on repeated tokens, where
// the chunked algorithm's 16x16 inverse (I + L)^{-1} is at its worst.
//
// Inside a chunk, L_ij = b_i (k̂_i·k̂_j) 2^(G_i − G_j) for i > j. Random keys keep
// |L_ij| near 0.1, where any method is accurate. Keys that are (nearly) parallel
// or anti-parallel, b = sigmoid(beta) → 1 and a gate that barely decays push
// |L_ij| to 1: L tends to ±(all-ones strictly lower), whose powers grow to
// C(15,7) = 6435 while (I + L)^{-1} itself stays small. A method that lives on
// cancellation between large partial sums (the Neumann product) fails there.
//
// Every case starts from a random problem (shapes, q, v, an initial state) and
// then overwrites what the case pins. Shared by the CPU and GPU tests (forward and
// decode) and the tools.
#pragma once

#include <cctype>
#include <cmath>
#include <ostream>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tests/common/kda_problem.h"

namespace flashkda::testing {

enum class KeyPattern {
  kCollinear,       // k_t = d_h + eps·noise (d_h: one random direction per q/k head)
  kAntiAligned,     // k_t = ±d_h alternating token by token (+ eps·noise)
  kMixedChunk,      // even tokens d_h, odd tokens random: repeated and fresh keys in one chunk
  kServingRepeat,   // q = k = d_h for every token, v = one random 16-token block repeated
};

struct DegenerateCase {
  KeyPattern keys = KeyPattern::kCollinear;
  double eps = 0.0;          // relative size of the noise added to the key direction
  float beta_logit = 8.f;    // b = sigmoid(beta): 8 → 0.99966 (b → 1), 0 → 0.5
  bool slow_decay = true;    // gate −12, A_log 0, dt_bias 0: a ≈ −3e-5 per token; false: the spec's gates
  bool zero_initial_state = false;

  std::string label() const {
    const char* k = keys == KeyPattern::kCollinear     ? "collinear"
                    : keys == KeyPattern::kAntiAligned ? "anti-aligned"
                    : keys == KeyPattern::kMixedChunk  ? "mixed-chunk"
                                                       : "serving-repeat";
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s eps=%g b=%s %s", k, eps, beta_logit > 4 ? "1" : "0.5",
                  slow_decay ? "slow-decay" : "spec-decay");
    return buf;
  }
  // The label as a test name: letters, digits and '_' only.
  std::string test_name() const {
    std::string s = label();
    for (char& ch : s)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
  }
};

// gtest prints a parameter with this instead of its bytes.
inline void PrintTo(const DegenerateCase& c, std::ostream* os) { *os << c.label(); }

// Slow decay: a = lower_bound·sigmoid(exp(0)·(−12 + 0)) ≈ −5·6.1e-6 per token.
constexpr float kSlowGate = -12.f;

// Overwrites the inputs of `p` (a HostProblem or a DecodeProblem: q, k, v, g,
// beta, A_log, dt_bias, H, HV, K, V) for `tokens` tokens with the case's pattern.
template <class Problem>
void make_inputs_degenerate(Problem& p, int64_t tokens, const DegenerateCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t K = p.K, V = p.V;

  // One unit direction per q/k head.
  std::vector<float> dir(static_cast<size_t>(p.H * K));
  for (int64_t h = 0; h < p.H; ++h) {
    double ss = 0;
    for (int64_t d = 0; d < K; ++d) {
      const float x = normal(rng);
      dir[static_cast<size_t>(h * K + d)] = x;
      ss += double(x) * x;
    }
    for (int64_t d = 0; d < K; ++d) dir[static_cast<size_t>(h * K + d)] /= static_cast<float>(std::sqrt(ss));
  }
  // Noise of relative size eps: a unit direction has entries ~K^-1/2.
  const float noise_scale = static_cast<float>(c.eps / std::sqrt(static_cast<double>(K)));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < p.H; ++h) {
      const float sign = (c.keys == KeyPattern::kAntiAligned && (t % 2)) ? -1.f : 1.f;
      const bool fresh = c.keys == KeyPattern::kMixedChunk && (t % 2);
      for (int64_t d = 0; d < K; ++d) {
        const size_t i = static_cast<size_t>((t * p.H + h) * K + d);
        const float base = dir[static_cast<size_t>(h * K + d)];
        float x = fresh ? normal(rng) * (1.f / std::sqrt(static_cast<float>(K))) : sign * base;
        if (!fresh && c.eps > 0) x += noise_scale * normal(rng);
        p.k[i] = float_to_bf16(x);
        if (c.keys == KeyPattern::kServingRepeat) p.q[i] = p.k[i];
      }
    }
  }
  if (c.keys == KeyPattern::kServingRepeat) {
    std::vector<uint16_t> block(static_cast<size_t>(16 * p.HV * V));
    for (auto& e : block) e = float_to_bf16(normal(rng));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < p.HV * V; ++j)
        p.v[static_cast<size_t>(t * p.HV * V + j)] = block[static_cast<size_t>((t % 16) * p.HV * V + j)];
  }
  for (auto& b : p.beta) b = float_to_bf16(c.beta_logit);
  if (c.slow_decay) {
    for (auto& g : p.g) g = float_to_bf16(kSlowGate);
    for (auto& a : p.A_log) a = 0.f;
    for (auto& d : p.dt_bias) d = 0.f;
  }
}

inline HostProblem make_degenerate_problem(const ProblemSpec& spec, const DegenerateCase& c, uint64_t seed) {
  HostProblem p = make_problem(spec, seed);
  make_inputs_degenerate(p, p.B * p.T, c, seed);
  if (c.zero_initial_state) {
    for (auto& s : p.init_f32) s = 0.f;
    for (auto& s : p.init_bf16) s = 0;
  }
  return p;
}

// The degenerate class the tests sweep (each case × shapes with partial chunks).
inline std::vector<DegenerateCase> degenerate_class() {
  std::vector<DegenerateCase> cases;
  for (double eps : {0.0, 1e-3, 1e-2, 0.1, 0.3}) cases.push_back({KeyPattern::kCollinear, eps, 8.f, true});
  cases.push_back({KeyPattern::kCollinear, 0.0, 0.f, true});    // b = 0.5
  cases.push_back({KeyPattern::kCollinear, 1e-2, 0.f, true});
  cases.push_back({KeyPattern::kCollinear, 0.0, 8.f, false});   // the spec's (fast) decay
  cases.push_back({KeyPattern::kCollinear, 1e-2, 8.f, false});
  cases.push_back({KeyPattern::kAntiAligned, 0.0, 8.f, true});
  cases.push_back({KeyPattern::kAntiAligned, 1e-2, 0.f, true});
  cases.push_back({KeyPattern::kMixedChunk, 0.0, 8.f, true});
  cases.push_back({KeyPattern::kServingRepeat, 0.0, 8.f, true, true});
  return cases;
}

}  // namespace flashkda::testing
