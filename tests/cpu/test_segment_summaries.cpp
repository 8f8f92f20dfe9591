// The public segment-summary API (flashkda.h, "Segment summaries") on the CPU
// backends: summaries of segments of several sequences in one call, composed with
// compose_summaries along each sequence and applied to the initial state, give
// the straight run's final state; each segment's forward from its composed
// incoming state gives the straight run's outputs; and every bad argument is
// rejected with a message that names it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/sequences.h"
#include "cpu_test_util.h"
#include "tests/common/degenerate_problem.h"

namespace flashkda::testing {
namespace {

// Varlen with GVA and an empty sequence: H = 1, HV = 2, head dim 32, fp32 states.
ProblemSpec varlen_gva_spec() {
  ProblemSpec spec;
  spec.seqlens = {150, 37, 0, 90};
  spec.heads = 1;
  spec.v_heads = 2;
  spec.head_dim = 32;
  return spec;
}

// The spec's gates decay a state by up to e^-5 a token: after a few dozen tokens
// M is ~0 and a wrong M would go unseen. These tests mostly run the spec's
// random keys with the slow decay of the degenerate class (a ≈ −3e-5 a token),
// where M carries the whole incoming state through.
HostProblem slow_decay(HostProblem p) {
  for (auto& g : p.g) g = float_to_bf16(kSlowGate);
  for (auto& a : p.A_log) a = 0.f;
  for (auto& d : p.dt_bias) d = 0.f;
  return p;
}

struct Segment {
  int64_t seq, begin, end;
};

// Each non-empty sequence cut at random places (not 16-aligned; duplicates make
// empty segments), listed in a shuffled order.
std::vector<Segment> random_segments(const HostProblem& p, int pieces, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<SequenceSpan> spans = sequence_spans(p.host_args(nullptr, nullptr), p.cu_seqlens.data());
  std::vector<Segment> segs;
  for (size_t n = 0; n < spans.size(); ++n) {
    const int64_t b = spans[n].token_begin, L = spans[n].length;
    if (L == 0) continue;
    std::vector<int64_t> cuts = {0, L};
    for (int i = 1; i < pieces; ++i) cuts.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(L + 1)));
    std::sort(cuts.begin(), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) segs.push_back({static_cast<int64_t>(n), b + cuts[i], b + cuts[i + 1]});
  }
  std::shuffle(segs.begin(), segs.end(), rng);
  return segs;
}

struct Summaries {
  std::vector<float> M, B;  // [S, HV, K, K], [S, HV, V, K]
};

Summaries summarise(const HostProblem& p, const std::vector<Segment>& segs, Backend backend) {
  std::vector<int64_t> flat;
  for (const Segment& s : segs) {
    flat.push_back(s.begin);
    flat.push_back(s.end);
  }
  const int64_t S = static_cast<int64_t>(segs.size());
  Summaries out;
  out.M.assign(static_cast<size_t>(S * p.HV * p.K * p.K), std::nanf(""));
  out.B.assign(static_cast<size_t>(S * p.HV * p.V * p.K), std::nanf(""));
  SegmentSummaryArgs a;
  a.inputs = p.host_args(nullptr, nullptr);
  a.segments = flat.data();
  a.num_segments = S;
  a.M = out.M.data();
  a.B = out.B.data();
  const Status st = segment_summaries(a, backend);
  EXPECT_TRUE(st.ok()) << st.message;
  return out;
}

// S_in·M + B for every value head of one sequence's state.
std::vector<double> apply_all(const HostProblem& p, const float* M, const float* B, const std::vector<double>& S_in) {
  const int64_t HV = p.HV, K = p.K, V = p.V;
  std::vector<double> S_out(static_cast<size_t>(HV * V * K));
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t i = 0; i < V; ++i)
      for (int64_t j = 0; j < K; ++j) {
        double acc = B[(h * V + i) * K + j];
        for (int64_t q = 0; q < K; ++q) acc += S_in[static_cast<size_t>((h * V + i) * K + q)] * M[(h * K + q) * K + j];
        S_out[static_cast<size_t>((h * V + i) * K + j)] = acc;
      }
  return S_out;
}

