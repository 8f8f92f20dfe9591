// The chunk-16 fp32 backend against the float64 oracle.
//
// Bars: relative RMS <= 1e-4 on `out` and on an fp32 `final_state`.
// `out` is judged before its bf16 rounding (both backends can return it
// unrounded): the chunked fp32 result agrees with the float64 one to ~2.5e-7
// there. After rounding, a few elements in 1e4 straddle a rounding boundary and
// differ by one ulp; the element-wise check in chunked_vs_reference (no pair of
// bf16 outputs more than one ulp apart) guards the rounded output too.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "tests/common/huge_rows.h"

namespace flashkda::testing {
namespace {

constexpr double kBar = 1e-4;

struct LenCase {
  int64_t T;
  int64_t head_dim;
};

class ChunkedSeqLen : public ::testing::TestWithParam<LenCase> {};

TEST_P(ChunkedSeqLen, MatchesOracle) {
  const LenCase c = GetParam();
  ProblemSpec spec;
  spec.seqlen = c.T;
  spec.heads = 2;
  spec.head_dim = c.head_dim;
  const HostProblem p = make_problem(spec, 1000 + static_cast<uint64_t>(c.T));
  const std::string label = "T=" + std::to_string(c.T) + " D=" + std::to_string(c.head_dim);
  const Errors e = chunked_vs_reference(p, label.c_str());
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);
}

INSTANTIATE_TEST_SUITE_P(SeqLens, ChunkedSeqLen,
                         ::testing::Values(LenCase{1, 128}, LenCase{15, 128}, LenCase{16, 128},
                                           LenCase{17, 128}, LenCase{100, 128}, LenCase{1000, 64}),
                         [](const auto& info) {
                           return "T" + std::to_string(info.param.T) + "_D" +
                                  std::to_string(info.param.head_dim);
                         });

TEST(Chunked, VarlenWithEmptyAndLengthOneSequences) {
  ProblemSpec spec;
  spec.seqlens = {0, 1, 37, 16, 5};
  spec.heads = 2;
  spec.head_dim = 128;
  const HostProblem p = make_problem(spec, 2001);
  const Errors e = chunked_vs_reference(p, "varlen {0,1,37,16,5}");
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);

  // The zero-length sequence 0 keeps its initial state exactly, in both backends.
  const int64_t per_seq = p.HV * p.V * p.K;
  for (Which w : {Which::kReference, Which::kChunked}) {
    const RunResult r = run_backend(p, w);
    for (int64_t i = 0; i < per_seq; ++i)
      ASSERT_EQ(r.final_f32[static_cast<size_t>(i)], p.init_f32[static_cast<size_t>(i)]) << i;
  }
}

TEST(Chunked, VarlenLongerSequences) {
  ProblemSpec spec;
  spec.seqlens = {130, 3, 64, 0, 47};
  spec.heads = 2;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, 2002);
  const Errors e = chunked_vs_reference(p, "varlen {130,3,64,0,47} D=64");
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);
}

TEST(Chunked, Batched) {
  ProblemSpec spec;
  spec.batch = 3;
  spec.seqlen = 41;
  spec.heads = 2;
  spec.head_dim = 128;
  const HostProblem p = make_problem(spec, 2003);
  const Errors e = chunked_vs_reference(p, "batched B=3 T=41");
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);
}

TEST(Chunked, GroupedValueHeads) {
  ProblemSpec spec;
  spec.seqlen = 50;
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, 2004);
  const Errors e = chunked_vs_reference(p, "GVA H=2 HV=4 T=50");
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);
}

TEST(Chunked, GroupedValueHeadsVarlen) {
  ProblemSpec spec;
  spec.seqlens = {23, 40};
  spec.heads = 1;
  spec.v_heads = 3;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, 2005);
  const Errors e = chunked_vs_reference(p, "GVA H=1 HV=3 varlen {23,40}");
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);
}

TEST(Chunked, KeyAndValueDimsDiffer) {
  for (auto [K, V] : {std::pair<int64_t, int64_t>{64, 128}, {128, 64}}) {
    ProblemSpec spec;
    spec.seqlen = 37;
    spec.heads = 2;
    const HostProblem p = make_problem_kv(spec, K, V, 2006 + static_cast<uint64_t>(K));
    const std::string label = "K=" + std::to_string(K) + " V=" + std::to_string(V) + " T=37";
    const Errors e = chunked_vs_reference(p, label.c_str());
    EXPECT_LE(e.out, kBar) << label;
    EXPECT_LE(e.state, kBar) << label;
  }
}

