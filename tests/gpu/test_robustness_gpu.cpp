// Robustness of the CUDA forward (label "gpu"): degenerate keys against the
// float64 oracle, a NaN input that must stay in its sequence and head, and
// device-resident cu_seqlens values that break the rules.
// Skips, saying why, when the CUDA backend is not built or no sm_90 device is present.
//
// Degenerate keys (tests/common/degenerate_problem.h): always finite, and out and
// the fp32 final state within kDegenerateBar relative RMS of the oracle. The
// spec's-distribution bars (3.5e-3 / 2.5e-3) still hold in test_forward_gpu.cpp.
//
// Guard bands: out, the final state and the workspace sit inside larger buffers
// filled with a sentinel; after a call with bad cu_seqlens values (no host copy,
// so nothing is checked on the host) every sentinel byte must be intact and
// check_device_faults() must name cu_seqlens and the first bad sequence, once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "flashkda/flashkda.h"

#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include "sm90/sm90_forward.h"
#include "tests/common/degenerate_problem.h"
#endif

namespace flashkda::testing {
namespace {


#ifdef FLASHKDA_WITH_CUDA

bool all_finite(const std::vector<float>& x) {
  for (float e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

// The GPU result of a degenerate case against the oracle.
void check_degenerate(const ProblemSpec& spec, const DegenerateCase& c, uint64_t seed, const char* shape) {
  const HostProblem p = make_degenerate_problem(spec, c, seed);
  const RunResult gpu = run_cuda(p);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
  ASSERT_TRUE(all_finite(gpu.out)) << c.label() << ": non-finite out";
  ASSERT_TRUE(all_finite(gpu.final_state)) << c.label() << ": non-finite final state";
  const OracleResult ref = run_oracle(p);
  const double eo = rel_rms(gpu.out.data(), ref.out.data(), ref.out.size());
  const double es = rel_rms(gpu.final_state.data(), ref.final_state.data(), ref.final_state.size());
  std::printf("[ errors ] degenerate %-40s %-14s out %.3e  state %.3e\n", c.label().c_str(), shape, eo, es);
  EXPECT_LE(eo, kDegenerateBar) << c.label();
  EXPECT_LE(es, kDegenerateBar) << c.label();
}

class GpuDegenerate : public ::testing::TestWithParam<DegenerateCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

// One sequence with a partial last chunk (300 = 18·16 + 12), two heads.
TEST_P(GpuDegenerate, PartialChunk) {
  ProblemSpec spec;
  spec.seqlen = 300;
  spec.heads = 2;
  check_degenerate(spec, GetParam(), 41, "T=300");
}

// Varlen with partial chunks and GVA.
TEST_P(GpuDegenerate, VarlenGva) {
  ProblemSpec spec;
  spec.seqlens = {37, 16, 130, 5, 400};
  spec.heads = 1;
  spec.v_heads = 2;
  check_degenerate(spec, GetParam(), 42, "varlen+GVA");
}

// A longer sequence: rounding errors in directions the keys rarely visit are
// never decayed (slow decay) nor overwritten, so they add up over the chunks.
TEST_P(GpuDegenerate, Long) {
  ProblemSpec spec;
  spec.seqlen = 4096;
  spec.heads = 1;
  check_degenerate(spec, GetParam(), 43, "T=4096");
}

// Head dim 64 (its own prologue and 64-wide products): a partial last chunk with
// GVA, and a long sequence where errors in rarely visited directions add up.
TEST_P(GpuDegenerate, HeadDim64) {
  ProblemSpec spec;
  spec.head_dim = 64;
  spec.seqlens = {300, 45};
  spec.heads = 1;
  spec.v_heads = 2;
  check_degenerate(spec, GetParam(), 47, "K=64 varlen+GVA");
  spec.seqlens = {};
  spec.seqlen = 4096;
  spec.v_heads = 0;
  check_degenerate(spec, GetParam(), 48, "K=64 T=4096");
}

// Every launch plan (V split 1, 2; 3 and 4 stages) on the same case.
TEST_P(GpuDegenerate, EveryLaunchPlan) {
  for (const sm90::LaunchOverride& o : {sm90::LaunchOverride{1, 4}, sm90::LaunchOverride{2, 3},
                                        sm90::LaunchOverride{2, 4}}) {
    if (GetParam().keys != KeyPattern::kCollinear || GetParam().eps != 0.0) return;  // one case is enough
    sm90::set_launch_override(o);
    ProblemSpec spec;
    spec.seqlens = {300, 45};
    spec.heads = 2;
    const std::string shape = "v" + std::to_string(o.v_split) + "s" + std::to_string(o.stages);
    check_degenerate(spec, GetParam(), 44, shape.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Class, GpuDegenerate, ::testing::ValuesIn(degenerate_class()),
                         [](const auto& info) { return info.param.test_name(); });

// The serving engine's regression input (it poisoned a recurrent-state cache):
// T = 16384, H = 1, q = k = one vector, v = one 16-token block repeated, gate −12,
// beta logit 8, A_log 0, dt_bias 0, lower_bound −5, zero fp32 initial state.
TEST(GpuDegenerateInput, ServingRegression) {
  SKIP_WITHOUT_GPU();
  ProblemSpec spec;
  spec.seqlen = 16384;
  spec.heads = 1;
  check_degenerate(spec, {KeyPattern::kServingRepeat, 0.0, 8.f, true, true}, 45, "T=16384");
}

// The same input with a bf16 state in and out: finite, and within the bar on out.
TEST(GpuDegenerateInput, ServingRegressionBf16State) {
  SKIP_WITHOUT_GPU();
  ProblemSpec spec;
  spec.seqlen = 4096;
  spec.heads = 1;
  spec.initial_state = spec.final_state = DType::kBF16;
  const HostProblem p = make_degenerate_problem(spec, {KeyPattern::kServingRepeat, 0.0, 8.f, true, true}, 46);
  const RunResult gpu = run_cuda(p);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
  ASSERT_TRUE(all_finite(gpu.out));
  ASSERT_TRUE(all_finite(gpu.final_state));
  const OracleResult ref = run_oracle(p);
  const double eo = rel_rms(gpu.out.data(), ref.out.data(), ref.out.size());
  std::printf("[ errors ] degenerate serving-repeat bf16 state T=4096: out %.3e\n", eo);
  EXPECT_LE(eo, kDegenerateBar);
}

// ---------------------------------------------------------------------------
// A non-finite input stays in its sequence and head (the CPU twin:
// tests/python/test_cpu.py, test_a_non_finite_input_stays_in_its_sequence_and_head).
// ---------------------------------------------------------------------------

// Whether token t's out at value head hv, and sequence n's final state at value
// head hv, are finite in every element.
bool out_finite(const RunResult& r, const HostProblem& p, int64_t t, int64_t hv) {
  const auto begin = r.out.begin() + (t * p.HV + hv) * p.V;
  return std::all_of(begin, begin + p.V, [](float x) { return std::isfinite(x); });
}
bool state_finite(const RunResult& r, const HostProblem& p, int64_t n, int64_t hv) {
  const int64_t per_head = p.V * p.K;
  const auto begin = r.final_state.begin() + (n * p.HV + hv) * per_head;
  return std::all_of(begin, begin + per_head, [](float x) { return std::isfinite(x); });
}

struct NonFiniteCase {
  char where;  // 'q', 'k' or 'v'
  int64_t head_dim;
  sm90::LaunchOverride plan;
  const char* plan_name;
};

void PrintTo(const NonFiniteCase& c, std::ostream* os) {
  *os << "NaN in " << c.where << ", K = " << c.head_dim << ", " << c.plan_name;
}

// One NaN in one element of one token's q, k or v, under every launch form that
// could spread it further: the one-pass recurrence (V split 1 and 2, 3 and 4
// stages), and the segment scan with out formed by running the chains again or
// by superposition (the NaN in the second chunk of a segment, so the segment's
// first chunk must stay finite through pass 1's o⁰ and P).
std::vector<NonFiniteCase> non_finite_cases() {
  struct Plan {
    sm90::LaunchOverride o;
    const char* name;
  };
  const Plan plans[] = {{{1, 4, -1}, "v1s4"},
                        {{2, 4, -1}, "v2s4"},
                        {{2, 3, -1}, "v2s3"},
                        {{0, 0, 2, 0, 1}, "seg2chains"},
                        {{0, 0, 2, 0, 2}, "seg2superposed"}};
  std::vector<NonFiniteCase> cases;
  for (char where : {'q', 'k', 'v'})
    for (int64_t dim : {128, 64})
      for (const Plan& plan : plans) cases.push_back({where, dim, plan.o, plan.name});
  return cases;
}

class GpuNonFinite : public ::testing::TestWithParam<NonFiniteCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

// Three sequences (none 16-aligned in the packed batch), GVA 2 → 4 value heads.
// The NaN sits at token 57 of sequence 1 (chunk 3 of that sequence: tokens 48-63),
// q/k head 1 (value heads 2 and 3) or, for v, value head 3 only. Expected, as on the
// chunked CPU backend: that sequence's out at those heads is non-finite from the
// start of the token's chunk (0 · NaN in the chunk's products) to the end of the
// sequence, and so is its final state there; a NaN in q reaches its own token's out
// only. Everything else is finite.
TEST_P(GpuNonFinite, StaysInItsSequenceAndHead) {
  const NonFiniteCase& c = GetParam();
  sm90::set_launch_override(c.plan);
  ProblemSpec spec;
  spec.seqlens = {100, 77, 60};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = c.head_dim;
  HostProblem p = make_problem(spec, 4101);
  const int64_t seq = 1, offset = 57, qk_head = 1, v_head = 3, element = 7;
  const int64_t seq_begin = p.cu_seqlens[seq], seq_end = p.cu_seqlens[seq + 1];
  const int64_t t = seq_begin + offset;
  constexpr uint16_t kBf16NaN = 0x7fc0;
  if (c.where == 'v')
    p.v[static_cast<size_t>((t * p.HV + v_head) * p.V + element)] = kBf16NaN;
  else
    (c.where == 'q' ? p.q : p.k)[static_cast<size_t>((t * p.H + qk_head) * p.K + element)] = kBf16NaN;

  const RunResult r = run_cuda(p);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const int64_t group = p.HV / p.H;
  auto hit_head = [&](int64_t hv) { return c.where == 'v' ? hv == v_head : hv / group == qk_head; };
  const int64_t first = c.where == 'q' ? t : seq_begin + offset / 16 * 16;
  const int64_t last = c.where == 'q' ? t : seq_end - 1;
  int64_t wrong = 0;
  for (int64_t tok = 0; tok < p.tokens(); ++tok)
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const bool finite = out_finite(r, p, tok, hv);
      const bool expect_bad = hit_head(hv) && tok >= first && tok <= last;
      if (finite == expect_bad && wrong++ < 8)
        ADD_FAILURE() << c.where << " " << c.plan_name << " K=" << c.head_dim << ": out of token " << tok
                      << ", value head " << hv << " is " << (finite ? "finite" : "non-finite");
    }
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      const bool expect_bad = c.where != 'q' && n == seq && hit_head(hv);
      EXPECT_NE(state_finite(r, p, n, hv), expect_bad) << c.where << " " << c.plan_name << " K=" << c.head_dim
                                    << ": final state of sequence " << n << ", value head " << hv;
    }
  EXPECT_EQ(wrong, 0);
}

INSTANTIATE_TEST_SUITE_P(Inputs, GpuNonFinite, ::testing::ValuesIn(non_finite_cases()), [](const auto& info) {
  return std::string(1, info.param.where) + "K" + std::to_string(info.param.head_dim) + "_" + info.param.plan_name;
});

// A NaN in one value head's A_log, or in one element of its dt_bias, reaches every
// gate of that head (every token's out, its final states) and nothing else: the
// gate's exp(A_log) is clamped to a finite scale, but a NaN is not clamped away.
TEST(GpuNonFiniteWeights, NaNInALogOrDtBiasStaysInItsHead) {
  SKIP_WITHOUT_GPU();
  for (const int64_t head_dim : {128, 64})
    for (const bool in_a_log : {true, false}) {
      ProblemSpec spec;
      spec.seqlens = {40, 77};
      spec.heads = 2;
      spec.v_heads = 4;
      spec.head_dim = head_dim;
      HostProblem p = make_problem(spec, 4102);
      const int64_t bad = in_a_log ? 2 : 1;
      if (in_a_log) p.A_log[static_cast<size_t>(bad)] = std::nanf("");
      else p.dt_bias[static_cast<size_t>(bad * p.K + 5)] = std::nanf("");
      const RunResult r = run_cuda(p);
      ASSERT_TRUE(r.status.ok()) << r.status.message;
      const char* what = in_a_log ? "A_log" : "dt_bias";
      int64_t wrong = 0;
      for (int64_t t = 0; t < p.tokens(); ++t)
        for (int64_t hv = 0; hv < p.HV; ++hv) {
          const bool finite = out_finite(r, p, t, hv);
          if (finite == (hv == bad) && wrong++ < 8)
            ADD_FAILURE() << "NaN in " << what << ", K = " << head_dim << ": out of token " << t << ", value head "
                          << hv << " is " << (finite ? "finite" : "non-finite");
        }
      EXPECT_EQ(wrong, 0);
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t hv = 0; hv < p.HV; ++hv) {
          EXPECT_NE(state_finite(r, p, n, hv), hv == bad) << "NaN in " << what << ", K = " << head_dim << ": final state of sequence "
                                       << n << ", value head " << hv;
        }
    }
}

// ---------------------------------------------------------------------------
// Guard bands: device-resident cu_seqlens values that break the rules.
// ---------------------------------------------------------------------------

// The first sequence n whose [c[n], c[n+1]) breaks 0 = c[0] <= ... <= c[N] = T.
int64_t first_bad_sequence(const std::vector<int64_t>& cu, int64_t T) {
  const int64_t N = static_cast<int64_t>(cu.size()) - 1;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = cu[n], e = cu[n + 1];
    if (b < 0 || e < b || e > T || (n == 0 && b != 0) || (n == N - 1 && e != T)) return n;
  }
  return -1;
}

struct BadCuSeqlens {
  const char* name;
  void (*corrupt)(std::vector<int64_t>& cu, int64_t T);
};

const BadCuSeqlens kBadCuSeqlens[] = {
    {"last_past_T", [](std::vector<int64_t>& cu, int64_t T) { cu.back() = T + 1000; }},
    {"middle_far_past_T", [](std::vector<int64_t>& cu, int64_t) { cu[2] = int64_t{1} << 40; }},
    {"decreasing", [](std::vector<int64_t>& cu, int64_t) { cu[2] = cu[1] - 10; }},
    {"first_not_zero", [](std::vector<int64_t>& cu, int64_t) { cu[0] = 7; }},
    {"negative", [](std::vector<int64_t>& cu, int64_t) { cu[1] = -50; }},
    {"last_short_of_T", [](std::vector<int64_t>& cu, int64_t T) { cu.back() = T - 5; }},
    {"all_huge", [](std::vector<int64_t>& cu, int64_t) { for (auto& x : cu) x = INT64_MAX - 3; }},
};

class GpuGuardBand : public ::testing::TestWithParam<BadCuSeqlens> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    // Valid calls of earlier tests recorded nothing (and a leftover would be read here).
    const Status s = check_device_faults(nullptr);
    EXPECT_TRUE(s.ok()) << "a fault was recorded before this test: " << s.message;
  }
  void TearDown() override { sm90::set_launch_override({}); }
};

