// The public segment-summary API (flashkda.h, "Segment summaries") on the CPU
// backends: summaries of segments of several sequences in one call, composed with
// compose_summaries along each sequence and applied to the initial state, give
// the straight run's final state; each segment's forward from its composed
// incoming state gives the straight run's outputs; and every bad argument is
// rejected with a message that names it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Tokens [begin, end) of p's flattened token axis as a problem of their own: one
// sequence, p's initial-state dtype with an empty state (the caller's to set).
HostProblem piece_of(const HostProblem& p, int64_t begin, int64_t end) {
  HostProblem run = p;
  run.spec.seqlens.clear();
  run.cu_seqlens.clear();
  run.B = 1;
  run.N = 1;
  run.T = end - begin;
  run.spec.seqlen = run.T;
  auto take = [&](const std::vector<uint16_t>& x, int64_t width) {
    return std::vector<uint16_t>(x.begin() + begin * width, x.begin() + end * width);
  };
  run.q = take(p.q, p.H * p.K);
  run.k = take(p.k, p.H * p.K);
  run.v = take(p.v, p.HV * p.V);
  run.g = take(p.g, p.HV * p.K);
  run.beta = take(p.beta, p.HV);
  run.init_f32.clear();
  run.init_bf16.clear();
  return run;
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
          HostProblem run = piece_of(p, s.begin, s.end);
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

  // Other overlaps are refused by name: an output one element into an input, the
  // two outputs on one buffer, M in place of a B.
  auto refused = [&](const float* M1, const float* B1, float* M, float* B, const std::string& needle) {
    ComposeSummariesArgs c;
    c.count = HV;
    c.head_dim_k = K;
    c.head_dim_v = V;
    c.M1 = M1; c.B1 = B1; c.M2 = bcM.data(); c.B2 = bcB.data(); c.M = M; c.B = B;
    for (Backend be : {Backend::kCpuReference, Backend::kCpuChunked, Backend::kCuda}) {
      const Status st = compose_summaries(c, be);
      if (be == Backend::kCuda && st.code == StatusCode::kNotSupported) continue;  // checked before the device
      EXPECT_EQ(st.code, StatusCode::kInvalidArgument) << to_string(be) << ": " << st.message;
      EXPECT_NE(st.message.find(needle), std::string::npos) << to_string(be) << ": " << st.message;
    }
  };
  std::vector<float> big(static_cast<size_t>(2 * m + 2 * b + 8));
  refused(big.data(), &s.B[0], big.data() + 1, abB.data(), "M: overlaps M1; expected M1 or M2 itself");
  refused(&s.M[0], &s.B[0], big.data(), big.data() + m - 4, "M, B: the two outputs overlap");
  std::vector<float> sq(static_cast<size_t>(std::max(m, b)));
  refused(&s.M[0], sq.data(), sq.data(), abB.data(), "M: overlaps B1");
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
  // Outputs that share memory with an input or each other (api/overlap.h).
  std::vector<float> MB(M.size() + B.size());
  a = call(ok);
  a.M = MB.data();
  a.B = MB.data() + 8;
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "B: shares memory with M");
  a = call(ok);
  a.M = reinterpret_cast<float*>(const_cast<void*>(a.inputs.q));
  expect_rejected(a, Backend::kCpuChunked, StatusCode::kInvalidArgument, "M: shares memory with q");
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
  // kCuda takes K, V <= 128 (its M2 in shared memory), checked before the device.
  c.head_dim_k = 129;
  st = compose_summaries(c, Backend::kCuda);
  EXPECT_EQ(st.code, StatusCode::kNotSupported);  // a valid shape this backend does not run
  EXPECT_NE(st.message.find("head_dim_k: the composition on backend kCuda runs head dims in [1, 128], got 129"), std::string::npos)
      << st.message;
  c.head_dim_k = p.K;
  // Without a usable device (these pointers are host memory: not run where one is).
  if (!cuda_backend_available()) {
    st = compose_summaries(c, Backend::kCuda);
    EXPECT_EQ(st.code, StatusCode::kNotSupported) << st.message;
  }
}


// ---- a forward in two calls (ForwardArgs::summaries_M, resume_from_summaries) ----

std::vector<Segment> whole_sequences(const HostProblem& p) {
  const std::vector<SequenceSpan> spans = sequence_spans(p.host_args(nullptr, nullptr), p.cu_seqlens.data());
  std::vector<Segment> segs;
  for (size_t n = 0; n < spans.size(); ++n)
    segs.push_back({static_cast<int64_t>(n), spans[n].token_begin, spans[n].token_begin + spans[n].length});
  return segs;
}

