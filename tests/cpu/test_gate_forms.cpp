// The forms g and beta may come in (flashkda.h, GateForm; ForwardArgs' and
// DecodeArgs' gate_form, g_dtype, beta_is_probability, beta_dtype) on the CPU
// backends: a given log decay (bf16 or fp32) and an activated beta (bf16 or fp32)
// against the float64 oracle at the spec's bars; the log decay of the safe gate is
// the safe gate's run; decays too strong for K_inv (chunks past 2^-116, the
// pairwise path of kCpuChunked) stay exact and finite; varlen, a state pool,
// checkpoints, segment summaries and decode with a log decay; the validation of
// the new fields; the C ABI's fields.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/gate.h"
#include "common/sequences.h"
#include "cpu_test_util.h"
#include "flashkda/flashkda_c.h"
#include "tests/common/accuracy_bars.h"
#include "tests/common/decode_problem.h"

namespace flashkda::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
double sigmoid_f64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// g and beta of a problem in one of the forms ForwardArgs and DecodeArgs take,
// rounded to their dtypes, held here. Log decays come without A_log and dt_bias
// (null), so a backend that read them would crash.
struct GateTensors {
  GateForm form = GateForm::kSafeGate;
  DType g_dtype = DType::kBF16, beta_dtype = DType::kBF16;
  bool beta_is_probability = false;
  std::vector<uint16_t> g16, beta16;
  std::vector<float> g32, beta32;

  GateTensors& set_g(GateForm f, DType dtype, const std::vector<double>& values) {
    form = f;
    g_dtype = dtype;
    g16.clear();
    g32.clear();
    for (double x : values) {
      if (dtype == DType::kFP32) g32.push_back(static_cast<float>(x));
      else g16.push_back(float_to_bf16(static_cast<float>(x)));
    }
    return *this;
  }
  GateTensors& set_beta(bool probability, DType dtype, const std::vector<double>& values) {
    beta_is_probability = probability;
    beta_dtype = dtype;
    beta16.clear();
    beta32.clear();
    for (double x : values) {
      if (dtype == DType::kFP32) beta32.push_back(static_cast<float>(x));
      else beta16.push_back(float_to_bf16(static_cast<float>(x)));
    }
    return *this;
  }
  const void* g() const { return g_dtype == DType::kFP32 ? static_cast<const void*>(g32.data()) : g16.data(); }
  const void* beta() const {
    return beta_dtype == DType::kFP32 ? static_cast<const void*>(beta32.data()) : beta16.data();
  }
  // g and beta of `a` (ForwardArgs or DecodeArgs) pointing here.
  template <class Args>
  void apply(Args& a) const {
    a.g = g();
    a.beta = beta();
    a.gate_form = form;
    a.g_dtype = g_dtype;
    a.beta_is_probability = beta_is_probability;
    a.beta_dtype = beta_dtype;
    if (form == GateForm::kLogDecay) {
      a.A_log = nullptr;
      a.dt_bias = nullptr;
    }
  }
};

// The natural-log decay of the safe gate on p's inputs, in float64:
// lower_bound·sigmoid(exp(A_log)·(g + dt_bias)).
std::vector<double> safe_gate_log_decays(const HostProblem& p) {
  std::vector<double> a(p.g.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t hv = static_cast<int64_t>(i) / p.K % p.HV, d = static_cast<int64_t>(i) % p.K;
    a[i] = p.spec.lower_bound *
           sigmoid_f64(std::exp(double(p.A_log[hv])) * (bf16_to_float(p.g[i]) + double(p.dt_bias[hv * p.K + d])));
  }
  return a;
}

// fla's gate (fused_kda_gate, what vLLM's Kimi Linear layer passes):
// -exp(A_log)·softplus(g + dt_bias), with exp(A_log) uniform in [1, a_max] as Kimi
// Linear initialises it. At a_max = 16 a channel loses up to e^-48 a token: many
// chunks pass 2^-116 on some channel.
std::vector<double> fla_log_decays(const HostProblem& p, double a_max, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(1.0, a_max);
  std::vector<double> scale(static_cast<size_t>(p.HV));
  for (double& s : scale) s = uniform(rng);
  std::vector<double> a(p.g.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t hv = static_cast<int64_t>(i) / p.K % p.HV, d = static_cast<int64_t>(i) % p.K;
    a[i] = -scale[static_cast<size_t>(hv)] * softplus(bf16_to_float(p.g[i]) + double(p.dt_bias[hv * p.K + d]));
  }
  return a;
}

std::vector<double> beta_logits(const HostProblem& p) {
  std::vector<double> b;
  for (uint16_t x : p.beta) b.push_back(bf16_to_float(x));
  return b;
}
std::vector<double> beta_probabilities(const HostProblem& p) {
  std::vector<double> b;
  for (uint16_t x : p.beta) b.push_back(sigmoid_f64(bf16_to_float(x)));
  return b;
}

// Log decays for single-row problems of T = 101 tokens (six whole chunks and one
// of 5 rows), K channels, chunk by chunk:
//   0: mild (-0.05·u) everywhere                              plain
//   1: -60 on channels 0-7, -1000 on 8-11, mild elsewhere       pairwise
//   2: mild everywhere                                         plain
//   3: mild, but -1000 at row 7 of channel 5 and -inf at row 3 of channel 6
//      (a decay of exactly 0), strong and mild rows in one channel  pairwise
//   4: the whole chunk far past the range: -60 everywhere, -1000 on channel 0
//   5: every channel's G_last at -115 (base 2): the plain path's edge   plain
//   6: (5 rows) -30 on channel 0, -117/5 (base 2) a row on channel 1    pairwise
std::vector<double> strong_log_decays(int64_t B, int64_t T, int64_t HV, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double ln2 = std::log(2.0);
  std::vector<double> a(static_cast<size_t>(B * T * HV * K));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t d = 0; d < K; ++d) {
          const int64_t chunk = t / 16, row = t % 16;
          double x = -0.05 * uniform(rng);
          switch (chunk) {
            case 1: x = d < 8 ? -60.0 : d < 12 ? -1000.0 : x; break;
            case 3: x = d == 5 && row == 7 ? -1000.0 : d == 6 && row == 3 ? -kInf : x; break;
            case 4: x = d == 0 ? -1000.0 : -60.0; break;
            case 5: x = -115.0 * ln2 / 16; break;
            case 6: x = d == 0 ? -30.0 : d == 1 ? -117.0 * ln2 / 5 : x; break;
            default: break;
          }
          a[static_cast<size_t>(((b * T + t) * HV + h) * K + d)] = x;
        }
  return a;
}

