// The affine segment scan's CPU twin (spec section 6, cpu_backends.h): for any
// split of a sequence into runs of tokens, composing the runs' summaries and
// applying them to the initial state gives the final state of one straight run,
// and each run's forward from its true incoming state, or its outputs from a zero
// state plus the incoming state times their response (superpose), gives the
// straight run's outputs. Splits are random, not 16-aligned, and may hold empty runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu_test_util.h"
#include "tests/common/degenerate_problem.h"

namespace flashkda::testing {
namespace {

// One sequence of T tokens, one head pair with GVA (H = 1, HV = 2), head dim D.
void check_splits(const HostProblem& p, uint64_t seed) {
  const int64_t T = p.T, K = p.K, V = p.V, HV = p.HV;
  // The straight run, float64, out before rounding.
  const RunResult straight = run_backend(p, Which::kReference);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int64_t> cuts = {0, T};
    const int pieces = 1 + trial * 2;
    for (int i = 1; i < pieces; ++i) cuts.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(T + 1)));
    std::sort(cuts.begin(), cuts.end());  // duplicates make empty runs
    for (int64_t hv = 0; hv < HV; ++hv) {
      std::vector<double> S0(static_cast<size_t>(V * K));
      for (int64_t i = 0; i < V * K; ++i) S0[static_cast<size_t>(i)] = p.init_f32[static_cast<size_t>(hv * V * K + i)];
      const ForwardArgs args = p.host_args(nullptr, nullptr);
      // Compose the runs' summaries; check each run's outputs from its true incoming state.
      cpu::SegmentSummary prefix = cpu::segment_summary_f64(args, 0, 0, hv);  // the identity
      for (size_t r = 0; r + 1 < cuts.size(); ++r) {
        const int64_t b = cuts[r], e = cuts[r + 1];
        const std::vector<double> incoming = cpu::apply(prefix, S0);
        cpu::SegmentOutputs outputs;
        const cpu::SegmentSummary summary = cpu::segment_summary_f64(args, b, e, hv, &outputs);
        if (e > b) {
          // The run alone, as a one-sequence problem from the incoming state.
          HostProblem run = p;
          run.T = e - b;
          run.spec.seqlen = e - b;
          auto take = [&](const std::vector<uint16_t>& x, int64_t width) {
            return std::vector<uint16_t>(x.begin() + b * width, x.begin() + e * width);
          };
          run.q = take(p.q, p.H * K);
          run.k = take(p.k, p.H * K);
          run.v = take(p.v, HV * V);
          run.g = take(p.g, HV * K);
          run.beta = take(p.beta, HV);
          for (int64_t i = 0; i < V * K; ++i)
            run.init_f32[static_cast<size_t>(hv * V * K + i)] = static_cast<float>(incoming[static_cast<size_t>(i)]);
          const RunResult part = run_backend(run, Which::kReference);
          std::vector<double> got, want;
          for (int64_t t = 0; t < e - b; ++t)
            for (int64_t c = 0; c < V; ++c) {
              got.push_back(part.out_unrounded[static_cast<size_t>((t * HV + hv) * V + c)]);
              want.push_back(straight.out_unrounded[static_cast<size_t>(((b + t) * HV + hv) * V + c)]);
            }
          // The incoming state passes through fp32 (the forward's state dtype): ~1e-7.
          EXPECT_LE(rel_rms(got, want), 1e-6) << "run [" << b << ", " << e << ") hv " << hv;
          // The same outputs by superposition: the run's outputs from a zero state
          // plus the incoming state times their response (all float64).
          const std::vector<double> superposed = cpu::superpose(outputs, incoming);
          EXPECT_LE(rel_rms(superposed, want), 1e-6) << "superposed run [" << b << ", " << e << ") hv " << hv;
        }
        prefix = cpu::compose(prefix, summary);
      }
      // The composition against one straight summary (both float64) and against the
      // oracle's final state (fp32).
      const std::vector<double> composed = cpu::apply(prefix, S0);
      const std::vector<double> whole = cpu::apply(cpu::segment_summary_f64(args, 0, T, hv), S0);
      std::vector<double> oracle(straight.final_f32.begin() + hv * V * K, straight.final_f32.begin() + (hv + 1) * V * K);
      EXPECT_LE(rel_rms(composed, whole), 1e-12) << "trial " << trial << " hv " << hv;
      EXPECT_LE(rel_rms(composed, oracle), 1e-6) << "trial " << trial << " hv " << hv;
    }
  }
}

// 150 tokens, H = 1 with two value heads (GVA), head dim 32.
ProblemSpec small_gva_spec() {
  ProblemSpec spec;
  spec.seqlen = 150;
  spec.heads = 1;
  spec.v_heads = 2;
  spec.head_dim = 32;
  return spec;
}

TEST(SegmentScan, SpecDistributionAnySplit) { check_splits(make_problem(small_gva_spec(), 81), 82); }

TEST(SegmentScan, DegenerateKeysAnySplit) {
  check_splits(make_degenerate_problem(small_gva_spec(), {KeyPattern::kCollinear, 1e-2, 8.f, true}, 83), 84);
}

TEST(SegmentScan, FullHeadDim) {
  ProblemSpec spec;
  spec.seqlen = 70;
  spec.heads = 1;
  spec.head_dim = 128;
  check_splits(make_problem(spec, 85), 86);
}

// An empty run is the identity, and composing with it changes nothing.
TEST(SegmentScan, EmptyRunIsTheIdentity) {
  ProblemSpec spec;
  spec.seqlen = 20;
  spec.heads = 1;
  spec.head_dim = 16;
  const HostProblem p = make_problem(spec, 87);
  const ForwardArgs args = p.host_args(nullptr, nullptr);
  const cpu::SegmentSummary e = cpu::segment_summary_f64(args, 5, 5, 0), s = cpu::segment_summary_f64(args, 3, 17, 0);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 16; ++j) ASSERT_EQ(e.M[static_cast<size_t>(i * 16 + j)], i == j ? 1.0 : 0.0);
  for (double x : e.B) ASSERT_EQ(x, 0.0);
  const cpu::SegmentSummary a = cpu::compose(e, s), b = cpu::compose(s, e);
  EXPECT_EQ(a.M, s.M);
  EXPECT_EQ(a.B, s.B);
  EXPECT_EQ(b.M, s.M);
  EXPECT_EQ(b.B, s.B);
}

}  // namespace
}  // namespace flashkda::testing