// The summaries call over p: no states; every sequence's (M, B) into `sum`,
// poisoned with NaN first so that a summary left unwritten is caught.
ForwardArgs summaries_call(const HostProblem& p, void* out, Summaries& sum) {
  ForwardArgs a = p.host_args(out, nullptr);
  a.initial_state = nullptr;
  a.initial_state_dtype = DType::kNone;
  a.final_state_dtype = DType::kNone;
  sum.M.assign(static_cast<size_t>(p.N * p.HV * p.K * p.K), std::nanf(""));
  sum.B.assign(static_cast<size_t>(p.N * p.HV * p.V * p.K), std::nanf(""));
  a.summaries_M = sum.M.data();
  a.summaries_B = sum.B.data();
  return a;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// On the CPU backends the summaries call is segment_summaries over the whole
// sequences, to the bit; out is neither written nor needed.
TEST(SplitForward, SummariesCallIsSegmentSummariesOfWholeSequences) {
  ProblemSpec batched;
  batched.batch = 2;
  batched.seqlen = 45;
  batched.heads = 1;
  batched.v_heads = 2;
  batched.head_dim = 32;
  const HostProblem problems[] = {slow_decay(make_problem(varlen_gva_spec(), 105)),  // with an empty sequence
                                  make_problem(varlen_gva_spec(), 106), make_problem(batched, 107)};
  const uint16_t sentinel = float_to_bf16(std::nanf(""));
  for (const HostProblem& p : problems) {
    for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
      const Summaries want = summarise(p, whole_sequences(p), backend);
      std::vector<uint16_t> out(p.out_elems(), sentinel);
      Summaries got;
      Status st = forward(summaries_call(p, out.data(), got), backend, nullptr, 0, nullptr);
      ASSERT_TRUE(st.ok()) << to_string(backend) << ": " << st.message;
      EXPECT_TRUE(same_bits(got.M, want.M)) << to_string(backend);
      EXPECT_TRUE(same_bits(got.B, want.B)) << to_string(backend);
      EXPECT_EQ(std::count(out.begin(), out.end(), sentinel), static_cast<std::ptrdiff_t>(out.size()))
          << to_string(backend) << ": out was written";

      Summaries bare;
      st = forward(summaries_call(p, nullptr, bare), backend, nullptr, 0, nullptr);
      ASSERT_TRUE(st.ok()) << to_string(backend) << ": " << st.message;
      EXPECT_TRUE(same_bits(bare.M, want.M)) << to_string(backend) << ", out == nullptr";
      EXPECT_TRUE(same_bits(bare.B, want.B)) << to_string(backend) << ", out == nullptr";
    }
  }
}

// Context parallelism on two ranks, simulated: one sequence's tokens cut at a
// point that is not a multiple of 16, each rank's piece a problem of its own.
// Every rank makes the summaries call on its piece; rank 1's incoming state is
// rank 0's summary applied to the sequence's initial state (in double); every
// rank then makes the resume call on its piece from its incoming state.
// Together they give the straight run's out (bf16 roundings of values that agree
// to fp32 rounding: equal or one ulp apart) and final state (within state_bar),
// and rank 1's summary takes its incoming state to that final state.
void check_two_ranks(const HostProblem& p, Backend backend, double state_bar, int64_t cut) {
  const RunResult straight = run_backend(p, backend == Backend::kCpuReference ? Which::kReference : Which::kChunked);
  HostProblem rank[2] = {piece_of(p, 0, cut), piece_of(p, cut, p.T)};
  Summaries sum[2];
  for (int r = 0; r < 2; ++r) {
    const Status st = forward(summaries_call(rank[r], nullptr, sum[r]), backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
  }
  const std::vector<double> S0(p.init_f32.begin(), p.init_f32.end());
  const std::vector<double> S1 = apply_all(p, sum[0].M.data(), sum[0].B.data(), S0);
  rank[0].init_f32 = p.init_f32;
  rank[1].init_f32.assign(S1.begin(), S1.end());

  std::vector<uint16_t> out;  // both ranks' outputs, in token order
  std::vector<float> fin[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<uint16_t> o(rank[r].out_elems(), float_to_bf16(std::nanf("")));
    fin[r].assign(rank[r].state_elems(), std::nanf(""));
    ForwardArgs a = rank[r].host_args(o.data(), fin[r].data());
    a.resume_from_summaries = true;
    const Status st = forward(a, backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    out.insert(out.end(), o.begin(), o.end());
  }

  const std::vector<float> got = bf16_vector_to_float(out), want = straight.out_float();
  ASSERT_EQ(got.size(), want.size());
  double ss = 0;
  for (float x : want) ss += double(x) * x;
  const double floor_abs = 1e-6 * std::sqrt(ss / static_cast<double>(want.size()));
  size_t beyond_one_ulp = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= std::abs(double(want[i])) / 128 + floor_abs)) ++beyond_one_ulp;
  EXPECT_EQ(beyond_one_ulp, 0u) << to_string(backend) << ", cut at " << cut;

  const double err = rel_rms(fin[1], straight.final_f32);
  EXPECT_LE(err, state_bar) << to_string(backend) << ", cut at " << cut;
  const std::vector<double> composed = apply_all(p, sum[1].M.data(), sum[1].B.data(), S1);
  EXPECT_LE(rel_rms(composed, straight.final_f32), state_bar) << to_string(backend) << ", cut at " << cut;
  std::printf("[ split ] %-13s cut at %3lld: final state %.3e, composed %.3e\n", to_string(backend),
              static_cast<long long>(cut), err, rel_rms(composed, straight.final_f32));
}