struct Outputs {
  std::vector<uint16_t> out;
  std::vector<float> out_unrounded, final_state;
};

// One backend's run of p with g and beta from `gt` (validated first), outputs
// unrounded too; the final state fp32.
Outputs run(const HostProblem& p, const GateTensors& gt, Which which,
            cpu::ChunkSteps steps = cpu::ChunkSteps::kSingle) {
  Outputs r;
  r.out.assign(p.out_elems(), float_to_bf16(std::nanf("")));
  r.out_unrounded.assign(p.out_elems(), std::nanf(""));
  r.final_state.assign(p.state_elems(), std::nanf(""));
  ForwardArgs a = p.host_args(r.out.data(), r.final_state.data());
  gt.apply(a);
  const Backend backend = which == Which::kReference ? Backend::kCpuReference : Backend::kCpuChunked;
  const Status v = validate(a, backend);
  EXPECT_TRUE(v.ok()) << v.message;
  const Status st = which == Which::kReference ? cpu::reference_forward_f64(a, r.out_unrounded.data())
                                               : cpu::chunked_forward_f32(a, 0, r.out_unrounded.data(), steps);
  EXPECT_TRUE(st.ok()) << st.message;
  return r;
}

// out (unrounded) and the final state against the oracle's, at `out_bar` and
// `state_bar` relative RMS; NaN anywhere fails.
void expect_close(const Outputs& got, const Outputs& ref, const std::string& label, double out_bar, double state_bar) {
  EXPECT_TRUE(all_finite(got.out_unrounded)) << label << ": non-finite outputs";
  EXPECT_TRUE(all_finite(got.final_state)) << label << ": non-finite final state";
  const double eo = rel_rms(got.out_unrounded, ref.out_unrounded), es = rel_rms(got.final_state, ref.final_state);
  EXPECT_LE(eo, out_bar) << label;
  EXPECT_LE(es, state_bar) << label;
  std::printf("[ errors ] %-52s out %.3e  final_state %.3e\n", label.c_str(), eo, es);
}

// Varlen with GVA, an empty sequence and partial chunks: lengths 37, 0, 64, 21;
// H = 2, HV = 4, K = V = 32.
HostProblem varlen_problem(uint64_t seed) { return varlen_gva_problem(seed); }

// ---- accuracy -------------------------------------------------------------------

// fla's log decays (bf16 or fp32), the beta logit: kCpuChunked (single and pair
// steps) against the oracle at the spec's bars, with decays as Kimi Linear's
// gates make them (many chunks take the pairwise path) and milder ones.
TEST(GateForms, LogDecayMatchesTheOracle) {
  for (const DType g_dtype : {DType::kBF16, DType::kFP32})
    for (const double a_max : {16.0, 1.0}) {
      const HostProblem p = varlen_problem(301);
      GateTensors gt;
      gt.set_g(GateForm::kLogDecay, g_dtype, fla_log_decays(p, a_max, 302));
      gt.set_beta(false, DType::kBF16, beta_logits(p));
      const Outputs ref = run(p, gt, Which::kReference);
      const std::string label = std::string("log decay ") + to_string(g_dtype) + ", exp(A_log) <= " +
                                std::to_string(static_cast<int>(a_max));
      expect_close(run(p, gt, Which::kChunked), ref, label, kOutBar, kStateBar);
      expect_close(run(p, gt, Which::kChunked, cpu::ChunkSteps::kPairs), ref, label + " (pairs)", kOutBar, kStateBar);
    }
}

// The safe gate's own log decay, formed on the host in float64 and passed as fp32,
// runs as the safe gate does: equal to fp32 rounding of a (and of γ on
// kCpuChunked), on both backends. lower_bound is not read (0.5 would be refused
// with the safe gate), nor A_log and dt_bias (null).
TEST(GateForms, LogDecayOfTheSafeGateIsTheSafeGateRun) {
  const HostProblem p = varlen_problem(311);
  GateTensors safe;
  safe.g16 = p.g;
  safe.beta16 = p.beta;
  GateTensors logd;
  logd.set_g(GateForm::kLogDecay, DType::kFP32, safe_gate_log_decays(p));
  logd.set_beta(false, DType::kBF16, beta_logits(p));
  HostProblem unbounded = p;
  unbounded.spec.lower_bound = 0.5f;
  // The rounding of a to fp32 (2^-24 relative) moves the results by ~1e-7; a
  // gate read any other way moves them by far more than the bar.
  constexpr double kRoundingBar = 1e-5;
  for (const Which which : {Which::kReference, Which::kChunked}) {
    const Outputs s = run(p, safe, which);
    const Outputs l = run(unbounded, logd, which);
    const std::string label = which == Which::kReference ? "oracle" : "chunked";
    expect_close(l, s, "log decay of the safe gate, " + label, kRoundingBar, kRoundingBar);
  }
}

