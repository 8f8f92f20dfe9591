// The float64 oracle against an independent direct implementation (key-first
// state, long double, its own indexing) for 1-2 tokens, against a hand-computed
// 1-token case with K = V = 2, and against itself split into row blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_test_util.h"

namespace flashkda::testing {
namespace {

using ld = long double;

// Independent implementation of the contract: state kept as M = Sᵀ [K][V] in
// long double; q/k head of value head hv computed as hv * H / HV.
void direct_forward(const HostProblem& p, std::vector<ld>& out, std::vector<ld>& fin) {
  const int64_t K = p.K, V = p.V, H = p.H, HV = p.HV;
  out.assign(p.out_elems(), 0);
  fin.assign(p.state_elems(), 0);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t h = hv * H / HV;
      std::vector<ld> M(static_cast<size_t>(K * V));  // M[d][e] = S[e][d]
      for (int64_t e = 0; e < V; ++e)
        for (int64_t d = 0; d < K; ++d)
          M[d * V + e] = p.init_f32[static_cast<size_t>(((b * HV + hv) * V + e) * K + d)];
      for (int64_t s = 0; s < p.T; ++s) {
        const int64_t tok = b * p.T + s;
        auto at = [](const std::vector<uint16_t>& x, int64_t i) -> ld {
          return bf16_to_float(x[static_cast<size_t>(i)]);
        };
        ld nq = 0, nk = 0;
        for (int64_t d = 0; d < K; ++d) {
          nq += at(p.q, (tok * H + h) * K + d) * at(p.q, (tok * H + h) * K + d);
          nk += at(p.k, (tok * H + h) * K + d) * at(p.k, (tok * H + h) * K + d);
        }
        std::vector<ld> qh(K), kh(K), lam(K);
        for (int64_t d = 0; d < K; ++d) {
          qh[d] = at(p.q, (tok * H + h) * K + d) / std::sqrt(nq + 1e-6L);
          kh[d] = at(p.k, (tok * H + h) * K + d) / std::sqrt(nk + 1e-6L);
          const ld x = std::exp(static_cast<ld>(p.A_log[hv])) *
                       (at(p.g, (tok * HV + hv) * K + d) + p.dt_bias[hv * K + d]);
          // lower_bound · sigmoid(x) written as lower_bound · exp(−log(1 + e^{−x})).
          lam[d] = std::exp(static_cast<ld>(p.spec.lower_bound) * std::exp(-std::log1p(std::exp(-x))));
        }
        const ld beta = 1 / (1 + std::exp(-at(p.beta, tok * HV + hv)));
        // M ← diag(λ) M; then M ← M + β k̂ (vᵀ − k̂ᵀ M).
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e) M[d * V + e] *= lam[d];
        std::vector<ld> kM(V, 0);
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e) kM[e] += kh[d] * M[d * V + e];
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e)
            M[d * V + e] += beta * kh[d] * (at(p.v, (tok * HV + hv) * V + e) - kM[e]);
        for (int64_t e = 0; e < V; ++e) {
          ld o = 0;
          for (int64_t d = 0; d < K; ++d) o += M[d * V + e] * qh[d];
          out[static_cast<size_t>((tok * HV + hv) * V + e)] = static_cast<ld>(p.scale) * o;
        }
      }
      for (int64_t e = 0; e < V; ++e)
        for (int64_t d = 0; d < K; ++d)
          fin[static_cast<size_t>(((b * HV + hv) * V + e) * K + d)] = M[d * V + e];
    }
  }
}

class OracleDirect : public ::testing::TestWithParam<int64_t> {};

TEST_P(OracleDirect, MatchesIndependentImplementation) {
  ProblemSpec spec;
  spec.batch = 2;
  spec.seqlen = GetParam();
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, 500 + static_cast<uint64_t>(GetParam()));
  const RunResult r = run_backend(p, Which::kReference);
  std::vector<ld> out, fin;
  direct_forward(p, out, fin);

  // fp32 final state: the oracle stores its double state rounded to fp32.
  double num = 0, den = 0;
  for (size_t i = 0; i < fin.size(); ++i) {
    const double d = static_cast<double>(r.final_f32[i] - fin[i]);
    num += d * d;
    den += static_cast<double>(fin[i] * fin[i]);
  }
  ASSERT_GT(den, 0);
  EXPECT_LE(std::sqrt(num / den), 1e-7);
  // bf16 out: both are exact to ~1e-15, so they round to the same bf16.
  size_t mismatches = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (r.out[i] != float_to_bf16(static_cast<float>(out[i]))) ++mismatches;
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tokens, OracleDirect, ::testing::Values(1, 2));