// Composes each sequence's segments in token order (compose_summaries, in place
// into a running prefix) and checks, at every segment boundary, that the
// prefix applied to the sequence's initial state is the state the segment starts
// from: its forward from there gives the straight run's outputs; at the end,
// the straight run's final state. `state_bar` bounds the final state against the
// float64 oracle, `out_bar` a segment's unrounded outputs against the straight run's.
void check_composition(const HostProblem& p, Backend backend, double state_bar, double out_bar, uint64_t seed) {
  const int64_t HV = p.HV, K = p.K, V = p.V;
  const RunResult straight = run_backend(p, Which::kReference);
  for (int pieces : {1, 3, 6}) {
    std::vector<Segment> segs = random_segments(p, pieces, seed + static_cast<uint64_t>(pieces));
    const Summaries sum = summarise(p, segs, backend);
    const std::vector<SequenceSpan> spans = sequence_spans(p.host_args(nullptr, nullptr), p.cu_seqlens.data());
    for (size_t n = 0; n < spans.size(); ++n) {
      if (spans[n].length == 0) continue;
      std::vector<size_t> order;
      for (size_t i = 0; i < segs.size(); ++i)
        if (segs[i].seq == static_cast<int64_t>(n)) order.push_back(i);
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return segs[a].begin < segs[b].begin; });
      const size_t state = static_cast<size_t>(HV * V * K);
      std::vector<double> S0(p.init_f32.begin() + static_cast<int64_t>(n * state),
                             p.init_f32.begin() + static_cast<int64_t>((n + 1) * state));
      // The running prefix (M, B) of every head, starting as the identity.
      std::vector<float> PM(static_cast<size_t>(HV * K * K), 0.f), PB(static_cast<size_t>(HV * V * K), 0.f);
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t r = 0; r < K; ++r) PM[static_cast<size_t>((h * K + r) * K + r)] = 1.f;
      for (size_t i : order) {
        const Segment& s = segs[i];
        const std::vector<double> incoming = apply_all(p, PM.data(), PB.data(), S0);
        if (s.end > s.begin) {
          // The segment alone from its incoming state (the oracle, out unrounded).
          HostProblem run = p;
          run.spec.seqlens.clear();
          run.cu_seqlens.clear();
          run.N = 1;
          run.T = s.end - s.begin;
          run.spec.seqlen = run.T;
          auto take = [&](const std::vector<uint16_t>& x, int64_t width) {
            return std::vector<uint16_t>(x.begin() + s.begin * width, x.begin() + s.end * width);
          };
          run.q = take(p.q, p.H * K);
          run.k = take(p.k, p.H * K);
          run.v = take(p.v, HV * V);
          run.g = take(p.g, HV * K);
          run.beta = take(p.beta, HV);
          run.init_f32.assign(incoming.begin(), incoming.end());
          const RunResult part = run_backend(run, Which::kReference);
          std::vector<double> got, want;
          for (int64_t t = 0; t < run.T * HV * V; ++t) {
            got.push_back(part.out_unrounded[static_cast<size_t>(t)]);
            want.push_back(straight.out_unrounded[static_cast<size_t>(s.begin * HV * V + t)]);
          }
          EXPECT_LE(rel_rms(got, want), out_bar)
              << to_string(backend) << ": segment [" << s.begin << ", " << s.end << ") of sequence " << n;
        }
        ComposeSummariesArgs c;
        c.count = HV;
        c.head_dim_k = K;
        c.head_dim_v = V;
        c.M1 = PM.data();
        c.B1 = PB.data();
        c.M2 = sum.M.data() + i * static_cast<size_t>(HV * K * K);
        c.B2 = sum.B.data() + i * static_cast<size_t>(HV * V * K);
        c.M = PM.data();  // in place
        c.B = PB.data();
        const Status st = compose_summaries(c, backend);
        ASSERT_TRUE(st.ok()) << st.message;
      }
      const std::vector<double> composed = apply_all(p, PM.data(), PB.data(), S0);
      const std::vector<double> oracle(straight.final_f32.begin() + static_cast<int64_t>(n * state),
                                       straight.final_f32.begin() + static_cast<int64_t>((n + 1) * state));
      const double err = rel_rms(composed, oracle);
      EXPECT_LE(err, state_bar) << to_string(backend) << ": sequence " << n << ", " << pieces << " pieces";
      std::printf("[ summary ] %-13s sequence %zu, %d pieces: final state %.3e\n", to_string(backend), n, pieces, err);
    }
  }
}

// Bars: the reference's M and B are float64 results rounded to fp32 once (the
// composed state measured <= 8e-8 from the oracle); the chunked backend computes
// them with its own fp32 chunk arithmetic (measured <= 8e-7).
constexpr double kReferenceBar = 5e-7;
constexpr double kChunkedBar = 5e-6;