// Runs the forward of `p` with device cu_seqlens `bad` (no host copy, so nothing is
// checked on the host), out, final_state and the workspace inside guard bands, and
// returns the sentinel bytes the call changed.
size_t forward_with_device_cu_seqlens(const HostProblem& p, const std::vector<int64_t>& bad) {
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias), init(p.init_f32);
  DeviceBuffer<int64_t> cu(bad);
  GuardedDeviceBuffer out(p.out_elems() * 2), fin(p.state_elems() * 4);
  ForwardArgs a = p.host_args(out.data(), fin.data());
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr; a.initial_state = init.ptr;
  a.cu_seqlens = cu.ptr;
  a.cu_seqlens_host = nullptr;
  size_t ws_bytes = 0;
  EXPECT_TRUE(workspace_size(a, Backend::kCuda, &ws_bytes).ok());
  GuardedDeviceBuffer ws(ws_bytes);
  const Status st = forward(a, Backend::kCuda, ws.data(), ws_bytes, nullptr);
  EXPECT_TRUE(st.ok()) << st.message;  // the host cannot see device values
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t damaged = out.damaged() + fin.damaged() + ws.damaged();
  EXPECT_EQ(out.damaged(), 0u) << "out's guard bands were written";
  EXPECT_EQ(fin.damaged(), 0u) << "final_state's guard bands were written";
  EXPECT_EQ(ws.damaged(), 0u) << "the workspace's guard bands were written";
  return damaged;
}