// beta given as the probability (bf16 or fp32), with the safe gate and with a log
// decay: against the oracle at the bars; fp32 probabilities also equal the logit's
// run to fp32 rounding (a flag ignored would apply the sigmoid twice).
TEST(GateForms, BetaAsProbability) {
  const HostProblem p = varlen_problem(321);
  GateTensors logit;
  logit.g16 = p.g;
  logit.beta16 = p.beta;
  const Outputs logit_ref = run(p, logit, Which::kReference);
  for (const GateForm form : {GateForm::kSafeGate, GateForm::kLogDecay})
    for (const DType beta_dtype : {DType::kBF16, DType::kFP32}) {
      GateTensors gt;
      if (form == GateForm::kSafeGate) {
        gt.g16 = p.g;
      } else {
        gt.set_g(GateForm::kLogDecay, DType::kFP32, fla_log_decays(p, 4.0, 322));
      }
      gt.set_beta(true, beta_dtype, beta_probabilities(p));
      const std::string label = std::string("beta probability ") + to_string(beta_dtype) + ", " + to_string(form);
      const Outputs ref = run(p, gt, Which::kReference);
      expect_close(run(p, gt, Which::kChunked), ref, label, kOutBar, kStateBar);
      if (form == GateForm::kSafeGate && beta_dtype == DType::kFP32)
        expect_close(ref, logit_ref, label + " = the logit's run", 1e-5, 1e-5);
    }
}

// Decays too strong for K_inv = k̂·2^-G (strong_log_decays: chunks past 2^-116,
// strong and mild channels and rows mixed, a decay of exactly 0, a chunk at the
// plain path's edge, a partial last chunk): kCpuChunked, single and pair steps,
// against the oracle at the bars, nothing NaN, for bf16 and fp32 g, from a zero
// and from a random initial state.
TEST(GateForms, StrongDecaysStayExact) {
  for (const DType g_dtype : {DType::kBF16, DType::kFP32})
    for (const DType initial : {DType::kNone, DType::kFP32}) {
      ProblemSpec spec;
      spec.batch = 2;
      spec.seqlen = 101;
      spec.heads = 1;
      spec.v_heads = 2;
      spec.head_dim = 32;
      spec.initial_state = initial;
      const HostProblem p = make_problem(spec, 331);
      GateTensors gt;
      gt.set_g(GateForm::kLogDecay, g_dtype, strong_log_decays(p.B, p.T, p.HV, p.K, 332));
      gt.set_beta(true, DType::kFP32, beta_probabilities(p));
      const Outputs ref = run(p, gt, Which::kReference);
      const std::string label = std::string("strong decays ") + to_string(g_dtype) +
                                (initial == DType::kNone ? ", zero state" : ", initial state");
      expect_close(run(p, gt, Which::kChunked), ref, label, kOutBar, kStateBar);
      expect_close(run(p, gt, Which::kChunked, cpu::ChunkSteps::kPairs), ref, label + " (pairs)", kOutBar, kStateBar);
    }
}

// Every channel decayed far past the range on every token of a long sequence
// (-1000 a token): the state is the last token's write alone, and each output is
// the oracle's, with no NaN.
TEST(GateForms, EveryChunkFarPastTheRange) {
  ProblemSpec spec;
  spec.seqlen = 70;
  spec.heads = 1;
  spec.head_dim = 32;
  const HostProblem p = make_problem(spec, 341);
  GateTensors gt;
  gt.set_g(GateForm::kLogDecay, DType::kFP32, std::vector<double>(p.g.size(), -1000.0));
  gt.set_beta(false, DType::kBF16, beta_logits(p));
  expect_close(run(p, gt, Which::kChunked), run(p, gt, Which::kReference), "-1000 everywhere", kOutBar, kStateBar);
}

// ---- engines' features with a log decay -------------------------------------------

// The g, beta and token tensors of `a` (one sequence's tokens [begin, begin + len)
// of a dense varlen call) as a call of their own: pointers offset by the tensors'
// own element sizes.
ForwardArgs tokens_of(const ForwardArgs& a, int64_t begin, int64_t len) {
  const int64_t H = a.num_heads, HV = value_heads(a), K = a.head_dim_k, V = a.head_dim_v;
  ForwardArgs f = a;
  f.q = static_cast<const uint16_t*>(a.q) + begin * H * K;
  f.k = static_cast<const uint16_t*>(a.k) + begin * H * K;
  f.v = static_cast<const uint16_t*>(a.v) + begin * HV * V;
  f.g = static_cast<const char*>(a.g) + begin * HV * K * dtype_bytes(a.g_dtype);
  f.beta = static_cast<const char*>(a.beta) + begin * HV * dtype_bytes(a.beta_dtype);
  f.cu_seqlens = f.cu_seqlens_host = nullptr;
  f.num_seqs = 0;
  f.batch = 1;
  f.seqlen = len;
  return f;
}