// One token, K = V = 2, every quantity chosen so the result can be written down:
//   q = k = (1, 0) → q̂ = k̂ = (c, 0) with c = 1/sqrt(1 + 1e-6)
//   A_log = 0, dt_bias = 0, g = 0 → a = lower_bound · sigmoid(0) = −0.5 (lower_bound = −1)
//   beta = 0 → b = 1/2;  v = (2, −1);  S0 = [[1, 2], [3, 4]] (V×K);  scale = 1/2.
// Then with λ = e^{−1/2}: S·diag(λ) = λ·S0, S k̂ = λ c (1, 3), and only column 0 is written:
//   S[0][0] = λ + c/2 (2 − λc),  S[1][0] = 3λ + c/2 (−1 − 3λc),  S[0][1] = 2λ,  S[1][1] = 4λ
//   o = scale · S q̂ = (c/2) (S[0][0], S[1][0]).
TEST(Oracle, HandComputedOneToken) {
  const uint16_t one = float_to_bf16(1.f), zero = float_to_bf16(0.f);
  std::vector<uint16_t> q{one, zero}, k{one, zero}, v{float_to_bf16(2.f), float_to_bf16(-1.f)};
  std::vector<uint16_t> g{zero, zero}, beta{zero};
  std::vector<float> A_log{0.f}, dt_bias{0.f, 0.f};
  std::vector<float> s0{1.f, 2.f, 3.f, 4.f};

  const double c = 1.0 / std::sqrt(1.0 + 1e-6), lam = std::exp(-0.5);
  const double S00 = lam + c / 2 * (2 - lam * c), S10 = 3 * lam + c / 2 * (-1 - 3 * lam * c);
  const double expect_state[4] = {S00, 2 * lam, S10, 4 * lam};
  const double expect_out[2] = {c / 2 * S00, c / 2 * S10};

  for (Which w : {Which::kReference, Which::kChunked}) {
    std::vector<uint16_t> out(2, 0);
    std::vector<float> fin(4, 0.f);
    ForwardArgs a;
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.g = g.data(); a.beta = beta.data();
    a.A_log = A_log.data(); a.dt_bias = dt_bias.data(); a.out = out.data();
    a.initial_state = s0.data(); a.initial_state_dtype = DType::kFP32;
    a.final_state = fin.data(); a.final_state_dtype = DType::kFP32;
    a.batch = 1; a.seqlen = 1; a.num_heads = 1; a.num_v_heads = 1;
    a.head_dim_k = 2; a.head_dim_v = 2; a.scale = 0.5f; a.lower_bound = -1.f;
    const Status st = w == Which::kReference ? cpu::reference_forward_f64(a)
                                             : cpu::chunked_forward_f32(a, 1);
    ASSERT_TRUE(st.ok()) << st.message;
    const char* name = w == Which::kReference ? "reference" : "chunked";
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(fin[i], expect_state[i], 1e-6 * std::abs(expect_state[i])) << name << " S" << i;
    for (int i = 0; i < 2; ++i) {
      // bf16 out: its rounding of the exact value (both backends are far more
      // accurate than the bf16 spacing here), and within half an ulp <= 2^-8 relative.
      EXPECT_EQ(out[i], float_to_bf16(static_cast<float>(expect_out[i]))) << name << " out" << i;
      EXPECT_NEAR(bf16_to_float(out[i]), expect_out[i], std::abs(expect_out[i]) / 256)
          << name << " out" << i;
    }
  }
}

// With fewer (sequence, head) pairs than threads the oracle splits each pair's
// state rows into blocks (reference_f64.cpp). A block must compute exactly what
// the whole pair does for its rows: the same bits in out (rounded and not), the
// final state and the checkpoints, whatever the thread count, including blocks of
// unequal size and blocks that exceed the rows.
TEST(Oracle, RowBlocksGiveTheSameBits) {
  ProblemSpec one_head;
  one_head.seqlen = 70;
  one_head.heads = 1;
  one_head.head_dim = 64;
  ProblemSpec varlen = one_head;
  varlen.seqlens = {37, 0, 64, 21};
  varlen.heads = 2;
  varlen.v_heads = 4;
  varlen.head_dim = 32;
  varlen.final_state = DType::kBF16;
  varlen.initial_state = DType::kBF16;
  for (const ProblemSpec& spec : {one_head, varlen}) {
    const HostProblem p = make_problem(spec, 77);
    constexpr int64_t kInterval = 16;
    int64_t entries = 0;
    for (const SequenceSpan& sp : sequence_spans(p.host_args(nullptr, nullptr), p.cu_seqlens.data()))
      entries += (sp.length + kInterval - 1) / kInterval;
    struct Run {
      std::vector<uint16_t> out, ck;
      std::vector<float> out_unrounded;
      std::vector<unsigned char> fin;
    };
    auto run = [&](int threads) {
      Run r;
      r.out.assign(p.out_elems(), 0xFFFF);
      r.out_unrounded.assign(p.out_elems(), std::nanf(""));
      r.fin.assign(p.state_elems() * (spec.final_state == DType::kFP32 ? 4 : 2), 0xA5);
      r.ck.assign(static_cast<size_t>(entries * p.HV * p.K * p.V), 0xFFFF);
      ForwardArgs a = p.host_args(r.out.data(), r.fin.data());
      a.checkpoints = r.ck.data();
      a.checkpoints_dtype = DType::kBF16;
      a.checkpoint_interval = kInterval;
      a.checkpoints_capacity = entries;
      const Status st = cpu::reference_forward_f64(a, r.out_unrounded.data(), threads);
      EXPECT_TRUE(st.ok()) << st.message;
      return r;
    };
    const Run whole = run(1);  // one thread: one block a pair
    for (const int threads : {2, 5, 16, 40, 200}) {
      const Run split = run(threads);
      EXPECT_EQ(split.out, whole.out) << "threads " << threads;
      EXPECT_EQ(0, std::memcmp(split.out_unrounded.data(), whole.out_unrounded.data(), whole.out_unrounded.size() * 4))
          << "threads " << threads;
      EXPECT_EQ(split.fin, whole.fin) << "threads " << threads;
      EXPECT_EQ(split.ck, whole.ck) << "threads " << threads;
    }
    // The whole run wrote every element (nothing left at its poison).
    for (uint16_t x : whole.out) ASSERT_NE(x, 0xFFFF);
    for (uint16_t x : whole.ck) ASSERT_NE(x, 0xFFFF);
  }
}

}  // namespace
}  // namespace flashkda::testing
