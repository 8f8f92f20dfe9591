// The general inputs on the CUDA backend (label "gpu"): g as the log decay
// (GateForm::kLogDecay, fla's use_gate_in_kernel=False) in bf16 or fp32, beta as b
// itself (beta_is_probability) in bf16 or fp32, against the float64 oracle run on
// the same inputs; chunks whose decay passes 2^-116 (sm90/kernel/wide_decay.cuh);
// log decays above 0 (recorded for check_device_faults); decode. Skips, saying
// why, without a CUDA build or an sm_90 device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include <random>

#include "sm90/sm90_decode.h"
#include "sm90/sm90_forward.h"
#include "tests/common/decode_problem.h"
#include "tests/common/general_inputs.h"
#include "tests/common/huge_rows.h"
#endif

namespace flashkda::testing {
namespace {

#ifdef FLASHKDA_WITH_CUDA

uint64_t fresh_seed() {
  static uint64_t counter = 0;
  return std::random_device{}() ^ (++counter * 0x7f4a7c159e3779b9ull);
}

ProblemSpec spec_of(int64_t T, int64_t H, int64_t head_dim, std::vector<int64_t> seqlens = {}, int64_t HV = 0) {
  ProblemSpec s;
  s.seqlen = T;
  s.seqlens = std::move(seqlens);
  s.heads = H;
  s.v_heads = HV;
  s.head_dim = head_dim;
  return s;
}

bool all_finite(const std::vector<float>& x) {
  for (float e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

// The GPU run of p against the oracle of `ref` (p itself unless given: a problem
// whose inputs mean the same), at spec section 2's bars; a note of the errors.
void expect_at_bars(const HostProblem& p, const RunResult& gpu, const std::string& what,
                    const HostProblem* ref = nullptr) {
  ASSERT_TRUE(gpu.status.ok()) << what << ": " << gpu.status.message;
  const OracleResult o = run_oracle(ref != nullptr ? *ref : p);
  const double out = rel_rms(gpu.out, o.out), state = rel_rms(gpu.final_state, o.final_state);
  std::printf("[ errors ] %s: out %.3e  state %.3e\n", what.c_str(), out, state);
  EXPECT_TRUE(all_finite(gpu.out) && all_finite(gpu.final_state)) << what;
  EXPECT_LE(out, kOutBar) << what;
  EXPECT_LE(state, kStateBar) << what;
  const Status faults = check_device_faults(nullptr);
  EXPECT_TRUE(faults.ok()) << what << ": " << faults.message;
}

class GpuGateForms : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

// The safe gate's decays handed over as log decays, every dtype of g and beta: one
// chain, and a varlen batch with empty and partial sequences and grouped value
// heads; K = 128 and 64.
TEST_F(GpuGateForms, LogDecayAndProbabilityBetaMatchTheOracle) {
  for (const int64_t K : {128, 64}) {
    for (const DType g_dtype : {DType::kFP32, DType::kBF16}) {
      for (const bool prob : {true, false}) {
        for (const DType beta_dtype : {DType::kFP32, DType::kBF16}) {
          for (const ProblemSpec& spec :
               {spec_of(1000, 4, K), spec_of(0, 2, K, {0, 1, 15, 17, 700, 0, 16, 33}, 6)}) {
            const HostProblem base = make_problem(spec, fresh_seed());
            const HostProblem p =
                with_general_inputs(base, safe_gate_log_decays(base), g_dtype, prob, beta_dtype);
            const std::string what = "K " + std::to_string(K) + ", N " + std::to_string(p.N) + ", g " +
                                     to_string(g_dtype) + ", beta " + to_string(beta_dtype) +
                                     (prob ? " (b)" : " (logit)");
            expect_at_bars(p, run_cuda(p), what);
            // The same decays as the raw gate: the oracle of the safe-gate problem.
            if (g_dtype == DType::kFP32 && prob) expect_at_bars(p, run_cuda(p), what + " vs safe gate", &base);
          }
        }
      }
    }
  }
}

// Log decays far past the safe gate's bound on some channels (and, in one form, on
// whole chunks): those chunks take the exact path, the others the common one, in
// one sequence; one chain, segments (chains and superposition), K = 128 and 64.
TEST_F(GpuGateForms, StrongDecaysMatchTheOracle) {
  for (const int64_t K : {128, 64}) {
    for (const double strong : {-20.0, -60.0, -1000.0}) {
      for (const bool whole_chunks : {false, true}) {
        const HostProblem base = make_problem(spec_of(1000, 2, K), fresh_seed());
        const HostProblem p = with_general_inputs(
            base, with_strong_decays(base, safe_gate_log_decays(base), strong, 7, whole_chunks), DType::kFP32, true,
            DType::kFP32);
        expect_at_bars(p, run_cuda(p),
                       "K " + std::to_string(K) + ", strong " + std::to_string(strong) +
                           (whole_chunks ? ", whole chunks" : ""));
      }
    }
    const HostProblem base = make_problem(spec_of(4000, 2, K), fresh_seed());
    const HostProblem p = with_general_inputs(
        base, with_strong_decays(base, safe_gate_log_decays(base), -60.0, 5, true), DType::kBF16, false, DType::kBF16);
    for (const int outputs : {1, 2}) {
      sm90::LaunchOverride plan;
      plan.seg_chunks = 40;
      plan.outputs = outputs;
      sm90::set_launch_override(plan);
      expect_at_bars(p, run_cuda(p), "K " + std::to_string(K) + ", segments, outputs " + std::to_string(outputs));
      sm90::set_launch_override({});
    }
  }
}

// Rows of q and k whose fp32 squares overflow (huge_rows.h) in chunks past 2^-116:
// the exact path forms its sums from the normalised rows, as the common path does.
TEST_F(GpuGateForms, HugeRowsInStrongDecays) {
  for (const int64_t K : {128, 64}) {
    HostProblem base = make_problem(spec_of(300, 2, K), fresh_seed());
    // Rows are (token, head) pairs: q in head 0, k in head 1, in chunks 0, 1 and 18.
    make_rows_huge(base.q, K, 3 * 2, 17 * 2, 290 * 2);
    make_rows_huge(base.k, K, 4 * 2 + 1, 16 * 2 + 1, 291 * 2 + 1);
    const HostProblem p = with_general_inputs(
        base, with_strong_decays(base, safe_gate_log_decays(base), -60.0, 3, true), DType::kFP32, true, DType::kFP32);
    expect_at_bars(p, run_cuda(p), "huge rows, K " + std::to_string(K));
  }
}

// The general inputs' kernel on the default inputs' values (the raw gate and the
// logit widened to fp32, exactly): bitwise the default kernel's result. So its
// common path is the default's code, and a chunk within 2^-116 does not take the
// exact path (whose fp32 pairwise sums round differently). Also the safe gate on
// fp32 g against the oracle.
TEST_F(GpuGateForms, Fp32RawGateAndLogitAreTheDefaultKernelsBits) {
  for (const int64_t K : {128, 64}) {
    for (const ProblemSpec& spec : {spec_of(1000, 4, K), spec_of(0, 2, K, {0, 17, 700, 33}, 6)}) {
      const HostProblem base = make_problem(spec, fresh_seed());
      HostProblem p = base;
      p.g_dtype = DType::kFP32;
      p.beta_dtype = DType::kFP32;
      for (uint16_t x : base.g) p.g_f32.push_back(bf16_to_float(x));
      for (uint16_t x : base.beta) p.beta_f32.push_back(bf16_to_float(x));
      const RunResult general = run_cuda(p), plain = run_cuda(base);
      ASSERT_TRUE(general.status.ok() && plain.status.ok());
      EXPECT_EQ(general.out_bits, plain.out_bits) << "K " << K << ", N " << p.N;
      EXPECT_EQ(general.state_bytes, plain.state_bytes) << "K " << K << ", N " << p.N;
      expect_at_bars(p, general, "fp32 raw gate and logit, K " + std::to_string(K) + ", N " + std::to_string(p.N));
    }
  }
}

// The general inputs in a CUDA graph (replayed on a reused workspace) and in the
// two calls of a split forward (summaries, then resume).
TEST_F(GpuGateForms, GraphReplaysAndSplitCalls) {
  const HostProblem base = make_problem(spec_of(0, 2, 128, {300, 0, 1000, 17}), fresh_seed());
  const HostProblem p = with_general_inputs(
      base, with_strong_decays(base, safe_gate_log_decays(base), -60.0, 9, false), DType::kFP32, true, DType::kFP32);
  expect_at_bars(p, run_cuda(p, nullptr, /*graph_replays=*/2), "graph replays");
  SplitSummaries split;
  expect_at_bars(p, run_cuda(p, nullptr, 0, &split), "split calls");
}

// A log decay above 0 is not a decay: kCuda reads it as 0 and records it, and
// check_device_faults names g.
TEST_F(GpuGateForms, LogDecayAboveZeroIsReadAsZeroAndReported) {
  ASSERT_TRUE(check_device_faults(nullptr).ok());  // a clean record to start from
  const HostProblem base = make_problem(spec_of(200, 2, 128), fresh_seed());
  std::vector<double> a = safe_gate_log_decays(base);
  std::vector<double> clamped = a;
  for (const size_t i : {size_t{5}, size_t{40 * 2 * 128 + 77}, a.size() - 1}) {
    a[i] = 0.75;
    clamped[i] = 0.0;
  }
  const HostProblem p = with_general_inputs(base, a, DType::kFP32, false, DType::kBF16);
  const HostProblem ref = with_general_inputs(base, clamped, DType::kFP32, false, DType::kBF16);
  const RunResult gpu = run_cuda(p);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
  const Status faults = check_device_faults(nullptr);
  EXPECT_EQ(faults.code, StatusCode::kInvalidArgument);
  EXPECT_NE(faults.message.find("g (forward, gate_form kLogDecay)"), std::string::npos) << faults.message;
  EXPECT_NE(faults.message.find("from token 0"), std::string::npos) << faults.message;
  expect_at_bars(p, gpu, "above zero, against 0", &ref);
}

// ---- decode ----------------------------------------------------------------

struct DecodeRun {
  std::vector<uint16_t> out;
  std::vector<uint8_t> pool;
};

// How run_general_decode hands p's gate and beta over.
struct GeneralDecodeForm {
  // true: g as the safe gate's log decays with key channels 3, 14, 25, ... at
  // `strong`, beta as b; false: p's raw gate and logits themselves, widened to
  // g_dtype and beta_dtype (the safe gate, A_log and dt_bias read).
  bool log_decay = true;
  double strong = -60.0;
  int variant = -1;  // kCuda: a decode kernel forced (sm90::set_decode_variant_override), -1 the production choice
};

// One decode step of p with the general inputs (g and beta in fp32 or bf16, as
// `form` says), on kCuda or the float64 CPU backend (the same numbers for both);
// out poisoned first.
DecodeRun run_general_decode(const DecodeProblem& p, Backend backend, DType g_dtype, DType beta_dtype,
                             GeneralDecodeForm form) {
  const int64_t HV = p.HV, K = p.K;
  std::vector<float> a(p.g.size()), b(p.beta.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t hv = static_cast<int64_t>(i / K) % HV, d = static_cast<int64_t>(i % K);
    const double x = std::exp(double(p.A_log[hv])) * (double(bf16_to_float(p.g[i])) + double(p.dt_bias[hv * K + d]));
    a[i] = !form.log_decay ? bf16_to_float(p.g[i])
           : d % 11 == 3   ? static_cast<float>(form.strong)
                           : static_cast<float>(-5.0 / (1.0 + std::exp(-x)));
  }
  for (size_t i = 0; i < b.size(); ++i) {
    const double logit = bf16_to_float(p.beta[i]);
    b[i] = form.log_decay ? static_cast<float>(1.0 / (1.0 + std::exp(-logit))) : static_cast<float>(logit);
  }
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = float_to_bf16(b[i]);
  DecodeRun r;
  std::vector<uint8_t> pool = p.pool_bytes();
  std::vector<uint16_t> out(static_cast<size_t>(p.T * HV * p.V), 0xFFFF);
  auto fill = [&](DecodeArgs& args, const void* g, const void* beta) {
    args.gate_form = form.log_decay ? GateForm::kLogDecay : GateForm::kSafeGate;
    args.g_dtype = g_dtype;
    args.g = g;
    args.beta_is_probability = form.log_decay;
    args.beta_dtype = beta_dtype;
    args.beta = beta;
    if (form.log_decay) {
      args.A_log = nullptr;
      args.dt_bias = nullptr;
    }
  };
  const void* g_host = g_dtype == DType::kFP32 ? static_cast<const void*>(a.data()) : a16.data();
  const void* b_host = beta_dtype == DType::kFP32 ? static_cast<const void*>(b.data()) : b16.data();
  if (backend != Backend::kCuda) {
    DecodeArgs args = p.args(out.data(), pool.data(), nullptr);
    fill(args, g_host, b_host);
    const Status s = decode(args, backend, nullptr);
    EXPECT_TRUE(s.ok()) << s.message;
    r.out = out;
    r.pool = pool;
    return r;
  }
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), a16_d(a16), b16_d(b16), out_d(out);
  DeviceBuffer<float> a_d(a), b_d(b);
  DeviceBuffer<int64_t> cu(p.cu_seqlens), idx64(p.idx64);
  DeviceBuffer<int32_t> idx32(p.idx32);
  DeviceBuffer<uint8_t> pool_d(pool);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DecodeArgs args = p.args(out_d.ptr, pool_d.ptr, nullptr);
  args.q = q.ptr;
  args.k = k.ptr;
  args.v = v.ptr;
  args.A_log = A_log.ptr;
  args.dt_bias = dt_bias.ptr;
  fill(args, g_dtype == DType::kFP32 ? static_cast<const void*>(a_d.ptr) : a16_d.ptr,
       beta_dtype == DType::kFP32 ? static_cast<const void*>(b_d.ptr) : b16_d.ptr);
  args.state_indices = p.spec.int64_indices ? static_cast<const void*>(idx64.ptr) : idx32.ptr;
  if (!p.cu_seqlens.empty()) args.cu_seqlens = cu.ptr;
  sm90::set_decode_variant_override(form.variant);
  const Status s = decode(args, Backend::kCuda, nullptr);
  sm90::set_decode_variant_override(-1);
  EXPECT_TRUE(s.ok()) << s.message;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  r.out = out_d.to_host();
  r.pool = pool_d.to_host();
  return r;
}

// p's decode step with the general inputs on kCuda against the float64 CPU backend.
void expect_decode_matches(const DecodeProblem& p, const std::string& what, DType g_dtype, DType beta_dtype,
                           const GeneralDecodeForm& form) {
  const DecodeRun gpu = run_general_decode(p, Backend::kCuda, g_dtype, beta_dtype, form);
  const DecodeRun cpu = run_general_decode(p, Backend::kCpuReference, g_dtype, beta_dtype, form);
  const DType state = p.spec.state_dtype;
  const std::vector<float> gp = state_bytes_to_float(gpu.pool, state), cp = state_bytes_to_float(cpu.pool, state);
  // The padding entry's tokens (sequence 0) are read by neither backend: their out
  // rows keep the poison on both sides; every other row must be written.
  const int64_t padding_tokens =
      p.spec.padding_entries == 0 ? 0 : p.spec.seq_tokens.empty() ? p.spec.tokens_per_seq : p.spec.seq_tokens[0];
  const size_t padding_rows = static_cast<size_t>(padding_tokens * p.HV * p.V);
  ASSERT_EQ(gpu.out.size(), cpu.out.size());
  std::vector<float> go, co;
  size_t untouched = 0;
  for (size_t i = 0; i < gpu.out.size(); ++i) {
    if (i < padding_rows) {
      untouched += gpu.out[i] == 0xFFFF && cpu.out[i] == 0xFFFF;
      continue;
    }
    go.push_back(bf16_to_float(gpu.out[i]));
    co.push_back(bf16_to_float(cpu.out[i]));
  }
  EXPECT_EQ(untouched, padding_rows) << what << ": the padding entry's out rows were written";
  const double e_out = rel_rms(go, co), e_pool = rel_rms(gp, cp);
  std::printf("[ errors ] %s: out %.3e  pool %.3e\n", what.c_str(), e_out, e_pool);
  // out is bf16 on both sides (one rounding apart at most); the pool as the
  // decode tests judge it.
  EXPECT_LE(e_out, 2e-3) << what;
  EXPECT_LE(e_pool, state == DType::kFP32 ? 1e-5 : 2e-3) << what;
  const Status faults = check_device_faults(nullptr);
  EXPECT_TRUE(faults.ok()) << what << ": " << faults.message;
}

TEST_F(GpuGateForms, DecodeMatchesTheFloat64Steps) {
  for (const int64_t K : {128, 64}) {
    for (const DType state : {DType::kFP32, DType::kBF16}) {
      for (const DType g_dtype : {DType::kFP32, DType::kBF16}) {
        DecodeSpec spec;
        spec.num_seqs = 0;
        spec.seq_tokens = {1, 3, 0, 2, 1};
        spec.heads = 2;
        spec.v_heads = 4;
        spec.head_dim = K;
        spec.state_dtype = state;
        spec.padding_entries = 1;
        const DecodeProblem p = make_decode_problem(spec, fresh_seed());
        const std::string what = "decode K " + std::to_string(K) + ", state " + to_string(state) + ", g " +
                                 to_string(g_dtype);
        expect_decode_matches(p, what, g_dtype, g_dtype, GeneralDecodeForm{});
      }
    }
  }
}

// Every decode kernel's general-inputs twin (sm90_decode.cu: the latency kernel's
// strided build, and the bandwidth kernels' kGeneral builds on dense tensors),
// forced in turn, and the production choice at a size where it picks a bandwidth
// kernel (72 sequences x 32 value heads: packed's slot for bf16 pools, whose general
// twin is fuse-ef-occ's, and rows2 for fp32):
// both gate forms, g and beta in fp32 and bf16, one token a sequence and several.
TEST_F(GpuGateForms, EveryDecodeKernelTakesTheGeneralInputs) {
  for (int variant = -1; variant < sm90::decode_variant_count(); ++variant) {
    for (const DType state : {DType::kFP32, DType::kBF16}) {
      for (const bool one_token : {true, false}) {
        DecodeSpec spec;
        if (one_token) {
          spec.num_seqs = variant < 0 ? 72 : 9;
          spec.tokens_per_seq = 1;
          spec.padding_entries = 1;
        } else {
          spec.num_seqs = 0;
          spec.seq_tokens = {1, 3, 0, 2, 1};
          spec.padding_entries = 1;
        }
        spec.heads = 8;
        spec.v_heads = 32;
        spec.state_dtype = state;
        const DecodeProblem p = make_decode_problem(spec, fresh_seed());
        for (const bool log_decay : {true, false}) {
          const DType g_dtype = log_decay ? DType::kFP32 : DType::kBF16;
          const DType beta_dtype = log_decay ? DType::kBF16 : DType::kFP32;
          GeneralDecodeForm form;
          form.log_decay = log_decay;
          form.variant = variant;
          const std::string what =
              std::string("decode ") + (variant < 0 ? "production" : sm90::decode_variant_name(variant)) +
              ", state " + to_string(state) + (one_token ? ", one token a sequence" : ", varlen") +
              (log_decay ? ", log decay fp32, b bf16" : ", raw gate bf16, logit fp32");
          expect_decode_matches(p, what, g_dtype, beta_dtype, form);
        }
      }
    }
  }
}

TEST_F(GpuGateForms, DecodeLogDecayAboveZeroIsReported) {
  ASSERT_TRUE(check_device_faults(nullptr).ok());
  DecodeSpec spec;
  spec.num_seqs = 3;
  spec.tokens_per_seq = 2;
  const DecodeProblem p = make_decode_problem(spec, fresh_seed());
  GeneralDecodeForm form;
  form.strong = 0.5;
  run_general_decode(p, Backend::kCuda, DType::kFP32, DType::kFP32, form);
  const Status faults = check_device_faults(nullptr);
  EXPECT_EQ(faults.code, StatusCode::kInvalidArgument);
  EXPECT_NE(faults.message.find("g (decode, gate_form kLogDecay)"), std::string::npos) << faults.message;
  // The bandwidth kernels' twins record it too (one token a sequence, many pairs).
  for (const int variant : {1, 2, 3}) {
    ASSERT_TRUE(check_device_faults(nullptr).ok());
    DecodeSpec wide;
    wide.num_seqs = 9;
    wide.v_heads = 32;
    wide.heads = 8;
    wide.state_dtype = variant == 3 ? DType::kBF16 : DType::kFP32;
    const DecodeProblem q = make_decode_problem(wide, fresh_seed());
    form.variant = variant;
    run_general_decode(q, Backend::kCuda, DType::kFP32, DType::kFP32, form);
    const Status f = check_device_faults(nullptr);
    EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << sm90::decode_variant_name(variant);
    EXPECT_NE(f.message.find("g (decode, gate_form kLogDecay)"), std::string::npos) << f.message;
  }
}

#endif  // FLASHKDA_WITH_CUDA

TEST(GpuGateFormsBuild, SkippedWithoutCudaBuild) {
#ifdef FLASHKDA_WITH_CUDA
  GTEST_SKIP() << "CUDA build: the gate-form tests run above";
#else
  GTEST_SKIP() << "no GPU run: built without the CUDA backend (FLASHKDA_WITH_CUDA off)";
#endif
}

}  // namespace
}  // namespace flashkda::testing