// Varlen on a state pool with checkpoints, fp32 log decays (Kimi-like, pairwise
// chunks included) and fp32 probabilities, on both backends: out and the final
// slots are bitwise the dense run from the gathered states, and each checkpoint is
// bitwise the state of the run over its prefix.
TEST(GateForms, PoolAndCheckpointsWithALogDecay) {
  const HostProblem p = varlen_problem(351);  // lengths 37, 0, 64, 21
  GateTensors gt;
  gt.set_g(GateForm::kLogDecay, DType::kFP32, fla_log_decays(p, 16.0, 352));
  gt.set_beta(true, DType::kFP32, beta_probabilities(p));
  const int64_t N = p.N, HV = p.HV, K = p.K, V = p.V, per_slot = HV * V * K;
  const std::vector<int32_t> slots = {3, -1, 0, 1};
  constexpr int64_t kPoolSize = 4, kInterval = 32;
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    // The pool: slot s holds sequence n's initial state where slots[n] = s.
    std::vector<float> pool(static_cast<size_t>(kPoolSize * per_slot), 0.f);
    std::vector<float> dense_init(p.state_elems(), 0.f);
    for (int64_t n = 0; n < N; ++n) {
      if (slots[static_cast<size_t>(n)] < 0) continue;
      std::copy_n(p.init_f32.begin() + n * per_slot, per_slot, pool.begin() + slots[static_cast<size_t>(n)] * per_slot);
      std::copy_n(p.init_f32.begin() + n * per_slot, per_slot, dense_init.begin() + n * per_slot);
    }
    const int64_t capacity = 2 + 0 + 2 + 1;  // ceil(L / 32) for 37, 0, 64, 21
    std::vector<float> ck(static_cast<size_t>(capacity * per_slot), std::nanf(""));
    std::vector<uint16_t> out_pool(p.out_elems()), out_dense(p.out_elems());
    ForwardArgs a = p.host_args(out_pool.data(), nullptr);
    gt.apply(a);
    use_state_pool(a, pool.data(), DType::kFP32, kPoolSize, slots.data());
    a.checkpoints = ck.data();
    a.checkpoints_dtype = DType::kFP32;
    a.checkpoint_interval = kInterval;
    a.checkpoints_capacity = capacity;
    a.checkpoints_value_major = true;
    Status st = forward(a, backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;

    std::vector<float> dense_final(p.state_elems(), 0.f);
    ForwardArgs d = p.host_args(out_dense.data(), dense_final.data());
    gt.apply(d);
    d.initial_state = dense_init.data();
    st = forward(d, backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(out_pool, out_dense) << to_string(backend);
    for (int64_t n = 0; n < N; ++n) {
      if (slots[static_cast<size_t>(n)] < 0) continue;
      EXPECT_EQ(0, std::memcmp(pool.data() + slots[static_cast<size_t>(n)] * per_slot,
                               dense_final.data() + n * per_slot, static_cast<size_t>(per_slot) * 4))
          << to_string(backend) << ": slot of sequence " << n;
    }

    // Checkpoint entry offset(n) + j: the state after j·c tokens of sequence n.
    int64_t entry = 0;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t begin = p.cu_seqlens[static_cast<size_t>(n)], L = p.cu_seqlens[static_cast<size_t>(n) + 1] - begin;
      for (int64_t j = 0; j * kInterval < L; ++j, ++entry) {
        std::vector<float> want(dense_init.begin() + n * per_slot, dense_init.begin() + (n + 1) * per_slot);
        if (j > 0) {
          std::vector<uint16_t> scratch(static_cast<size_t>(j * kInterval * HV * V));
          std::vector<float> init = want;
          ForwardArgs f = tokens_of(d, begin, j * kInterval);
          f.out = scratch.data();
          f.initial_state = init.data();
          f.final_state = want.data();
          st = forward(f, backend, nullptr, 0, nullptr);
          ASSERT_TRUE(st.ok()) << st.message;
        }
        EXPECT_EQ(0, std::memcmp(ck.data() + entry * per_slot, want.data(), static_cast<size_t>(per_slot) * 4))
            << to_string(backend) << ": checkpoint " << j << " of sequence " << n;
      }
    }
  }
}

// Segment summaries of ranges (not 16-aligned, the later ones starting far into
// fp32 g and beta) with strong log decays, composed along each sequence with
// compose_summaries and applied to the initial state: the oracle's final state.
TEST(GateForms, SegmentSummariesWithALogDecay) {
  ProblemSpec spec;
  spec.seqlens = {101, 0, 45};
  spec.heads = 1;
  spec.v_heads = 2;
  spec.head_dim = 32;
  const HostProblem p = make_problem(spec, 361);
  // Sequence 0 gets the strong pattern, sequence 2 mild decays, so that M keeps
  // part of the incoming state.
  std::vector<double> a = strong_log_decays(1, p.T, p.HV, p.K, 362);
  for (size_t i = static_cast<size_t>(101 * p.HV * p.K); i < a.size(); ++i) a[i] = -0.02 * (1 + std::sin(double(i)));
  GateTensors gt;
  gt.set_g(GateForm::kLogDecay, DType::kFP32, a);
  gt.set_beta(true, DType::kFP32, beta_probabilities(p));
  const Outputs straight = run(p, gt, Which::kReference);
  const std::vector<std::vector<int64_t>> cuts = {{0, 23, 53, 101}, {}, {101, 120, 146}};
  const int64_t HV = p.HV, K = p.K, V = p.V;
  // Bars: float64 summaries rounded to fp32 (composed in float64); the chunked
  // backend's own fp32 chunks (the oracle's bars otherwise).
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    const double bar = backend == Backend::kCpuReference ? 1e-6 : kStateBar;
    for (size_t n = 0; n < cuts.size(); ++n) {
      if (cuts[n].empty()) continue;
      std::vector<int64_t> segs;
      for (size_t i = 0; i + 1 < cuts[n].size(); ++i) {
        segs.push_back(cuts[n][i]);
        segs.push_back(cuts[n][i + 1]);
      }
      ForwardArgs in = p.host_args(nullptr, nullptr);
      gt.apply(in);
      std::vector<float> M, B;
      const Status st = summaries_of(in, segs, backend, M, B);
      ASSERT_TRUE(st.ok()) << st.message;
      // Composed in token order into the first summary (in place).
      for (size_t s = 1; s < segs.size() / 2; ++s) {
        ComposeSummariesArgs c;
        c.count = HV;
        c.head_dim_k = K;
        c.head_dim_v = V;
        c.M1 = c.M = M.data();
        c.B1 = c.B = B.data();
        c.M2 = M.data() + s * static_cast<size_t>(HV * K * K);
        c.B2 = B.data() + s * static_cast<size_t>(HV * V * K);
        ASSERT_TRUE(compose_summaries(c, backend).ok());
      }
      std::vector<double> composed(static_cast<size_t>(HV * V * K)), oracle(composed.size());
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t i = 0; i < V; ++i)
          for (int64_t j = 0; j < K; ++j) {
            double acc = B[static_cast<size_t>((h * V + i) * K + j)];
            for (int64_t r = 0; r < K; ++r)
              acc += double(p.init_f32[static_cast<size_t>(((int64_t(n) * HV + h) * V + i) * K + r)]) *
                     M[static_cast<size_t>((h * K + r) * K + j)];
            composed[static_cast<size_t>((h * V + i) * K + j)] = acc;
            oracle[static_cast<size_t>((h * V + i) * K + j)] =
                straight.final_state[static_cast<size_t>(((int64_t(n) * HV + h) * V + i) * K + j)];
          }
      const double err = rel_rms(composed, oracle);
      EXPECT_LE(err, bar) << to_string(backend) << ": sequence " << n;
      std::printf("[ summary ] %-13s sequence %zu: final state %.3e\n", to_string(backend), n, err);
    }
  }
}