TEST(SplitForward, TwoRanksGiveTheStraightRun) {
  ProblemSpec spec;
  spec.seqlen = 150;
  spec.heads = 1;
  spec.v_heads = 2;
  spec.head_dim = 32;
  const HostProblem problems[] = {slow_decay(make_problem(spec, 109)), make_problem(spec, 110)};
  for (const HostProblem& p : problems) {
    for (const int64_t cut : {67, 9}) {
      check_two_ranks(p, Backend::kCpuReference, kReferenceBar, cut);
      check_two_ranks(p, Backend::kCpuChunked, kChunkedBar, cut);
    }
  }
}

// The CPU twins of the GPU's in-place test: a resume call (and the ordinary
// forward) with final_state == initial_state, an engine's in-place update, gives
// the out-of-place call's out and final state bit for bit, on both backends, with
// fp32 and bf16 states, varlen with an empty sequence.
TEST(SplitForward, FinalStateOverTheInitialStateIsTheOutOfPlaceCall) {
  for (const DType t : {DType::kFP32, DType::kBF16}) {
    ProblemSpec spec = varlen_gva_spec();
    spec.initial_state = spec.final_state = t;
    const HostProblem p = slow_decay(make_problem(spec, 113));  // the initial state matters to the end
    const size_t state_bytes = p.state_elems() * (t == DType::kFP32 ? 4 : 2);
    for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
      for (const bool resume : {false, true}) {
        SCOPED_TRACE(std::string(to_string(backend)) + (t == DType::kFP32 ? " fp32" : " bf16") +
                     (resume ? " resume" : " forward"));
        std::vector<uint16_t> out_apart(p.out_elems()), out_over(p.out_elems());
        std::vector<uint8_t> apart(state_bytes);
        ForwardArgs a = p.host_args(out_apart.data(), apart.data());
        a.resume_from_summaries = resume;
        ASSERT_TRUE(forward(a, backend, nullptr, 0, nullptr).ok());

        HostProblem q = p;  // its initial state is overwritten
        ForwardArgs b = q.host_args(out_over.data(), nullptr);
        b.final_state = const_cast<void*>(b.initial_state);
        b.resume_from_summaries = resume;
        const Status st = forward(b, backend, nullptr, 0, nullptr);
        ASSERT_TRUE(st.ok()) << st.message;
        EXPECT_EQ(out_apart, out_over);
        EXPECT_EQ(std::memcmp(apart.data(), b.initial_state, state_bytes), 0) << "final state";
      }
    }
  }
}

// Every rule of the split forward, on both calls where it applies, by name.
// The split fields belong to the forward: segment_summaries ignores them in its
// inputs (a copy of a forward's arguments), and an ordinary forward is never
// judged by the summaries' sizes.
TEST(SplitForward, OtherCallsIgnoreTheSplitFields) {
  const HostProblem p = make_problem(varlen_gva_spec(), 112);
  std::vector<float> M(static_cast<size_t>(p.HV * p.K * p.K)), B(static_cast<size_t>(p.HV * p.V * p.K));
  std::vector<int64_t> seg = {0, 10};
  SegmentSummaryArgs a;
  a.inputs = p.host_args(nullptr, nullptr);
  a.inputs.summaries_B = B.data();  // half a pair: an error for a forward, nothing here
  a.inputs.resume_from_summaries = true;
  a.segments = seg.data();
  a.num_segments = 1;
  a.M = M.data();
  a.B = B.data();
  const Status st = segment_summaries(a, Backend::kCpuChunked);
  EXPECT_TRUE(st.ok()) << st.message;

  // N·HV·K·K past int64 while every tensor of an ordinary call fits.
  ForwardArgs f;
  f.batch = int64_t{1} << 50;
  f.seqlen = 0;
  f.num_heads = 1;
  f.head_dim_k = 256;
  f.head_dim_v = 1;
  f.A_log = M.data();
  f.dt_bias = M.data();
  const Status v = validate(f, Backend::kCpuReference);
  EXPECT_EQ(v.message.find("summaries_M"), std::string::npos) << v.message;
}