TEST(SegmentSummariesApi, ReferenceComposesToTheStraightRun) {
  check_composition(slow_decay(make_problem(varlen_gva_spec(), 91)), Backend::kCpuReference, kReferenceBar,
                    kReferenceBar, 92);
  check_composition(make_problem(varlen_gva_spec(), 191), Backend::kCpuReference, kReferenceBar, kReferenceBar, 192);
}

TEST(SegmentSummariesApi, ChunkedComposesToTheStraightRun) {
  check_composition(slow_decay(make_problem(varlen_gva_spec(), 93)), Backend::kCpuChunked, kChunkedBar, kChunkedBar,
                    94);
  check_composition(make_problem(varlen_gva_spec(), 193), Backend::kCpuChunked, kChunkedBar, kChunkedBar, 194);
}

TEST(SegmentSummariesApi, DegenerateKeys) {
  const HostProblem p = make_degenerate_problem(varlen_gva_spec(), {KeyPattern::kCollinear, 0.0, 8.f, true}, 95);
  check_composition(p, Backend::kCpuReference, kReferenceBar, kReferenceBar, 96);
  check_composition(p, Backend::kCpuChunked, kChunkedBar, kChunkedBar, 96);
}

// K != V: M is [K, K], B [V, K].
TEST(SegmentSummariesApi, KeyAndValueDimsDiffer) {
  const HostProblem p = slow_decay(make_problem_kv(varlen_gva_spec(), 16, 48, 97));
  check_composition(p, Backend::kCpuReference, kReferenceBar, kReferenceBar, 98);
  check_composition(p, Backend::kCpuChunked, kChunkedBar, kChunkedBar, 98);
}

// The two CPU backends agree on every summary, and an empty segment is (I, 0).
TEST(SegmentSummariesApi, BackendsAgreeAndEmptyIsIdentity) {
  const HostProblem p = slow_decay(make_problem(varlen_gva_spec(), 99));
  const std::vector<Segment> segs = {{0, 3, 140}, {3, 200, 200}, {3, 190, 277}, {0, 0, 150}, {1, 150, 151}};
  const Summaries r = summarise(p, segs, Backend::kCpuReference), c = summarise(p, segs, Backend::kCpuChunked);
  std::vector<double> rm(r.M.begin(), r.M.end()), cm(c.M.begin(), c.M.end());
  std::vector<double> rb(r.B.begin(), r.B.end()), cb(c.B.begin(), c.B.end());
  EXPECT_LE(rel_rms(cm, rm), kChunkedBar);
  EXPECT_LE(rel_rms(cb, rb), kChunkedBar);
  const int64_t HV = p.HV, K = p.K, V = p.V;
  for (const Summaries* x : {&r, &c}) {
    for (int64_t h = 0; h < HV; ++h)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < K; ++j)
          ASSERT_EQ(x->M[static_cast<size_t>(((1 * HV + h) * K + i) * K + j)], i == j ? 1.f : 0.f);
    for (int64_t e = 0; e < HV * V * K; ++e) ASSERT_EQ(x->B[static_cast<size_t>(HV * V * K + e)], 0.f);
  }
}

// Composition is associative (to fp32 rounding) and in place gives the same bits.
TEST(SegmentSummariesApi, ComposeIsAssociativeAndInPlace) {
  const HostProblem p = slow_decay(make_problem(varlen_gva_spec(), 101));
  const std::vector<Segment> segs = {{0, 0, 40}, {0, 40, 97}, {0, 97, 150}};
  const Summaries s = summarise(p, segs, Backend::kCpuReference);
  const int64_t HV = p.HV, K = p.K, V = p.V, m = HV * K * K, b = HV * V * K;
  auto compose = [&](const float* M1, const float* B1, const float* M2, const float* B2, float* M, float* B) {
    ComposeSummariesArgs c;
    c.count = HV;
    c.head_dim_k = K;
    c.head_dim_v = V;
    c.M1 = M1; c.B1 = B1; c.M2 = M2; c.B2 = B2; c.M = M; c.B = B;
    const Status st = compose_summaries(c, Backend::kCpuChunked);
    EXPECT_TRUE(st.ok()) << st.message;
  };
  std::vector<float> abM(m), abB(b), left_M(m), left_B(b), bcM(m), bcB(b), right_M(m), right_B(b);
  compose(&s.M[0], &s.B[0], &s.M[m], &s.B[b], abM.data(), abB.data());
  compose(abM.data(), abB.data(), &s.M[2 * m], &s.B[2 * b], left_M.data(), left_B.data());
  compose(&s.M[m], &s.B[b], &s.M[2 * m], &s.B[2 * b], bcM.data(), bcB.data());
  compose(&s.M[0], &s.B[0], bcM.data(), bcB.data(), right_M.data(), right_B.data());
  EXPECT_LE(rel_rms(left_M, right_M), 1e-6);
  EXPECT_LE(rel_rms(left_B, right_B), 1e-6);
  // In place, into either input.
  std::vector<float> M2(s.M.begin() + m, s.M.begin() + 2 * m), B2(s.B.begin() + b, s.B.begin() + 2 * b);
  compose(&s.M[0], &s.B[0], M2.data(), B2.data(), M2.data(), B2.data());
  EXPECT_EQ(M2, abM);
  EXPECT_EQ(B2, abB);
}

