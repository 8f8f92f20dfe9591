// GPU forward vs the float64 oracle (label "gpu"). Skips, saying why, when the
// CUDA backend is not built or no sm_90 device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/common/huge_rows.h"
#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include <ostream>

#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {
// How gtest prints a launch-plan parameter (found by argument-dependent lookup).
inline void PrintTo(const LaunchOverride& o, std::ostream* os) {
  *os << "v_split " << o.v_split << ", stages " << o.stages << ", records " << o.records;
}
}  // namespace flashkda::sm90
#endif

namespace flashkda::testing {
namespace {



#ifdef FLASHKDA_WITH_CUDA

uint64_t fresh_seed() {
  static uint64_t counter = 0;
  return std::random_device{}() ^ (++counter * 0x9e3779b97f4a7c15ull);
}

struct Errors {
  double out = 0, state = 0;
};

// The relative RMS errors of a GPU result against the oracle (on `check_heads`
// if non-empty); every output element must have been written.
Errors judge(const HostProblem& p, const RunResult& gpu, const std::vector<int64_t>& check_heads = {}) {
  const ProblemSpec& spec = p.spec;
  EXPECT_TRUE(gpu.status.ok()) << gpu.status.message;
  if (!gpu.status.ok()) return {NAN, NAN};
  std::vector<float> out = gpu.out, state = gpu.final_state;
  HostProblem ref_problem = p;
  if (!check_heads.empty()) {
    ref_problem = slice_heads(p, check_heads);
    out = slice_result(gpu.out, p.B * p.T, p.HV, check_heads, p.V);
    if (!state.empty()) state = slice_result(gpu.final_state, p.N, p.HV, check_heads, p.V * p.K);
  }
  const OracleResult ref = run_oracle(ref_problem);
  Errors e;
  e.out = out.empty() ? 0.0 : rel_rms(out.data(), ref.out.data(), out.size());
  e.state = state.empty() ? 0.0 : rel_rms(state.data(), ref.final_state.data(), state.size());
  std::printf("[ errors ] T=%lld N=%lld H=%lld HV=%lld K=%lld init=%s final=%s: out %.3e  state %.3e\n",
              static_cast<long long>(p.T), static_cast<long long>(p.N), static_cast<long long>(p.H),
              static_cast<long long>(p.HV), static_cast<long long>(p.K), to_string(spec.initial_state),
              to_string(spec.final_state), e.out, e.state);
  return e;
}

Errors check_against_oracle(const ProblemSpec& spec, const std::vector<int64_t>& check_heads = {}) {
  const HostProblem p = make_problem(spec, fresh_seed());
  return judge(p, run_cuda(p), check_heads);
}

void expect_within_bars(const Errors& e, const ProblemSpec& spec) {
  const bool bf16_state = spec.initial_state == DType::kBF16 || spec.final_state == DType::kBF16;
  EXPECT_LE(e.out, bf16_state ? kBf16StateBar : kOutBar);
  if (spec.final_state != DType::kNone) EXPECT_LE(e.state, bf16_state ? kBf16StateBar : kStateBar);
}

ProblemSpec fixed(int64_t T, int64_t H, int64_t B = 1, int64_t head_dim = 128) {
  ProblemSpec s;
  s.batch = B;
  s.seqlen = T;
  s.heads = H;
  s.head_dim = head_dim;
  return s;
}

// K = V = 64 runs its own instantiations (shared_storage.cuh); the suites below
// that take a head dim run both.
const auto kHeadDims = ::testing::Values(int64_t{128}, int64_t{64});

class GpuForward : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

class GpuForwardLength : public GpuForward, public ::testing::WithParamInterface<std::tuple<int64_t, int64_t>> {};

TEST_P(GpuForwardLength, MatchesOracleH4) {
  const ProblemSpec spec = fixed(std::get<0>(GetParam()), 4, 1, std::get<1>(GetParam()));
  expect_within_bars(check_against_oracle(spec), spec);
}
INSTANTIATE_TEST_SUITE_P(Lengths, GpuForwardLength,
                         ::testing::Combine(::testing::Values(1, 15, 16, 17, 1000, 1024, 8192), kHeadDims),
                         [](const auto& info) {
                           return "T" + std::to_string(std::get<0>(info.param)) + "_K" +
                                  std::to_string(std::get<1>(info.param));
                         });

// p (K = V = 64) at K = V = 128: its inputs in the first 64 columns, zeros after
// (dt_bias too, and the states' rows and columns past 64); the same A_log, beta
// and scale (1/8).
HostProblem zero_padded_to_128(const HostProblem& p) {
  constexpr int64_t kFrom = 64, kTo = 128;
  HostProblem w = p;
  w.spec.head_dim = kTo;
  w.K = w.V = kTo;
  auto pad_rows = [](const auto& src, auto& dst, int64_t rows) {
    dst.assign(static_cast<size_t>(rows * kTo), {});
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src.begin() + r * kFrom, kFrom, dst.begin() + r * kTo);
  };
  auto pad_states = [&](const auto& src, auto& dst) {  // [N, HV, 64, 64] -> [N, HV, 128, 128]
    if (src.empty()) return;
    dst.assign(static_cast<size_t>(p.N * p.HV * kTo * kTo), {});
    for (int64_t nh = 0; nh < p.N * p.HV; ++nh)
      for (int64_t i = 0; i < kFrom; ++i)
        std::copy_n(src.begin() + (nh * kFrom + i) * kFrom, kFrom, dst.begin() + (nh * kTo + i) * kTo);
  };
  const int64_t BT = p.B * p.T;
  pad_rows(p.q, w.q, BT * p.H);
  pad_rows(p.k, w.k, BT * p.H);
  pad_rows(p.v, w.v, BT * p.HV);
  pad_rows(p.g, w.g, BT * p.HV);
  pad_rows(p.dt_bias, w.dt_bias, p.HV);
  pad_states(p.init_f32, w.init_f32);
  pad_states(p.init_bf16, w.init_bf16);
  return w;
}

// K = V = 64 runs the 128-wide tiles on zero-padded columns (shared_storage.cuh):
// the same arithmetic as the 128 kernels on zero-padded inputs, so the same bits
// in the first 64 values and keys, and zeros after. That holds for one chain and
// for the segment scan's passes 1 and 3, but not for its composition: an
// element's K products there are summed as four key quarters (ComposeQuarters),
// 16 keys each at K = 64 and 32 at K = 128, so the two group the same exact
// products differently. With segments the results are therefore compared to
// fp32 rounding: the state's relative RMS difference, and out within one bf16
// ulp an element (the padding stays exactly zero either way).
TEST_F(GpuForward, HeadDim64IsThe128RunOnZeroPaddedInputs) {
  ProblemSpec spec;
  spec.seqlens = {300, 0, 17, 700};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 64;
  const HostProblem p = make_problem(spec, fresh_seed());
  const HostProblem w = zero_padded_to_128(p);
  for (const int64_t seg : {int64_t{-1}, int64_t{3}}) {
    const bool bitwise = seg < 0;  // one chain: no composition
    sm90::set_launch_override({2, 4, seg});  // 4-warp CTAs, 4 stages, as K = 64 runs
    const RunResult a = run_cuda(p), b = run_cuda(w);
    ASSERT_TRUE(a.status.ok()) << a.status.message;
    ASSERT_TRUE(b.status.ok()) << b.status.message;
    size_t out_diff = 0, out_far = 0, out_pad = 0, state_diff = 0, state_pad = 0;
    for (int64_t r = 0; r < p.tokens() * p.HV; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        if (c < 64) {
          const float x = a.out[r * 64 + c], y = b.out[r * 128 + c];
          const bool differ = a.out_bits[r * 64 + c] != b.out_bits[r * 128 + c];
          out_diff += differ;
          // One bf16 ulp of the larger: 2^-7 of it at most.
          out_far += differ && !(std::fabs(x - y) <= 0x1p-7f * std::max(std::fabs(x), std::fabs(y)));
        } else {
          out_pad += b.out[r * 128 + c] != 0.f;
        }
      }
    std::vector<float> sa, sb;  // the 64 x 64 blocks, side by side
    for (int64_t nh = 0; nh < p.N * p.HV; ++nh)
      for (int64_t i = 0; i < 128; ++i)
        for (int64_t j = 0; j < 128; ++j) {
          const float x = b.final_state[(nh * 128 + i) * 128 + j];
          if (i < 64 && j < 64) {
            sa.push_back(a.final_state[(nh * 64 + i) * 64 + j]);
            sb.push_back(x);
            state_diff += sa.back() != x;  // == : +0 and -0 alike
          } else {
            state_pad += x != 0.f;
          }
        }
    EXPECT_EQ(out_pad, 0u) << "seg " << seg << ": the padded 128 run's values past 64";
    EXPECT_EQ(state_pad, 0u) << "seg " << seg << ": the padded 128 run's state past 64";
    if (bitwise) {
      EXPECT_EQ(out_diff, 0u) << "seg " << seg;
      EXPECT_EQ(state_diff, 0u) << "seg " << seg;
    } else {
      const double state_err = rel_rms(sa, sb);
      std::printf("[ errors ] K=64 against the padded 128 run, segments of %lld chunks: %zu of %zu out values differ "
                  "(%zu by more than a bf16 ulp), %zu of %zu state values, relative RMS %.2e\n",
                  static_cast<long long>(seg), out_diff, static_cast<size_t>(p.tokens() * p.HV * 64), out_far,
                  state_diff, sa.size(), state_err);
      EXPECT_EQ(out_far, 0u) << "seg " << seg;
      EXPECT_LE(state_err, 1e-6) << "seg " << seg;  // fp32 rounding of the composition's sums, ~6e-8 a step
    }
  }
}

// exp(A_log) past fp32's range (A_log = 100, and inf): the kernels see inf, the
// gates saturate; the padding columns of K = 64 must stay finite (their gate does
// not read A_log). Where g + dt_bias is exactly 0 the gate is sigmoid(0), not
// sigmoid(inf · 0) = NaN (common/gate.h), as in the float64 oracle.
TEST_F(GpuForward, HeadDim64WithOverflowingExpALog) {
  for (const int64_t head_dim : {128, 64}) {
    for (const float a_log : {100.f, std::numeric_limits<float>::infinity()}) {
      const ProblemSpec spec = fixed(300, 2, 1, head_dim);
      HostProblem p = make_problem(spec, fresh_seed());
      for (auto& a : p.A_log) a = a_log;
      for (int64_t t = 0; t < 300; t += 7) p.g[static_cast<size_t>((t * 2 + 1) * head_dim + 5)] = 0;  // head 1, col 5
      p.dt_bias[static_cast<size_t>(head_dim + 5)] = 0.f;
      SCOPED_TRACE("K = " + std::to_string(head_dim) + ", A_log = " + std::to_string(a_log));
      expect_within_bars(judge(p, run_cuda(p)), spec);
    }
  }
}

// Rows of q and k whose fp32 squared norm overflows (huge_rows.h): the
// prologue sums them again at a scale (sm90/kernel/huge_rows.cuh), where they
// read as zero before. One chain and the superposed segments (12 heads, long),
// K = 128 and 64.
TEST_F(GpuForward, RowsWhoseSquaresOverflowFp32) {
  for (const int64_t head_dim : {128, 64}) {
    for (const int64_t T : {300, 20000}) {
      const int64_t H = T > 1000 ? 12 : 2;
      const ProblemSpec spec = fixed(T, H, 1, head_dim);
      HostProblem p = make_problem(spec, fresh_seed());
      // Rows are (token, head) pairs: q in head 0, k in head 1, in the first chunks
      // and (T = 20000) in a late one.
      make_rows_huge(p.q, head_dim, 3 * H, 17 * H, (T - 7) * H);
      make_rows_huge(p.k, head_dim, 4 * H + 1, 16 * H + 1, (T - 9) * H + 1);
      SCOPED_TRACE("K = " + std::to_string(head_dim) + ", T = " + std::to_string(T));
      expect_within_bars(judge(p, run_cuda(p), {0, 1}), spec);
    }
  }
}

// K = V = 64 on the shapes the 128 tests above cover one by one: many heads
// (sampled), batched, varlen with empty and partial sequences, grouped value heads.
TEST_F(GpuForward, HeadDim64Shapes) {
  expect_within_bars(check_against_oracle(fixed(2048, 64, 1, 64), {0, 31, 63}), fixed(2048, 64, 1, 64));
  expect_within_bars(check_against_oracle(fixed(333, 4, 3, 64)), fixed(333, 4, 3, 64));
  ProblemSpec varlen;
  varlen.seqlens = {0, 1, 15, 17, 2000, 0, 16, 33};
  varlen.heads = 2;
  varlen.v_heads = 6;
  varlen.head_dim = 64;
  expect_within_bars(check_against_oracle(varlen), varlen);
}

TEST_F(GpuForward, SingleHead) {
  const ProblemSpec spec = fixed(1000, 1);
  expect_within_bars(check_against_oracle(spec), spec);
}

TEST_F(GpuForward, NinetySixHeadsSampled) {
  const ProblemSpec spec = fixed(1024, 96);
  expect_within_bars(check_against_oracle(spec, {0, 17, 50, 95}), spec);
}

TEST_F(GpuForward, NinetySixHeadsLongSampled) {
  const ProblemSpec spec = fixed(8192, 96);
  expect_within_bars(check_against_oracle(spec, {3, 64}), spec);
}

TEST_F(GpuForward, Batched) {
  const ProblemSpec spec = fixed(333, 4, /*B=*/3);
  expect_within_bars(check_against_oracle(spec), spec);
}

TEST_F(GpuForward, VarlenWithEmptyAndShortSequences) {
  ProblemSpec spec;
  spec.seqlens = {0, 1, 15, 17, 2000, 0, 16, 33};
  spec.heads = 4;
  expect_within_bars(check_against_oracle(spec), spec);
}

TEST_F(GpuForward, VarlenSpecCase) {
  ProblemSpec spec;
  spec.seqlens = {300, 17, 700};
  spec.heads = 4;
  expect_within_bars(check_against_oracle(spec), spec);
}

// A varlen batch's one-pass recurrence runs its sequences longest first (the
// prologue's counting sort, tile_scheduler.cuh): more sequences than that CTA
// has threads, lengths in the exact bins and in the bins of an octave above 128
// chunks, empty ones, and many of one length (whose places follow the atomics):
// every sequence against the oracle, and the same bits from a second call.
TEST_F(GpuForward, VarlenManySequencesRunLongestFirst) {
  sm90::set_launch_override({0, 0, -1});  // one pass: the order is not used by the segment scan
  for (const int64_t head_dim : {int64_t{128}, int64_t{64}}) {
    ProblemSpec spec;
    const uint64_t seed = fresh_seed();
    for (int i = 0; i < 300; ++i)
      spec.seqlens.push_back(i % 7 == 0 ? 0 : i % 3 == 0 ? 16 : 1 + static_cast<int64_t>((seed >> (i % 40)) % 70));
    spec.seqlens[17] = 2300;   // 144 chunks
    spec.seqlens[123] = 2100;  // 132 chunks: the same octave, another step
    spec.seqlens[299] = 4111;  // the longest, last
    spec.heads = 2;
    spec.head_dim = head_dim;
    const HostProblem p = make_problem(spec, seed);
    const RunResult a = run_cuda(p), b = run_cuda(p);
    ASSERT_TRUE(b.status.ok()) << b.status.message;
    EXPECT_EQ(a.out_bits, b.out_bits) << "K = " << head_dim;
    EXPECT_EQ(a.state_bytes, b.state_bytes) << "K = " << head_dim;
    expect_within_bars(judge(p, a), spec);
  }
}

// The order itself (the workspace's last N int32, after the records:
// sm90_forward.cu): a permutation of the sequences whose sort keys never increase
// (the chunk count below 128 chunks; above, its octave and 1/16 step), for a batch
// of ties, empty sequences and lengths in both ranges, in shuffled order.
int64_t order_key(int64_t chunks) {
  if (chunks < 128) return chunks;
  int octave = 63;
  while (!((chunks >> octave) & 1)) --octave;
  return 128 + (octave - 7) * 16 + ((chunks >> (octave - 4)) & 15);
}
TEST_F(GpuForward, VarlenOrderIsLongestFirstPermutation) {
  sm90::set_launch_override({0, 0, -1});
  ProblemSpec spec;
  const uint64_t seed = fresh_seed();
  for (int i = 0; i < 700; ++i)
    spec.seqlens.push_back(i % 11 == 0 ? 0 : i % 5 == 0 ? 48 : 1 + static_cast<int64_t>((seed >> (i % 37)) % 300));
  for (const int i : {5, 222, 640}) spec.seqlens[i] = 2100 + 20 * i;  // 138, 409 and 932 chunks
  spec.heads = 1;
  spec.initial_state = spec.final_state = DType::kNone;
  const HostProblem p = make_problem(spec, seed);
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(p.out_elems());
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  ForwardArgs a = p.host_args(out.ptr, nullptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
  a.cu_seqlens = cu.ptr;
  size_t ws_bytes = 0;
  ASSERT_TRUE(workspace_size(a, Backend::kCuda, &ws_bytes).ok());
  const size_t order_bytes = static_cast<size_t>(p.N) * sizeof(int32_t);
  ASSERT_GT(ws_bytes, order_bytes);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  const Status st = forward(a, Backend::kCuda, ws.ptr, ws_bytes, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  std::vector<int32_t> order(static_cast<size_t>(p.N));
  FKDA_CUDA_CHECK(cudaMemcpy(order.data(), ws.ptr + ws_bytes - order_bytes, order_bytes, cudaMemcpyDeviceToHost));
  std::vector<int32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int32_t i = 0; i < static_cast<int32_t>(p.N); ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i) << "not a permutation";
  auto key = [&](int32_t n) { return order_key((spec.seqlens[static_cast<size_t>(n)] + 15) / 16); };
  for (size_t i = 1; i < order.size(); ++i)
    ASSERT_GE(key(order[i - 1]), key(order[i])) << "place " << i << ": sequence " << order[i] << " after " << order[i - 1];
  EXPECT_EQ(order[0], 640);  // the longest
}

TEST_F(GpuForward, GroupedValueHeads) {
  ProblemSpec spec = fixed(500, 2);
  spec.v_heads = 6;
  expect_within_bars(check_against_oracle(spec), spec);
}

class GpuForwardStates : public GpuForward,
                         public ::testing::WithParamInterface<std::tuple<std::tuple<DType, DType>, int64_t>> {};

TEST_P(GpuForwardStates, EveryStateDtypeCombination) {
  ProblemSpec spec = fixed(300, 4, 1, std::get<1>(GetParam()));
  spec.initial_state = std::get<0>(std::get<0>(GetParam()));
  spec.final_state = std::get<1>(std::get<0>(GetParam()));
  expect_within_bars(check_against_oracle(spec), spec);
}
// The API's state rule: each state bf16, fp32 or absent, the same dtype when both are given.
INSTANTIATE_TEST_SUITE_P(States, GpuForwardStates,
                         ::testing::Combine(::testing::Values(std::make_tuple(DType::kNone, DType::kNone),
                                                              std::make_tuple(DType::kNone, DType::kBF16),
                                                              std::make_tuple(DType::kNone, DType::kFP32),
                                                              std::make_tuple(DType::kBF16, DType::kNone),
                                                              std::make_tuple(DType::kFP32, DType::kNone),
                                                              std::make_tuple(DType::kBF16, DType::kBF16),
                                                              std::make_tuple(DType::kFP32, DType::kFP32)),
                                            kHeadDims));

class GpuForwardPlan : public GpuForward, public ::testing::WithParamInterface<sm90::LaunchOverride> {};

// Every recurrence instantiation (V split over 1 or 2 CTAs; 4 or 3 stages;
// 4-warp CTAs loading records by cp.async or by bulk copy) computes the same
// thing, on sequences that end mid-chunk and one of length 1.
TEST_P(GpuForwardPlan, EveryLaunchPlanMatchesOracle) {
  sm90::set_launch_override(GetParam());
  ProblemSpec spec;
  spec.seqlens = {100, 1, 250};
  spec.heads = 3;
  expect_within_bars(check_against_oracle(spec), spec);
}
INSTANTIATE_TEST_SUITE_P(Plans, GpuForwardPlan,
                         ::testing::Values(sm90::LaunchOverride{1, 4}, sm90::LaunchOverride{2, 4, 0, 1},
                                           sm90::LaunchOverride{2, 4, 0, 2}, sm90::LaunchOverride{2, 3}),
                         [](const ::testing::TestParamInfo<sm90::LaunchOverride>& info) {
                           const int rec = info.param.records;
                           return "vsplit" + std::to_string(info.param.v_split) + "_stages" +
                                  std::to_string(info.param.stages) +
                                  (rec == 1 ? "_cp_async" : rec == 2 ? "_bulk_copy" : "");
                         });

// The two ways a 4-warp CTA loads its records (cp.async, or one bulk copy on an
// mbarrier: sm90_forward.cu picks by whether CTAs share SMs) put the same bytes
// in shared memory: the same bits out, one chain or segments.
TEST_F(GpuForward, RecordsByBulkCopyOrCpAsyncGiveTheSameBits) {
  ProblemSpec spec;
  spec.seqlens = {400, 17, 1, 900};
  spec.heads = 2;
  spec.v_heads = 4;
  const HostProblem p = make_problem(spec, fresh_seed());
  for (const int64_t seg : {int64_t{-1}, int64_t{5}}) {
    sm90::set_launch_override({2, 4, seg, 1});
    const RunResult a = run_cuda(p);
    sm90::set_launch_override({2, 4, seg, 2});
    const RunResult b = run_cuda(p);
    ASSERT_TRUE(a.status.ok()) << a.status.message;
    ASSERT_TRUE(b.status.ok()) << b.status.message;
    EXPECT_EQ(a.out_bits, b.out_bits) << "segments of " << seg;
    EXPECT_EQ(a.state_bytes, b.state_bytes) << "segments of " << seg;
    expect_within_bars(judge(p, b), spec);
  }
}

// Captured in a CUDA graph on a non-default stream and replayed three times on
// one workspace: the same bits as a direct call.
TEST_F(GpuForward, GraphReplayMatchesDirectCall) {
  ProblemSpec spec;
  spec.seqlens = {500, 33, 1};
  spec.heads = 4;
  const HostProblem p = make_problem(spec, fresh_seed());
  const RunResult direct = run_cuda(p), replayed = run_cuda(p, nullptr, 3);
  ASSERT_TRUE(replayed.status.ok()) << replayed.status.message;
  EXPECT_EQ(direct.out_bits, replayed.out_bits);
  EXPECT_EQ(direct.state_bytes, replayed.state_bytes);
  expect_within_bars(judge(p, replayed), spec);
}

TEST_F(GpuForward, SameCallTwiceIsBitwiseIdentical) {
  ProblemSpec spec;
  spec.seqlens = {700, 3, 1200};
  spec.heads = 8;
  const HostProblem p = make_problem(spec, fresh_seed());
  const RunResult a = run_cuda(p), b = run_cuda(p);
  ASSERT_TRUE(a.status.ok()) << a.status.message;
  ASSERT_TRUE(b.status.ok()) << b.status.message;
  EXPECT_EQ(a.out_bits, b.out_bits);
  EXPECT_EQ(a.state_bytes, b.state_bytes);
}

// The kernels' dynamic shared memory limits are raised once per device and
// remembered (sm90/fwd_launch.h); cudaDeviceReset() destroys the context that
// held them, and the next call must raise them again rather than fail.
TEST_F(GpuForward, EveryLaunchPlanRunsAgainAfterDeviceReset) {
  ProblemSpec spec;
  spec.seqlens = {40, 3};
  spec.heads = 2;
  const HostProblem p = make_problem(spec, fresh_seed());
  for (const sm90::LaunchOverride plan : {sm90::LaunchOverride{1, 0}, sm90::LaunchOverride{2, 3},
                                          sm90::LaunchOverride{2, 4, 0, 1}, sm90::LaunchOverride{2, 4, 0, 2}}) {
    sm90::set_launch_override(plan);
    const RunResult before = run_cuda(p);
    ASSERT_TRUE(before.status.ok()) << before.status.message;
    ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
    const RunResult after = run_cuda(p);
    ASSERT_TRUE(after.status.ok()) << "v_split " << plan.v_split << ", stages " << plan.stages << ": "
                                   << after.status.message;
    EXPECT_EQ(before.out_bits, after.out_bits);
    EXPECT_EQ(before.state_bytes, after.state_bytes);
  }
}

TEST_F(GpuForward, UnsupportedHeadDimIsRejectedWithMessage) {
  ProblemSpec spec = fixed(32, 2);
  spec.head_dim = 96;  // K = V = 64 and 128 run
  const HostProblem p = make_problem(spec, 1);
  const RunResult r = run_cuda(p);
  EXPECT_EQ(r.status.code, StatusCode::kNotSupported);
  EXPECT_NE(r.status.message.find("head_dim"), std::string::npos) << r.status.message;
}

// Limits of the kernels' 32-bit address steps, refused by name before any launch:
// strides of 2^31 elements or more, and 2^20 value heads or more.
TEST_F(GpuForward, OutOfRangeStridesAndValueHeadsAreRejectedWithMessage) {
  const HostProblem p = make_problem(fixed(32, 2), 2);
  // Validation never dereferences these; the outputs get addresses of their own
  // (validate() refuses an output that shares memory with another argument).
  void* const fake = reinterpret_cast<void*>(uintptr_t{1} << 30);
  ForwardArgs a = p.host_args(reinterpret_cast<void*>(uintptr_t{1} << 31), reinterpret_cast<void*>(uintptr_t{1} << 32));
  a.q = a.k = a.v = a.g = a.beta = fake;
  a.A_log = a.dt_bias = static_cast<const float*>(fake);
  a.initial_state = fake;
  ASSERT_TRUE(validate(a, Backend::kCuda).ok());
  ForwardArgs s = a;
  s.g_token_stride = int64_t{1} << 31;
  Status st = validate(s, Backend::kCuda);
  EXPECT_EQ(st.code, StatusCode::kNotSupported) << st.message;
  EXPECT_NE(st.message.find("g_token_stride: the CUDA backend needs strides below 2^31"), std::string::npos)
      << st.message;
  ForwardArgs h = a;
  h.num_heads = 32;  // 2^15 value heads per q/k head: within the per-head limit
  h.num_v_heads = int64_t{1} << 20;
  h.seqlen = 0;  // no tokens: only the head count is out of range
  h.initial_state = h.final_state = nullptr;
  h.initial_state_dtype = h.final_state_dtype = DType::kNone;
  st = validate(h, Backend::kCuda);
  EXPECT_EQ(st.code, StatusCode::kNotSupported) << st.message;
  EXPECT_NE(st.message.find("num_v_heads: the CUDA backend supports fewer than 2^20 value heads"),
            std::string::npos)
      << st.message;
}

TEST_F(GpuForward, NanInOneSequencePropagatesOnlyThere) {
  ProblemSpec spec;
  spec.seqlens = {40, 40};
  spec.heads = 2;
  HostProblem p = make_problem(spec, fresh_seed());
  p.q[(5 * p.H + 0) * p.K + 3] = 0x7fc0;  // NaN in token 5 (sequence 0), head 0
  const RunResult r = run_cuda(p);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  // token 5, head 0 of sequence 0 is NaN; sequence 1 is untouched and finite.
  EXPECT_TRUE(std::isnan(r.out[(5 * p.HV + 0) * p.V]));
  for (int64_t t = 40; t < 80; ++t)
    for (int64_t h = 0; h < p.HV; ++h)
      for (int64_t v = 0; v < p.V; ++v) ASSERT_TRUE(std::isfinite(r.out[(t * p.HV + h) * p.V + v]));
}

// The launch heuristic is host code: it runs (and is checked) without a GPU.
// Shapes of the standard table on a 132-SM H200, and what it must choose there
// (docs/perf-log.md): one 8-warp CTA per (sequence, head) where each gets an SM
// or where there are at least three chains an SM of 16 chunks or more on
// average, else two 4-warp CTAs; for those, three stages only when the total
// work, not the longest chain, bounds the kernel.
ForwardArgs shape_args(int64_t heads, std::vector<int64_t>* cu, bool with_host_copy) {
  ForwardArgs a;
  a.num_heads = heads;
  a.head_dim_k = a.head_dim_v = 128;
  if (cu->size() == 2 && !with_host_copy) {  // one batch row: no cu_seqlens
    a.batch = 1;
    a.seqlen = (*cu)[1];
    return a;
  }
  a.batch = 1;
  a.seqlen = cu->back();
  a.num_seqs = static_cast<int64_t>(cu->size()) - 1;
  a.cu_seqlens = cu->data();  // never dereferenced on the device by these checks
  a.cu_seqlens_host = with_host_copy ? cu->data() : nullptr;
  return a;
}

TEST(GpuForwardLaunchPlan, StandardTableOnAnH200) {
  constexpr int kSms = 132;
  std::vector<int64_t> single = {0, 8192};
  std::vector<int64_t> varlen6 = {0, 1300, 1847, 3895, 4858, 5129, 8192};
  std::vector<int64_t> eight = {0};
  for (int i = 0; i < 8; ++i) eight.push_back(eight.back() + 1024);
  for (int64_t heads : {96, 64}) {
    // One sequence: 96 chains get an SM each as one 8-warp CTA (two 4-warp CTAs
    // would double up on 60 SMs); 64 chains get an SM each as 4-warp CTAs.
    const auto p8192 = sm90::choose_launch_plan(sm90::problem_shape(shape_args(heads, &single, false)), kSms);
    EXPECT_EQ(p8192.v_split, heads == 96 ? 1 : 2);
    EXPECT_EQ(p8192.stages, 4);
    // Few heads (tensor-parallel serving): every chain gets its own SMs, split.
    const auto tp = sm90::choose_launch_plan(sm90::problem_shape(shape_args(heads / 8, &single, false)), kSms);
    EXPECT_EQ(tp.v_split, 2);
    // varlen-6: 576 chains of 86 chunks on average at H = 96 (an 8-warp CTA
    // each), 384 at H = 64 (under three an SM: 4-warp CTAs); the longest
    // sequence bounds the kernel.
    const auto pv = sm90::choose_launch_plan(sm90::problem_shape(shape_args(heads, &varlen6, true)), kSms);
    EXPECT_EQ(pv.v_split, heads == 96 ? 1 : 2);
    EXPECT_EQ(pv.stages, 4);
  }
  // 8 x 1024 as a batch: 768 and 512 chains of 64 chunks, an 8-warp CTA each.
  ForwardArgs batch8;
  batch8.batch = 8;
  batch8.seqlen = 1024;
  batch8.head_dim_k = batch8.head_dim_v = 128;
  for (int64_t heads : {96, 64}) {
    batch8.num_heads = heads;
    const auto p = sm90::choose_launch_plan(sm90::problem_shape(batch8), kSms);
    EXPECT_EQ(p.v_split, 1) << heads;
    EXPECT_EQ(p.stages, 4) << heads;
  }
  // 64 x 128 (a chunked prefill's batch): chains of 8 chunks, 4-warp CTAs; at
  // H = 96 the total work bounds the kernel (three stages), at H = 8 the chain does.
  ForwardArgs short_batch;
  short_batch.batch = 64;
  short_batch.seqlen = 128;
  short_batch.head_dim_k = short_batch.head_dim_v = 128;
  short_batch.num_heads = 96;
  EXPECT_EQ(sm90::choose_launch_plan(sm90::problem_shape(short_batch), kSms).v_split, 2);
  EXPECT_EQ(sm90::choose_launch_plan(sm90::problem_shape(short_batch), kSms).stages, 3);
  short_batch.num_heads = 8;
  EXPECT_EQ(sm90::choose_launch_plan(sm90::problem_shape(short_batch), kSms).stages, 4);
  // Varlen without a host copy of cu_seqlens: the longest sequence is unknown, so
  // the chain is assumed to bound the kernel (the same 64 x 128 as above: four
  // stages); the average length is known from the shapes.
  std::vector<int64_t> short64 = {0};
  for (int i = 0; i < 64; ++i) short64.push_back(short64.back() + 128);
  const auto unknown = sm90::choose_launch_plan(sm90::problem_shape(shape_args(96, &short64, false)), kSms);
  EXPECT_EQ(unknown.v_split, 2);
  EXPECT_EQ(unknown.stages, 4);
  const auto unknown8 = sm90::choose_launch_plan(sm90::problem_shape(shape_args(96, &eight, false)), kSms);
  EXPECT_EQ(unknown8.v_split, 1);
  EXPECT_EQ(unknown8.stages, 4);
}

// Checkpoint calls take the entry storer where the sequences average at least 16
// chunks: the standard table's rows (64-512 chunks a sequence), not a chunked
// prefill's batch of short sequences, where its warpgroup cost more than it saved.
TEST(GpuForwardLaunchPlan, EntryStorerWhereSequencesAreLong) {
  std::vector<int64_t> varlen6 = {0, 1300, 1847, 3895, 4858, 5129, 8192};
  std::vector<int64_t> short64 = {0};
  for (int i = 0; i < 64; ++i) short64.push_back(short64.back() + 128);
  std::vector<int64_t> at_floor = {0};  // 16 sequences of 256 tokens: 16 chunks each
  for (int i = 0; i < 16; ++i) at_floor.push_back(at_floor.back() + 256);
  std::vector<int64_t> under_floor = at_floor;
  under_floor.back() -= 16;  // one chunk fewer in all
  auto storer = [](const ForwardArgs& a) { return sm90::choose_launch_plan(sm90::problem_shape(a), 132).entry_storer; };
  EXPECT_TRUE(storer(shape_args(96, &varlen6, true)));
  EXPECT_TRUE(storer(shape_args(96, &varlen6, false)));
  EXPECT_FALSE(storer(shape_args(96, &short64, true)));
  EXPECT_FALSE(storer(shape_args(96, &short64, false)));
  EXPECT_TRUE(storer(shape_args(64, &at_floor, true)));
  EXPECT_FALSE(storer(shape_args(64, &under_floor, true)));
  ForwardArgs batch8;
  batch8.batch = 8;
  batch8.seqlen = 1024;
  batch8.num_heads = 96;
  batch8.head_dim_k = batch8.head_dim_v = 128;
  EXPECT_TRUE(storer(batch8));
  batch8.batch = 1024;
  batch8.seqlen = 64;
  EXPECT_FALSE(storer(batch8));
}

TEST(GpuForwardLaunchPlan, OverrideReplacesOnlyTheFieldsGiven) {
  ForwardArgs a;  // 64 x 128 at H = 96: two 4-warp CTAs, three stages by default
  a.batch = 64;
  a.seqlen = 128;
  a.num_heads = 96;
  a.head_dim_k = a.head_dim_v = 128;
  const sm90::ProblemShape shape = sm90::problem_shape(a);
  sm90::set_launch_override({1, 0});
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).v_split, 1);
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).stages, 4);  // only the 4-warp variant has 3 stages
  sm90::set_launch_override({0, 4});  // the stages only: the default's 3 replaced, its V split kept
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).v_split, 2);
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).stages, 4);
  EXPECT_FALSE(sm90::effective_launch_plan(shape, 132).entry_storer);  // 8 chunks a sequence
  sm90::LaunchOverride storer;
  storer.entry_storer = 2;
  sm90::set_launch_override(storer);
  EXPECT_TRUE(sm90::effective_launch_plan(shape, 132).entry_storer);
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).stages, 3);  // the rest the default's
  sm90::set_launch_override({});
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).stages, 3);
  EXPECT_EQ(sm90::effective_launch_plan(shape, 132).stages, sm90::choose_launch_plan(shape, 132).stages);
}

#else  // !FLASHKDA_WITH_CUDA

TEST(GpuForward, SkippedWithoutCudaBuild) {
  SKIP_WITHOUT_GPU();
  FAIL() << "cuda_backend_available() is true in a build without CUDA";
}

#endif

}  // namespace
}  // namespace flashkda::testing