// g and beta in fp32 as strided views (a fused projection's columns: token stride
// past the rows, heads apart, NaN in between) give the dense call's bits on both
// backends.
TEST(GateForms, StridedFp32GateAndBetaAreTheDenseCall) {
  const HostProblem p = varlen_problem(371);
  GateTensors gt;
  gt.set_g(GateForm::kLogDecay, DType::kFP32, fla_log_decays(p, 16.0, 372));
  gt.set_beta(true, DType::kFP32, beta_probabilities(p));
  const int64_t T = p.tokens(), HV = p.HV, K = p.K;
  constexpr int64_t kPad = 3;  // elements between heads
  const int64_t g_head = K + kPad, beta_head = 1 + kPad, width = HV * g_head + HV * beta_head + 5;
  std::vector<float> fused(static_cast<size_t>(T * width), std::nanf(""));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < HV; ++h) {
      for (int64_t d = 0; d < K; ++d)
        fused[static_cast<size_t>(t * width + h * g_head + d)] = gt.g32[static_cast<size_t>((t * HV + h) * K + d)];
      fused[static_cast<size_t>(t * width + HV * g_head + h * beta_head)] = gt.beta32[static_cast<size_t>(t * HV + h)];
    }
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    std::vector<uint16_t> out_dense(p.out_elems()), out_view(p.out_elems());
    std::vector<float> fin_dense(p.state_elems()), fin_view(p.state_elems());
    ForwardArgs a = p.host_args(out_dense.data(), fin_dense.data());
    gt.apply(a);
    ASSERT_TRUE(forward(a, backend, nullptr, 0, nullptr).ok());
    ForwardArgs b = p.host_args(out_view.data(), fin_view.data());
    gt.apply(b);
    b.g = fused.data();
    b.beta = fused.data() + HV * g_head;
    b.g_token_stride = b.beta_token_stride = width;
    b.g_head_stride = g_head;
    b.beta_head_stride = beta_head;
    const Status st = forward(b, backend, nullptr, 0, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(out_view, out_dense) << to_string(backend);
    EXPECT_EQ(fin_view, fin_dense) << to_string(backend);
  }
}

// Decode with fp32 log decays and fp32 probabilities (vLLM's path): each
// sequence's outputs and final slot are the forward oracle's, run from its pooled
// state on its tokens; the padding entry's tokens hold a positive g, which is not
// refused since they are not read, while a positive g in a read token is.
TEST(GateForms, DecodeWithALogDecayIsTheForwardOracle) {
  DecodeSpec spec;
  spec.seq_tokens = {1, 3, 2, 1, 4};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = 32;
  spec.padding_entries = 1;
  const DecodeProblem p = make_decode_problem(spec, 381);
  std::mt19937_64 rng(382);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> g(p.g.size()), beta(p.beta.size());
  for (double& x : g) x = -8.0 * uniform(rng);
  for (double& x : beta) x = uniform(rng);
  for (int64_t i = 0; i < p.HV * p.K; ++i) g[static_cast<size_t>(i)] = 1.0;  // sequence 0: padding
  GateTensors gt;
  gt.set_g(GateForm::kLogDecay, DType::kFP32, g);
  gt.set_beta(true, DType::kFP32, beta);
  for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
    std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V), 0x7fc0);
    std::vector<uint8_t> pool = p.pool_bytes();
    DecodeArgs a = p.args(out.data(), pool.data(), nullptr);
    gt.apply(a);
    const Status st = decode(a, backend, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    const std::vector<float> after = state_bytes_to_float(pool, DType::kFP32);
    for (int64_t n = 0; n < p.N; ++n) {
      if (p.index(n) < 0) continue;
      const int64_t t0 = p.cu_seqlens[static_cast<size_t>(n)], L = p.cu_seqlens[static_cast<size_t>(n) + 1] - t0;
      std::vector<float> init(p.pool_f32.begin() + p.index(n) * p.per_slot,
                              p.pool_f32.begin() + (p.index(n) + 1) * p.per_slot);
      std::vector<float> want_state(static_cast<size_t>(p.per_slot)), want_out(static_cast<size_t>(L * p.HV * p.V));
      std::vector<uint16_t> out_bits(want_out.size());
      ForwardArgs f;
      f.q = p.q.data() + t0 * p.H * p.K;
      f.k = p.k.data() + t0 * p.H * p.K;
      f.v = p.v.data() + t0 * p.HV * p.V;
      gt.apply(f);
      f.g = gt.g32.data() + t0 * p.HV * p.K;
      f.beta = gt.beta32.data() + t0 * p.HV;
      f.out = out_bits.data();
      f.initial_state = init.data();
      f.initial_state_dtype = DType::kFP32;
      f.final_state = want_state.data();
      f.final_state_dtype = DType::kFP32;
      f.batch = 1;
      f.seqlen = L;
      f.num_heads = p.H;
      f.num_v_heads = p.HV;
      f.head_dim_k = p.K;
      f.head_dim_v = p.V;
      f.scale = p.scale;
      ASSERT_TRUE(cpu::reference_forward_f64(f, want_out.data()).ok());
      const float* got_state = after.data() + p.index(n) * p.per_slot;
      EXPECT_LE(rel_rms(got_state, want_state.data(), want_state.size()), 1e-6) << to_string(backend) << " " << n;
      std::vector<float> got_out;
      for (size_t i = 0; i < want_out.size(); ++i)
        got_out.push_back(bf16_to_float(out[static_cast<size_t>(t0 * p.HV * p.V) + i]));
      EXPECT_LE(rel_rms(got_out.data(), want_out.data(), want_out.size()), 3e-3) << to_string(backend) << " " << n;
    }
    // A positive g in a token the step reads: refused by name, at its place.
    GateTensors bad = gt;
    const int64_t t = p.cu_seqlens[2] + 1, h = 3, d = 5;  // sequence 2's second token
    bad.g32[static_cast<size_t>((t * p.HV + h) * p.K + d)] = 0.25f;
    DecodeArgs b = p.args(out.data(), pool.data(), nullptr);
    bad.apply(b);
    const Status s = validate_decode(b, backend);
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
    EXPECT_NE(s.message.find("g: expected log decays <= 0"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("got 0.25 at token " + std::to_string(t) + ", head 3, channel 5"), std::string::npos)
        << s.message;
  }
}