// Runs `p` with its device cu_seqlens broken by `c` (guard bands intact) and
// checks that the fault record names cu_seqlens and the first bad sequence;
// returns the record's message.
std::string expect_fault_from_broken_cu_seqlens(const HostProblem& p, const BadCuSeqlens& c,
                                                const std::string& label) {
  std::vector<int64_t> bad = p.cu_seqlens;
  c.corrupt(bad, p.T);
  const int64_t expect_first = first_bad_sequence(bad, p.T);
  EXPECT_GE(expect_first, 0) << label;
  forward_with_device_cu_seqlens(p, bad);
  const Status f = check_device_faults(nullptr);
  EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << label << ": " << f.message;
  EXPECT_NE(f.message.find("cu_seqlens (forward)"), std::string::npos) << label << ": " << f.message;
  EXPECT_NE(f.message.find("first at sequence " + std::to_string(expect_first) + "."), std::string::npos)
      << label << ": " << f.message;
  return f.message;
}

// Forward with cu_seqlens values broken in one way; states fp32 in and out.
TEST_P(GpuGuardBand, ForwardCuSeqlens) {
  ProblemSpec spec;
  spec.seqlens = {37, 16, 130, 5};
  spec.heads = 2;
  const HostProblem p = make_problem(spec, 51);
  const std::string message = expect_fault_from_broken_cu_seqlens(p, GetParam(), "forward");
  std::printf("[ guard ] forward %-18s guard bytes intact; check_device_faults: %s\n", GetParam().name,
              message.c_str());
  EXPECT_TRUE(check_device_faults(nullptr).ok()) << "the record is cleared by a check";
}

