// The chunk-16 fp32 backend on degenerate keys (tests/common/degenerate_problem.h)
// against the float64 oracle: (nearly) collinear and anti-aligned keys, b → 1 and
// b = 0.5, slow and the spec's decay, repeated and fresh keys in one chunk,
// partial chunks, varlen with GVA, and the serving engine's regression input.
//
// Bar: always finite, and relative RMS <= kBar on out (before its bf16
// rounding) and on the fp32 final state. With the forward-substitution inverse
// the fp32 chunked algorithm agrees with the oracle to ~1e-6 on T = 300 and to
// 1.5e-4 on the state of the 16384-token regression input (fp32 accumulation
// over 1024 chunks of a state that barely decays), so the bar is 1e-3, ten
// times under the 1e-2 for the kernels. The fp32 Neumann product it
// replaced measured 1e-4 .. 4e-4 on the same cases (a loss of three digits
// against ~3e-7 on the spec's distribution; docs/design.md).
//
// The element-wise check (bf16 outputs at most one ulp apart) keeps a floor of
// 1e-4·rms(out): out = S·q̂ with q̂ ∥ k̂ cancels to near zero in a few elements,
// where two fp32 roundings that agree to 1e-6 of rms(out) can land two ulps apart.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "tests/common/degenerate_problem.h"

namespace flashkda::testing {
namespace {

constexpr double kBar = 1e-3;
constexpr double kElementFloor = 1e-4;

void check_case(const ProblemSpec& spec, const DegenerateCase& c, uint64_t seed) {
  const HostProblem p = make_degenerate_problem(spec, c, seed);
  const std::string label = c.label();
  const RunResult chk = run_backend(p, Which::kChunked);
  ASSERT_TRUE(all_finite(chk.out_unrounded)) << label << ": non-finite out";
  ASSERT_TRUE(all_finite(chk.final_float())) << label << ": non-finite final state";
  const Errors e = chunked_vs_reference(p, label.c_str(), 0, kElementFloor);
  EXPECT_LE(e.out, kBar) << label;
  EXPECT_LE(e.state, kBar) << label;
}

class ChunkedDegenerate : public ::testing::TestWithParam<DegenerateCase> {};

// One sequence with a partial last chunk (300 = 18·16 + 12), two heads.
TEST_P(ChunkedDegenerate, PartialChunk) {
  ProblemSpec spec;
  spec.seqlen = 300;
  spec.heads = 2;
  check_case(spec, GetParam(), 31);
}

// Varlen with partial chunks and GVA (two value heads per q/k head).
TEST_P(ChunkedDegenerate, VarlenGva) {
  ProblemSpec spec;
  spec.seqlens = {37, 16, 130, 5};
  spec.heads = 1;
  spec.v_heads = 2;
  check_case(spec, GetParam(), 32);
}

INSTANTIATE_TEST_SUITE_P(Class, ChunkedDegenerate, ::testing::ValuesIn(degenerate_class()),
                         [](const auto& info) { return info.param.test_name(); });

// The serving engine's regression input: T = 16384, H = 1, q = k = one vector,
// v = one 16-token block repeated, gate −12, beta logit 8, A_log 0, dt_bias 0,
// lower_bound −5, zero fp32 initial state.
TEST(ChunkedDegenerate, ServingRegressionInput) {
  ProblemSpec spec;
  spec.seqlen = 16384;
  spec.heads = 1;
  check_case(spec, {KeyPattern::kServingRepeat, 0.0, 8.f, true, true}, 33);
}

}  // namespace
}  // namespace flashkda::testing