// ---- validation -------------------------------------------------------------------

void expect_invalid_status(const Status& s, const std::string& needle) {
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_NE(s.message.find(needle), std::string::npos) << "message: " << s.message;
}

// A small forward with fp32 log decays and fp32 probabilities, and its outputs.
struct LogDecayCall {
  HostProblem p = varlen_problem(391);
  GateTensors gt;
  std::vector<uint16_t> out = std::vector<uint16_t>(p.out_elems());
  std::vector<float> fin = std::vector<float>(p.state_elems());
  LogDecayCall() {
    gt.set_g(GateForm::kLogDecay, DType::kFP32, fla_log_decays(p, 4.0, 392));
    gt.set_beta(true, DType::kFP32, beta_probabilities(p));
  }
  ForwardArgs args() const {
    ForwardArgs a = p.host_args(const_cast<uint16_t*>(out.data()), const_cast<float*>(fin.data()));
    gt.apply(a);
    return a;
  }
};

// A log decay above 0 is refused on the CPU backends, naming g and the first
// (token, head, channel), in the forward and in segment summaries, bf16 and fp32;
// NaN and -inf pass; the same value as a raw gate is fine.
TEST(GateFormsValidation, PositiveLogDecayIsRefused) {
  for (const DType g_dtype : {DType::kBF16, DType::kFP32}) {
    LogDecayCall c;
    std::vector<double> g = fla_log_decays(c.p, 4.0, 393);
    const int64_t t = 40, h = 2, d = 7;
    const size_t at = static_cast<size_t>((t * c.p.HV + h) * c.p.K + d);
    g[at] = 0.5;
    g[at + 1] = 2.0;  // a later one: the first is named
    c.gt.set_g(GateForm::kLogDecay, g_dtype, g);
    for (const Backend backend : {Backend::kCpuReference, Backend::kCpuChunked}) {
      const std::string where = "got 0.5 at token 40, head 2, channel 7";
      expect_invalid_status(validate(c.args(), backend), where);
      expect_invalid_status(forward(c.args(), backend, nullptr, 0, nullptr), "g: expected log decays <= 0");
      std::vector<float> M, B;
      expect_invalid_status(summaries_of(c.args(), {0, 10}, backend, M, B), where);
      // kSafeGate reads the same values as a raw gate: any sign.
      ForwardArgs safe = c.args();
      safe.gate_form = GateForm::kSafeGate;
      safe.A_log = c.p.A_log.data();
      safe.dt_bias = c.p.dt_bias.data();
      EXPECT_TRUE(validate(safe, backend).ok());
    }
    // NaN (propagates like any NaN input) and -inf (a decay of 0) are not refused.
    g[at] = std::nan("");
    g[at + 1] = -kInf;
    c.gt.set_g(GateForm::kLogDecay, g_dtype, g);
    const Status s = validate(c.args(), Backend::kCpuChunked);
    EXPECT_TRUE(s.ok()) << s.message;
  }
}

// Unknown gate_form, g_dtype and beta_dtype values are refused by name, kNone too.
TEST(GateFormsValidation, UnknownFormsAndDtypesAreRefused) {
  LogDecayCall c;
  ForwardArgs a = c.args();
  a.gate_form = static_cast<GateForm>(5);
  expect_invalid_status(validate(a, Backend::kCpuChunked), "gate_form: unknown value 5");
  for (const DType bad : {DType::kNone, static_cast<DType>(7)}) {
    const std::string got = bad == DType::kNone ? "got kNone" : "got unknown value 7";
    a = c.args();
    a.g_dtype = bad;
    expect_invalid_status(validate(a, Backend::kCpuReference), "g_dtype: expected kBF16 or kFP32, " + got);
    a = c.args();
    a.beta_dtype = bad;
    expect_invalid_status(validate(a, Backend::kCpuReference), "beta_dtype: expected kBF16 or kFP32, " + got);
  }
  // The same rules for decode.
  DecodeSpec spec;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 394);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  DecodeArgs d = p.args(out.data(), pool.data(), nullptr);
  d.gate_form = static_cast<GateForm>(-1);
  expect_invalid_status(validate_decode(d, Backend::kCpuReference), "gate_form: unknown value -1");
  d = p.args(out.data(), pool.data(), nullptr);
  d.g_dtype = DType::kNone;
  expect_invalid_status(validate_decode(d, Backend::kCpuReference), "g_dtype: expected kBF16 or kFP32, got kNone");
  d = p.args(out.data(), pool.data(), nullptr);
  d.beta_dtype = static_cast<DType>(3);
  expect_invalid_status(validate_decode(d, Backend::kCpuReference), "beta_dtype: expected kBF16 or kFP32");
  EXPECT_STREQ(to_string(GateForm::kSafeGate), "kSafeGate");
  EXPECT_STREQ(to_string(GateForm::kLogDecay), "kLogDecay");
}