// Every (initial, final) state dtype pair. fp32 final: the 1e-4 bar. bf16 final:
// both backends round their own final state to bf16; the fp32 values agree to
// ~1e-6, so the two bf16 tensors coincide except for elements straddling a
// rounding boundary (one ulp = 2^-8 apart). The relative RMS of that is a few
// 1e-5 in expectation; 1e-3 leaves room for it while still failing on any real
// error, which would show up at >= 1e-2 (wrong decay, wrong slice, stale state).
class ChunkedStateDtypes : public ::testing::TestWithParam<std::pair<DType, DType>> {};

TEST_P(ChunkedStateDtypes, MatchesOracle) {
  const auto [init, fin] = GetParam();
  ProblemSpec spec;
  spec.seqlens = {29, 0, 18};
  spec.heads = 2;
  spec.head_dim = 64;
  spec.initial_state = init;
  spec.final_state = fin;
  const HostProblem p =
      make_problem(spec, 3000 + 10 * static_cast<uint64_t>(init) + static_cast<uint64_t>(fin));
  const std::string label =
      std::string("state ") + to_string(init) + " -> " + to_string(fin);
  const RunResult ref = run_backend(p, Which::kReference);
  const RunResult chk = run_backend(p, Which::kChunked);
  const double eo = rel_rms(chk.out_unrounded.data(), ref.out_unrounded.data(), ref.out_unrounded.size());
  EXPECT_LE(eo, kBar) << label;
  double es = 0;
  if (fin == DType::kNone) {
    EXPECT_TRUE(ref.final_f32.empty() && ref.final_bf16.empty());
  } else {
    const auto rs = ref.final_float(), cs = chk.final_float();
    es = rel_rms(cs.data(), rs.data(), rs.size());
    EXPECT_LE(es, fin == DType::kFP32 ? kBar : 1e-3) << label;
    // The zero-length sequence 1: final = initial (or zero) in its dtype.
    const int64_t per_seq = p.HV * p.V * p.K;
    for (int64_t i = 0; i < per_seq; ++i) {
      const size_t j = static_cast<size_t>(per_seq + i);
      const float expect = init == DType::kNone   ? 0.f
                           : init == DType::kFP32 ? p.init_f32[j]
                                                  : bf16_to_float(p.init_bf16[j]);
      const float expect_out = fin == DType::kBF16 ? round_to_bf16(expect) : expect;
      ASSERT_EQ(cs[j], expect_out) << label << " element " << i;
      ASSERT_EQ(rs[j], expect_out) << label << " element " << i;
    }
  }
  std::printf("[ errors ] %-40s out %.3e  final_state %.3e\n", label.c_str(), eo, es);
}

INSTANTIATE_TEST_SUITE_P(
    AllCombos, ChunkedStateDtypes,
    ::testing::Values(std::pair{DType::kNone, DType::kNone}, std::pair{DType::kNone, DType::kBF16},
                      std::pair{DType::kNone, DType::kFP32}, std::pair{DType::kBF16, DType::kNone},
                      std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kBF16, DType::kFP32},
                      std::pair{DType::kFP32, DType::kNone}, std::pair{DType::kFP32, DType::kBF16},
                      std::pair{DType::kFP32, DType::kFP32}),
    [](const auto& info) {
      auto name = [](DType d) {
        return d == DType::kNone ? std::string("none") : d == DType::kBF16 ? "bf16" : "fp32";
      };
      return name(info.param.first) + "_to_" + name(info.param.second);
    });

// The result does not depend on the number of worker threads (bitwise).
TEST(Chunked, ThreadCountDoesNotChangeResult) {
  ProblemSpec spec;
  spec.seqlens = {70, 5, 33, 1};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, 2010);
  const RunResult one = run_backend(p, Which::kChunked, 1);
  const RunResult three = run_backend(p, Which::kChunked, 3);
  const RunResult many = run_backend(p, Which::kChunked, 64);
  EXPECT_EQ(one.out, three.out);
  EXPECT_EQ(one.out, many.out);
  ASSERT_EQ(one.final_f32.size(), three.final_f32.size());
  for (size_t i = 0; i < one.final_f32.size(); ++i) {
    ASSERT_EQ(one.final_f32[i], three.final_f32[i]) << i;
    ASSERT_EQ(one.final_f32[i], many.final_f32[i]) << i;
  }
}