TEST(SplitForward, BadCombinationsAreNamed) {
  const HostProblem p = make_problem(varlen_gva_spec(), 111);
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems());
  Summaries sum;
  const ForwardArgs call = summaries_call(p, out.data(), sum);
  ForwardArgs resume = p.host_args(out.data(), fin.data());
  resume.resume_from_summaries = true;

  std::vector<float> pool(p.state_elems());
  std::vector<int32_t> slots(static_cast<size_t>(p.N));
  for (size_t n = 0; n < slots.size(); ++n) slots[n] = static_cast<int32_t>(n);
  auto with_pool = [&](ForwardArgs a) {
    use_state_pool(a, pool.data(), DType::kFP32, p.N, slots.data());
    return a;
  };
  std::vector<float> ck(static_cast<size_t>(16 * p.HV * p.K * p.V));
  auto with_checkpoints = [&](ForwardArgs a) {
    a.checkpoints = ck.data();
    a.checkpoints_dtype = DType::kFP32;
    a.checkpoint_interval = 32;
    a.checkpoints_capacity = 16;
    return a;
  };
  constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    EXPECT_TRUE(validate(call, backend).ok()) << validate(call, backend).message;
    EXPECT_TRUE(validate(resume, backend).ok()) << validate(resume, backend).message;
    // The summaries call needs no out; every other call does.
    ForwardArgs a = call;
    a.out = nullptr;
    EXPECT_TRUE(validate(a, backend).ok()) << validate(a, backend).message;
    a = resume;
    a.out = nullptr;
    expect_invalid(a, backend, kInvalid, "out: null pointer");

    // Half a pair, with or without out.
    a = call;
    a.summaries_B = nullptr;
    expect_invalid(a, backend, kInvalid, "summaries_B: null pointer");
    a = call;
    a.summaries_M = nullptr;
    expect_invalid(a, backend, kInvalid, "summaries_M: null pointer");
    a.out = nullptr;
    expect_invalid(a, backend, kInvalid, "summaries_M: null pointer");

    // Both calls in one.
    a = call;
    a.resume_from_summaries = true;
    expect_invalid(a, backend, kInvalid, "resume_from_summaries: set in a summaries call");

    // States belong to the resume call.
    a = call;
    a.initial_state = p.init_f32.data();
    a.initial_state_dtype = DType::kFP32;
    expect_invalid(a, backend, kInvalid, "summaries_M: a summaries call reads no initial_state");
    a = call;
    a.final_state = fin.data();
    a.final_state_dtype = DType::kFP32;
    expect_invalid(a, backend, kInvalid,
                   "summaries_M: a summaries call reads no initial_state and writes no final_state");

    // Neither call with a state pool or checkpoints.
    expect_invalid(with_pool(call), backend, kInvalid, "summaries_M: not supported together with state_pool");
    expect_invalid(with_pool(resume), backend, kInvalid,
                   "resume_from_summaries: not supported together with state_pool");
    expect_invalid(with_checkpoints(call), backend, kInvalid, "summaries_M: not supported together with checkpoints");
    expect_invalid(with_checkpoints(resume), backend, kInvalid,
                   "resume_from_summaries: not supported together with checkpoints");

    // The summaries are fp32: 4-byte aligned on the CPU.
    a = call;
    a.summaries_B = reinterpret_cast<float*>(reinterpret_cast<char*>(sum.B.data()) + 2);
    expect_invalid(a, backend, kInvalid, "summaries_B: expected a 4-byte aligned pointer");

    // forward() checks the same, and writes nothing.
    std::fill(sum.M.begin(), sum.M.end(), 7.f);
    const Status st = forward(with_pool(call), backend, nullptr, 0, nullptr);
    EXPECT_EQ(st.code, kInvalid) << st.message;
    EXPECT_NE(st.message.find("summaries_M"), std::string::npos) << st.message;
    EXPECT_EQ(std::count(sum.M.begin(), sum.M.end(), 7.f), static_cast<std::ptrdiff_t>(sum.M.size()));
  }
}

}  // namespace
}  // namespace flashkda::testing