// A_log and dt_bias may be null, and lower_bound anything, with a log decay; with
// the safe gate, which reads them, they are refused. Forward and decode.
TEST(GateFormsValidation, SafeGateOperandsOnlyWithTheSafeGate) {
  LogDecayCall c;
  ForwardArgs a = c.args();  // A_log, dt_bias null
  a.lower_bound = 3.f;
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());
  a.gate_form = GateForm::kSafeGate;
  a.g_dtype = DType::kFP32;  // the raw gate in fp32 is fine
  expect_invalid_status(validate(a, Backend::kCpuChunked), "A_log: null pointer");
  a.A_log = c.p.A_log.data();
  expect_invalid_status(validate(a, Backend::kCpuChunked), "dt_bias: null pointer");
  a.dt_bias = c.p.dt_bias.data();
  expect_invalid_status(validate(a, Backend::kCpuChunked), "lower_bound: expected a finite value in [-5, 0)");
  a.lower_bound = -5.f;
  EXPECT_TRUE(validate(a, Backend::kCpuChunked).ok());

  DecodeSpec spec;
  spec.head_dim = 16;
  const DecodeProblem p = make_decode_problem(spec, 395);
  std::vector<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  std::vector<uint8_t> pool = p.pool_bytes();
  DecodeArgs d = p.args(out.data(), pool.data(), nullptr);
  std::vector<float> g(p.g.size(), -0.5f);
  d.gate_form = GateForm::kLogDecay;
  d.g = g.data();
  d.g_dtype = DType::kFP32;
  d.A_log = nullptr;
  d.dt_bias = nullptr;
  d.lower_bound = std::nanf("");
  Status s = validate_decode(d, Backend::kCpuReference);
  EXPECT_TRUE(s.ok()) << s.message;
  d.gate_form = GateForm::kSafeGate;
  expect_invalid_status(validate_decode(d, Backend::kCpuReference), "A_log: null pointer");
  d.A_log = p.A_log.data();
  expect_invalid_status(validate_decode(d, Backend::kCpuReference), "dt_bias: null pointer");
  d.dt_bias = p.dt_bias.data();
  expect_invalid_status(validate_decode(d, Backend::kCpuReference), "lower_bound");
}

// fp32 g and beta: 4-byte aligned pointers on the CPU backends (and beta on
// kCuda); kCuda's rows of g 16 bytes apart: strides of 4 fp32 elements pass
// where bf16 needs 8. The byte extents of fp32 g count 4 bytes an element: an out
// inside g's second half is refused.
TEST(GateFormsValidation, Fp32AlignmentStridesAndOverlaps) {
  LogDecayCall c;
  std::vector<float> shifted(c.gt.g32.size() + 1);
  ForwardArgs a = c.args();
  a.g = reinterpret_cast<const char*>(shifted.data()) + 2;
  expect_invalid_status(validate(a, Backend::kCpuChunked), "g: expected a 4-byte aligned pointer");
  a = c.args();
  a.beta = reinterpret_cast<const char*>(shifted.data()) + 2;
  expect_invalid_status(validate(a, Backend::kCpuReference), "beta: expected a 4-byte aligned pointer");
  expect_invalid_status(validate(a, Backend::kCuda), "beta: expected a 4-byte aligned pointer");
  a.beta_dtype = DType::kBF16;  // bf16 beta: 2 bytes are enough
  EXPECT_EQ(validate(a, Backend::kCpuReference).message.find("beta"), std::string::npos);

  // kCuda: g strides of 4 fp32 elements (16 bytes) pass its row rule, 6 do not;
  // bf16 needs 8. (The build or the device may refuse the call later, not for g.)
  const int64_t HV = c.p.HV, K = c.p.K;
  std::vector<float> wide_g(static_cast<size_t>(c.p.tokens() * (HV * K + 8)), -1.f);
  a = c.args();
  a.g = wide_g.data();
  a.g_token_stride = HV * K + 4;
  EXPECT_EQ(validate(a, Backend::kCuda).message.find("g_token_stride"), std::string::npos)
      << validate(a, Backend::kCuda).message;
  a.g_token_stride = HV * K + 6;
  expect_invalid_status(validate(a, Backend::kCuda),
                        "g_token_stride / g_head_stride: backend kCuda needs multiples of 4 elements");
  a.g_dtype = DType::kBF16;
  a.g_token_stride = HV * K + 4;
  expect_invalid_status(validate(a, Backend::kCuda),
                        "g_token_stride / g_head_stride: backend kCuda needs multiples of 8 elements");

  // out placed just past where g would end as bf16, inside it as fp32.
  const size_t g_bytes = c.gt.g32.size() * 4, out_bytes = c.p.out_elems() * 2;
  std::vector<float> both((g_bytes + out_bytes) / 4 + 1, -1.f);
  std::memcpy(both.data(), c.gt.g32.data(), g_bytes);
  a = c.args();
  a.g = both.data();
  a.out = reinterpret_cast<char*>(both.data()) + g_bytes / 2;
  expect_invalid_status(validate(a, Backend::kCpuChunked), "out: shares memory with g");
  a.g_dtype = DType::kBF16;  // the same bytes as bf16 end where out starts
  a.gate_form = GateForm::kSafeGate;
  a.A_log = c.p.A_log.data();
  a.dt_bias = c.p.dt_bias.data();
  const Status s = validate(a, Backend::kCpuChunked);
  EXPECT_TRUE(s.ok()) << s.message;
}

// ---- C ABI ------------------------------------------------------------------------