// The same through the segment scan (segments of 2 chunks): its segment slots
// and states are indexed by the same clamped bounds.
// At K = V = 64 too (its own instantiations of the three kernels).
TEST_P(GpuGuardBand, ForwardCuSeqlensSegmentScan) {
  for (const int64_t head_dim : {128, 64}) {
    ProblemSpec spec;
    spec.seqlens = {37, 16, 130, 5};
    spec.heads = 2;
    spec.head_dim = head_dim;
    const HostProblem p = make_problem(spec, 52);
    std::vector<int64_t> bad = p.cu_seqlens;
    GetParam().corrupt(bad, p.T);
    sm90::set_launch_override({0, 0, 2});
    forward_with_device_cu_seqlens(p, bad);
    const Status f = check_device_faults(nullptr);
    EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << "K=" << head_dim << ": " << f.message;
    EXPECT_NE(f.message.find("cu_seqlens (forward)"), std::string::npos) << f.message;
  }
}

// The same where the device plans the segments (no host copy, a long sequence
// among short ones at a few heads: LaunchPlan::device_segments). The prologue's
// set-up CTA plans from the clamped spans; the lists it writes, and the launches
// that read them, stay within the workspace the host sized.
TEST_P(GpuGuardBand, ForwardCuSeqlensDevicePlan) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const int64_t head_dim : {128, 64}) {
    ProblemSpec spec;
    spec.seqlens = {3000, 20, 40, 60, 80, 0, 100, 50, 70, 90, 30, 60};
    spec.heads = 4;
    spec.head_dim = head_dim;
    const HostProblem p = make_problem(spec, 53);
    ForwardArgs shape = p.host_args(nullptr, nullptr);
    shape.cu_seqlens_host = nullptr;
    sm90::LaunchPlan plan;
    ASSERT_TRUE(sm90::launch_plan_for(shape, sms, &plan).ok());
    ASSERT_TRUE(plan.device_segments) << "K=" << head_dim << ": a call whose segments the device plans";
    expect_fault_from_broken_cu_seqlens(p, GetParam(), "device plan K=" + std::to_string(head_dim));
  }
}

