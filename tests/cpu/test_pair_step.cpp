// The pair step (cpu::ChunkSteps::kPairs, chunked_f32.cpp): two chunks per step of the
// state, one product with S over 64 token rows and one update over 32. It is the same
// algorithm regrouped, so against the single steps it must agree to fp32 rounding, and
// against the float64 oracle it must meet the single steps' own bars: on the spec's
// distribution, on partial and odd chunk counts (a sequence's odd last chunk runs
// alone), varlen with GVA, and the degenerate keys where the chunk's inverse is at its
// worst (where Y and Z, the pair's coupling of its chunks, multiply U of chunk A).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "tests/common/degenerate_problem.h"

namespace flashkda::testing {
namespace {

// Bars, against the float64 oracle and against the single steps alike: the single
// steps' own (test_chunked.cpp, test_degenerate.cpp). The pair sums in another order
// (S·(w_B·d_A) for (S·d_A)·w_B, U_B through Y): ~1e-8 from the single steps on the
// spec's distribution, ~1e-6 on the degenerate class, and ~1e-4 on the state of the
// 16384-token input that barely decays, where both are ~1.5e-4 from the oracle.
constexpr double kSpecBar = 1e-4;
constexpr double kDegenerateBar = 1e-3;

struct Run {
  std::vector<float> out;    // unrounded
  std::vector<float> state;  // fp32 final state
};

Run run_chunked(const HostProblem& p, cpu::ChunkSteps steps) {
  Run r;
  std::vector<uint16_t> out_bf16(p.out_elems(), float_to_bf16(std::nanf("")));
  r.out.assign(p.out_elems(), std::nanf(""));
  r.state.assign(p.state_elems(), std::nanf(""));
  const ForwardArgs args = p.host_args(out_bf16.data(), r.state.data());
  const Status st = cpu::chunked_forward_f32(args, 0, r.out.data(), steps);
  EXPECT_TRUE(st.ok()) << st.message;
  return r;
}

void check(const HostProblem& p, const std::string& label, double bar) {
  const Run single = run_chunked(p, cpu::ChunkSteps::kSingle);
  const Run pairs = run_chunked(p, cpu::ChunkSteps::kPairs);
  ASSERT_TRUE(all_finite(pairs.out) && all_finite(pairs.state)) << label;
  const RunResult ref = run_backend(p, Which::kReference);
  const double out_vs_single = rel_rms(pairs.out, single.out), state_vs_single = rel_rms(pairs.state, single.state);
  const double out_err = rel_rms(pairs.out, ref.out_unrounded), state_err = rel_rms(pairs.state, ref.final_f32);
  std::printf("[ errors ] pair step %-36s vs single steps: out %.2e state %.2e; vs f64: out %.2e state %.2e\n",
              label.c_str(), out_vs_single, state_vs_single, out_err, state_err);
  EXPECT_LE(out_vs_single, bar) << label;
  EXPECT_LE(state_vs_single, bar) << label;
  EXPECT_LE(out_err, bar) << label;
  EXPECT_LE(state_err, bar) << label;
}

class PairStepLength : public ::testing::TestWithParam<int64_t> {};

// 1 and 16: one chunk, no pair; 17 and 32: one pair (B partial, whole); 33 and 48: a
// pair and an odd last chunk; 300: pairs and a partial odd chunk.
TEST_P(PairStepLength, MatchesSingleStepsAndTheOracle) {
  ProblemSpec spec;
  spec.seqlen = GetParam();
  spec.heads = 2;
  spec.head_dim = 64;
  check(make_problem(spec, 4000 + static_cast<uint64_t>(GetParam())), "T=" + std::to_string(GetParam()), kSpecBar);
}

INSTANTIATE_TEST_SUITE_P(SeqLens, PairStepLength, ::testing::Values(1, 16, 17, 32, 33, 48, 300),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

TEST(PairStep, VarlenGvaAndHeadDim128) {
  ProblemSpec spec;
  spec.seqlens = {37, 0, 64, 21, 130};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 128;
  check(make_problem(spec, 4101), "varlen {37,0,64,21,130} GVA K=128", kSpecBar);
}

class PairStepDegenerate : public ::testing::TestWithParam<DegenerateCase> {};

TEST_P(PairStepDegenerate, PartialChunk) {
  ProblemSpec spec;
  spec.seqlen = 300;
  spec.heads = 2;
  check(make_degenerate_problem(spec, GetParam(), 4102), GetParam().label(), kDegenerateBar);
}

INSTANTIATE_TEST_SUITE_P(Class, PairStepDegenerate, ::testing::ValuesIn(degenerate_class()),
                         [](const auto& info) { return info.param.test_name(); });

// The serving engine's regression input (test_degenerate.cpp): 16384 tokens whose
// state barely decays, where fp32 sums in another order drift the most.
TEST(PairStep, ServingRegressionInput) {
  ProblemSpec spec;
  spec.seqlen = 16384;
  spec.heads = 1;
  check(make_degenerate_problem(spec, {KeyPattern::kServingRepeat, 0.0, 8.f, true, true}, 4103), "serving regression",
        kDegenerateBar);
}

TEST(PairStep, RefusesCheckpoints) {
  ProblemSpec spec;
  spec.seqlen = 64;
  spec.heads = 1;
  spec.head_dim = 32;
  const HostProblem p = make_problem(spec, 4104);
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems()), ck(4 * p.state_elems());
  ForwardArgs args = p.host_args(out.data(), fin.data());
  args.checkpoints = ck.data();
  args.checkpoints_dtype = DType::kFP32;
  args.checkpoint_interval = 16;
  args.checkpoints_capacity = 4;
  const Status st = cpu::chunked_forward_f32(args, 0, nullptr, cpu::ChunkSteps::kPairs);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message.find("pair steps take no checkpoints"), std::string::npos) << st.message;
}

}  // namespace
}  // namespace flashkda::testing