// ---- bad arguments -------------------------------------------------------------

struct BadCall {
  SegmentSummaryArgs args;
  std::vector<int64_t> segments;
};

void expect_rejected(const SegmentSummaryArgs& a, Backend backend, StatusCode code, const std::string& needle) {
  const Status st = segment_summaries(a, backend);
  EXPECT_EQ(st.code, code) << st.message;
  EXPECT_NE(st.message.find(needle), std::string::npos) << "message: " << st.message;
}

TEST(SegmentSummariesApi, BadArgumentsAreNamed) {
  const HostProblem p = make_problem(varlen_gva_spec(), 103);
  std::vector<float> M(static_cast<size_t>(p.HV * p.K * p.K)), B(static_cast<size_t>(p.HV * p.V * p.K));
  auto call = [&](std::vector<int64_t>& seg) {
    SegmentSummaryArgs a;
    a.inputs = p.host_args(nullptr, nullptr);
    a.segments = seg.data();
    a.num_segments = static_cast<int64_t>(seg.size() / 2);
    a.M = M.data();
    a.B = B.data();
    return a;
  };
  std::vector<int64_t> across = {140, 160};  // sequence 0 is [0, 150)
  expect_rejected(call(across), Backend::kCpuChunked, StatusCode::kInvalidArgument, "past the end of sequence 0");
  std::vector<int64_t> reversed = {20, 10};
  expect_rejected(call(reversed), Backend::kCpuReference, StatusCode::kInvalidArgument, "segments: segment 0");
  std::vector<int64_t> past = {270, 280};  // T = 277
  expect_rejected(call(past), Backend::kCpuChunked, StatusCode::kInvalidArgument, "<= B*T = 277");
  std::vector<int64_t> negative = {-1, 5};
  expect_rejected(call(negative), Backend::kCpuChunked, StatusCode::kInvalidArgument, "segments");
  std::vector<int64_t> ok = {0, 10};
  SegmentSummaryArgs a = call(ok);
  a.M = nullptr;
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "M: null pointer");
  a = call(ok);
  a.segments = nullptr;
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "segments: null pointer");
  a = call(ok);
  a.num_segments = -2;
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "num_segments");
  a = call(ok);
  a.inputs.lower_bound = 1.f;  // the token inputs go through validate()
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "lower_bound");
  a = call(ok);
  expect_rejected(a, Backend::kCuda, StatusCode::kNotSupported, "kCuda");
  expect_rejected(a, static_cast<Backend>(7), StatusCode::kInvalidArgument, "backend");
  // No segments: nothing to do, nothing read.
  a = call(ok);
  a.num_segments = 0;
  a.segments = nullptr;
  a.M = a.B = nullptr;
  EXPECT_TRUE(segment_summaries(a, Backend::kCpuChunked).ok());

  ComposeSummariesArgs c;
  c.count = 1;
  c.head_dim_k = p.K;
  c.head_dim_v = p.V;
  c.M1 = c.M2 = M.data();
  c.B1 = c.B2 = B.data();
  c.M = M.data();
  c.B = nullptr;
  Status st = compose_summaries(c, Backend::kCpuChunked);
  EXPECT_EQ(st.code, StatusCode::kInvalidArgument);
  EXPECT_NE(st.message.find("B: null pointer"), std::string::npos) << st.message;
  c.B = B.data();
  c.head_dim_k = 0;
  st = compose_summaries(c, Backend::kCpuChunked);
  EXPECT_NE(st.message.find("head_dim_k"), std::string::npos) << st.message;
  c.head_dim_k = p.K;
  st = compose_summaries(c, Backend::kCuda);
  EXPECT_EQ(st.code, StatusCode::kNotSupported) << st.message;
}

}  // namespace
}  // namespace flashkda::testing