// lower_bound at the edge of the allowed range keeps everything finite, including
// 2^{±G} over a whole chunk (16 · 5 · log2 e ≈ 115 < 127).
TEST(Chunked, StrongestDecayStaysAccurate) {
  ProblemSpec spec;
  spec.seqlen = 64;
  spec.heads = 2;
  spec.head_dim = 64;
  spec.lower_bound = -5.f;
  HostProblem p = make_problem(spec, 2011);
  // Push every gate to its maximum: sigmoid(...) -> 1, a -> lower_bound.
  for (auto& e : p.g) e = float_to_bf16(30.f);
  const Errors e = chunked_vs_reference(p, "max decay (g=+30)");
  EXPECT_LE(e.out, kBar);
  EXPECT_LE(e.state, kBar);
}

// Rows of q and k whose fp32 squared norm overflows (huge_rows.h): normalised as
// the oracle does, not read as zero (the squares are summed in double).
TEST(Chunked, RowsWhoseSquaresOverflowFp32) {
  for (const int64_t head_dim : {128, 64}) {
    ProblemSpec spec;
    spec.seqlen = 50;
    spec.heads = 2;
    spec.head_dim = head_dim;
    HostProblem p = make_problem(spec, 2012);
    // Rows are (token, head) pairs: tokens 3, 17 and 33 of head 0 in q, 4, 16 and 47 of head 1 in k.
    make_rows_huge(p.q, head_dim, 3 * 2, 17 * 2, 33 * 2);
    make_rows_huge(p.k, head_dim, 4 * 2 + 1, 16 * 2 + 1, 47 * 2 + 1);
    const Errors e = chunked_vs_reference(p, head_dim == 128 ? "huge q/k rows, K=128" : "huge q/k rows, K=64");
    EXPECT_LE(e.out, kBar);
    EXPECT_LE(e.state, kBar);
  }
}

// exp(A_log) past fp32's range (100) and past double's (710, inf) where
// g + dt_bias is exactly 0: the gate is sigmoid(0) (exp(A_log) clamped as kCuda
// clamps it, and the float64 oracle to the largest double, common/gate.h), not
// sigmoid(inf · 0) = NaN, on both backends.
TEST(Chunked, OverflowingExpALogAtAZeroGateArgument) {
  for (const float a_log : {100.f, 710.f, std::numeric_limits<float>::infinity()}) {
    ProblemSpec spec;
    spec.seqlen = 40;
    spec.heads = 2;
    spec.head_dim = 64;
    HostProblem p = make_problem(spec, 2013);
    for (auto& a : p.A_log) a = a_log;
    for (int64_t t = 0; t < 40; t += 3) p.g[static_cast<size_t>((t * 2 + 1) * 64 + 7)] = 0;  // head 1, column 7
    p.dt_bias[static_cast<size_t>(64 + 7)] = 0.f;
    const std::string what = "A_log = " + std::to_string(a_log) + ", g + dt_bias = 0";
    const Errors e = chunked_vs_reference(p, what.c_str());
    EXPECT_LE(e.out, kBar) << what;
    EXPECT_LE(e.state, kBar) << what;
  }
}

// Through the public API (validation + dispatch): both CPU backends give bitwise
// what the direct calls give.
TEST(Chunked, PublicApiDispatchMatchesDirectCalls) {
  ProblemSpec spec;
  spec.seqlens = {0, 1, 37, 16, 5};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, 2012);
  for (auto [backend, which] : {std::pair{Backend::kCpuReference, Which::kReference},
                                std::pair{Backend::kCpuChunked, Which::kChunked}}) {
    const RunResult direct = run_backend(p, which);
    std::vector<uint16_t> out(p.out_elems(), 0x7fc0);
    std::vector<float> fin(p.state_elems(), std::nanf(""));
    const ForwardArgs args = p.host_args(out.data(), fin.data());
    size_t ws = 1;
    ASSERT_TRUE(workspace_size(args, backend, &ws).ok());
    std::vector<unsigned char> workspace(ws + 256);
    void* aligned = workspace.data();
    size_t space = workspace.size();
    ASSERT_NE(std::align(256, ws, aligned, space), nullptr);
    const Status st = forward(args, backend, ws ? aligned : nullptr, ws, nullptr);
    ASSERT_TRUE(st.ok()) << to_string(backend) << ": " << st.message;
    EXPECT_EQ(out, direct.out) << to_string(backend);
    ASSERT_EQ(fin.size(), direct.final_f32.size());
    for (size_t i = 0; i < fin.size(); ++i) ASSERT_EQ(fin[i], direct.final_f32[i]) << i;
  }
}

}  // namespace
}  // namespace flashkda::testing