// The new fields through the C structs: the ABI version, offsets past ABI 5's
// structs, zero meaning bf16, flags 0 or 1, and runs bitwise the C++ API's for a
// forward (fp32 log decay, fp32 probabilities) and a decode.
TEST(GateFormsCApi, FieldsRoundTrip) {
  static_assert(FLASHKDA_C_ABI_VERSION == 6, "the ABI that added the gate forms");
  static_assert(sizeof(void*) != 8 || offsetof(flashkda_forward_args, gate_form) == 376, "C struct layout changed");
  static_assert(sizeof(void*) != 8 || offsetof(flashkda_decode_args, gate_form) == 212, "C struct layout changed");
  static_assert(sizeof(void*) != 8 || offsetof(flashkda_decode_args, reserved) == 332, "C struct layout changed");
  EXPECT_EQ(flashkda_abi_version(), 6);

  LogDecayCall c;
  std::vector<uint16_t> out_cpp(c.p.out_elems()), out_c(c.p.out_elems());
  std::vector<float> fin_cpp(c.p.state_elems()), fin_c(c.p.state_elems());
  ForwardArgs a = c.args();
  a.out = out_cpp.data();
  a.final_state = fin_cpp.data();
  ASSERT_TRUE(forward(a, Backend::kCpuChunked, nullptr, 0, nullptr).ok());
  flashkda_forward_args f;
  flashkda_forward_args_init(&f);
  f.q = a.q; f.k = a.k; f.v = a.v; f.g = a.g; f.beta = a.beta;
  f.out = out_c.data();
  f.initial_state = a.initial_state; f.initial_state_dtype = FLASHKDA_DTYPE_FP32;
  f.final_state = fin_c.data(); f.final_state_dtype = FLASHKDA_DTYPE_FP32;
  f.cu_seqlens = a.cu_seqlens; f.num_seqs = a.num_seqs;
  f.batch = a.batch; f.seqlen = a.seqlen; f.num_heads = a.num_heads; f.num_v_heads = a.num_v_heads;
  f.head_dim_k = a.head_dim_k; f.head_dim_v = a.head_dim_v; f.scale = a.scale;
  f.gate_form = FLASHKDA_GATE_LOG_DECAY;
  f.g_dtype = FLASHKDA_DTYPE_FP32;
  f.beta_is_probability = 1;
  f.beta_dtype = FLASHKDA_DTYPE_FP32;
  ASSERT_EQ(flashkda_forward(&f, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_OK)
      << flashkda_last_error();
  EXPECT_EQ(out_c, out_cpp);
  EXPECT_EQ(fin_c, fin_cpp);

  flashkda_forward_args bad = f;
  bad.beta_is_probability = 2;
  EXPECT_EQ(flashkda_validate(&bad, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "beta_is_probability: expected 0 or 1, got 2");
  bad = f;
  bad.gate_form = 2;
  EXPECT_EQ(flashkda_validate(&bad, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("gate_form: unknown value 2"), std::string::npos);
  bad = f;
  bad.g_dtype = 9;
  EXPECT_EQ(flashkda_validate(&bad, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("g_dtype"), std::string::npos);
  // g_dtype and beta_dtype 0 (a struct of ABI 5, zeroed) are bf16: the bits of
  // FLASHKDA_DTYPE_BF16's call.
  std::vector<uint16_t> g16, beta16;
  for (float x : c.gt.g32) g16.push_back(float_to_bf16(x));
  for (float x : c.gt.beta32) beta16.push_back(float_to_bf16(x));
  std::vector<uint16_t> out_zero(out_c.size()), out_bf16(out_c.size());
  std::vector<float> fin_zero(fin_c.size()), fin_bf16(fin_c.size());
  for (const int32_t dtype : {0, FLASHKDA_DTYPE_BF16}) {
    flashkda_forward_args z = f;
    z.g = g16.data();
    z.beta = beta16.data();
    z.g_dtype = z.beta_dtype = dtype;
    z.out = dtype == 0 ? out_zero.data() : out_bf16.data();
    z.final_state = dtype == 0 ? fin_zero.data() : fin_bf16.data();
    ASSERT_EQ(flashkda_forward(&z, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_OK)
        << flashkda_last_error();
  }
  EXPECT_EQ(out_zero, out_bf16);
  EXPECT_EQ(fin_zero, fin_bf16);
  EXPECT_NE(out_zero, out_c);  // bf16 inputs: not the fp32 call's bits

  // Decode: fp32 log decays and probabilities through the C struct's fields.
  DecodeSpec spec;
  spec.head_dim = 16;
  spec.tokens_per_seq = 2;
  const DecodeProblem p = make_decode_problem(spec, 396);
  std::vector<float> g(p.g.size()), beta(p.beta.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = -0.1f * static_cast<float>(i % 13);
  for (size_t i = 0; i < beta.size(); ++i) beta[i] = 0.05f * static_cast<float>(i % 17);
  std::vector<uint16_t> dout_cpp(static_cast<size_t>(p.T * p.HV * p.V)), dout_c(dout_cpp.size());
  std::vector<uint8_t> pool_cpp = p.pool_bytes(), pool_c = p.pool_bytes();
  DecodeArgs d = p.args(dout_cpp.data(), pool_cpp.data(), nullptr);
  d.gate_form = GateForm::kLogDecay;
  d.g = g.data();
  d.g_dtype = DType::kFP32;
  d.beta = beta.data();
  d.beta_is_probability = true;
  d.beta_dtype = DType::kFP32;
  d.A_log = nullptr;
  d.dt_bias = nullptr;
  ASSERT_TRUE(decode(d, Backend::kCpuReference, nullptr).ok());
  flashkda_decode_args e;
  flashkda_decode_args_init(&e);
  e.q = d.q; e.k = d.k; e.v = d.v; e.g = d.g; e.beta = d.beta; e.out = dout_c.data();
  e.state_pool = pool_c.data(); e.state_indices = d.state_indices; e.state_dtype = FLASHKDA_DTYPE_FP32;
  e.num_seqs = d.num_seqs; e.tokens_per_seq = d.tokens_per_seq; e.total_tokens = d.total_tokens;
  e.pool_size = d.pool_size; e.num_heads = d.num_heads; e.num_v_heads = d.num_v_heads;
  e.head_dim_k = d.head_dim_k; e.head_dim_v = d.head_dim_v; e.scale = d.scale;
  e.gate_form = FLASHKDA_GATE_LOG_DECAY;
  e.g_dtype = FLASHKDA_DTYPE_FP32;
  e.beta_is_probability = 1;
  e.beta_dtype = FLASHKDA_DTYPE_FP32;
  ASSERT_EQ(flashkda_decode(&e, FLASHKDA_BACKEND_CPU_REFERENCE, nullptr), FLASHKDA_STATUS_OK) << flashkda_last_error();
  EXPECT_EQ(dout_c, dout_cpp);
  EXPECT_EQ(pool_c, pool_cpp);
  EXPECT_NE(pool_c, p.pool_bytes());  // the step ran
  flashkda_decode_args ebad = e;
  ebad.beta_is_probability = -1;
  EXPECT_EQ(flashkda_validate_decode(&ebad, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "beta_is_probability: expected 0 or 1, got -1");
}

}  // namespace
}  // namespace flashkda::testing