void PrintTo(const BadCuSeqlens& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(Cases, GpuGuardBand, ::testing::ValuesIn(kBadCuSeqlens),
                         [](const auto& info) { return std::string(info.param.name); });

// The record lives in module globals, placed anew with every context: after a
// cudaDeviceReset the kernels record into the new context's record, and nothing
// lands where the old one was (an address cached across the reset would).
TEST(GpuDeviceFaults, RecordSurvivesDeviceReset) {
  SKIP_WITHOUT_GPU();
  ProblemSpec spec;
  spec.seqlens = {37, 16, 130, 5};
  spec.heads = 2;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) FKDA_CUDA_CHECK(cudaDeviceReset());  // after round 0's buffers are freed
    const HostProblem p = make_problem(spec, 53 + round);
    std::vector<int64_t> bad = p.cu_seqlens;
    bad.back() = p.T + 77;
    EXPECT_EQ(forward_with_device_cu_seqlens(p, bad), 0u) << round;
    const Status f = check_device_faults(nullptr);
    EXPECT_NE(f.message.find("first at sequence 3."), std::string::npos) << round << ": " << f.message;
  }
}

// A valid varlen call records nothing, on a non-default stream too.
TEST(GpuDeviceFaults, ValidCallsRecordNothing) {
  SKIP_WITHOUT_GPU();
  ASSERT_TRUE(check_device_faults(nullptr).ok());
  ProblemSpec spec;
  spec.seqlens = {0, 37, 16, 0, 130, 5};
  spec.heads = 2;
  const HostProblem p = make_problem(spec, 52);
  cudaStream_t s = nullptr;
  FKDA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const RunResult r = run_cuda(p, s);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const Status f = check_device_faults(s);
  FKDA_CUDA_CHECK(cudaStreamDestroy(s));
  EXPECT_TRUE(f.ok()) << f.message;
}

#endif  // FLASHKDA_WITH_CUDA

TEST(GpuRobustness, SkippedWithoutCudaBuild) {
#ifdef FLASHKDA_WITH_CUDA
  GTEST_SKIP() << "CUDA build: the GPU robustness tests above run (or skip for lack of a device)";
#else
  // The check has nothing to report in a build without kernels.
  EXPECT_TRUE(check_device_faults(nullptr).ok());
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

}  // namespace
}  // namespace flashkda::testing
