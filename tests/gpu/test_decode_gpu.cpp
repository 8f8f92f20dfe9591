// GPU decode vs the CPU decode (the float64 token recurrence) — label "gpu".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashkda/flashkda.h"

#ifdef FLASHKDA_WITH_CUDA
#include "sm90/sm90_decode.h"
#include "tests/common/decode_problem.h"
#include "tests/common/degenerate_problem.h"
#include "tests/gpu/gpu_harness.h"
#endif

namespace flashkda::testing {
namespace {

#ifdef FLASHKDA_WITH_CUDA

struct DecodeResult {
  Status status;
  std::vector<uint16_t> out;
  std::vector<uint8_t> pool;
  std::vector<uint8_t> per_token;
};

size_t state_elem_bytes(const DecodeProblem& p) { return p.spec.state_dtype == DType::kFP32 ? 4 : 2; }

// Which decode kernel runs (sm90::decode_variant_name) and whether it is launched
// with programmatic dependent launch. Every GPU decode test runs for each.
struct KernelChoice {
  int variant;
  bool pdl;
};

std::vector<KernelChoice> all_kernel_choices() {
  std::vector<KernelChoice> c;
  for (int v = 0; v < sm90::decode_variant_count(); ++v)
    for (bool pdl : {false, true}) c.push_back({v, pdl});
  return c;
}

std::string kernel_choice_name(const KernelChoice& c) {
  std::string n = sm90::decode_variant_name(c.variant);
  for (char& ch : n)
    if (ch == '-') ch = '_';  // test names are [A-Za-z0-9_]
  return n + (c.pdl ? "_pdl" : "");
}

void PrintTo(const KernelChoice& c, std::ostream* os) { *os << kernel_choice_name(c); }

// Forces a kernel variant for the scope of one run.
class VariantScope {
 public:
  explicit VariantScope(int variant) { sm90::set_decode_variant_override(variant); }
  ~VariantScope() { sm90::set_decode_variant_override(-1); }
  VariantScope(const VariantScope&) = delete;
  VariantScope& operator=(const VariantScope&) = delete;
};

// Runs `steps` decode steps back to back on one stream (each reads the pool the
// previous one wrote: with PDL this checks that a kernel waits for its
// predecessor); out and per-token states poisoned with NaN first. With `graph`,
// the steps are captured into a CUDA graph and the graph replayed once; with
// `legacy_stream` (not with `graph`) they run on the legacy default stream.
// `int32_cu`: the boundaries as int32 (cu_seqlens_int32, vLLM's offsets).
DecodeResult run_decode_cuda(const DecodeProblem& p, KernelChoice choice, bool graph = false, int steps = 1,
                             bool legacy_stream = false, bool int32_cu = false) {
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> cu(p.cu_seqlens), idx64(p.idx64);
  DeviceBuffer<int32_t> cu32(std::vector<int32_t>(p.cu_seqlens.begin(), p.cu_seqlens.end()));
  DeviceBuffer<int32_t> idx32(p.idx32);
  DeviceBuffer<uint8_t> pool(p.pool_bytes());
  DeviceBuffer<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
  const size_t pt_bytes = p.spec.per_token_states ? static_cast<size_t>(p.T * p.per_slot) * state_elem_bytes(p) : 0;
  DeviceBuffer<uint8_t> per_token(pt_bytes);
  FKDA_CUDA_CHECK(cudaMemset(out.ptr, 0xFF, out.n * 2));
  if (pt_bytes) FKDA_CUDA_CHECK(cudaMemset(per_token.ptr, 0xFF, pt_bytes));

  DecodeArgs a = p.args(out.ptr, pool.ptr, pt_bytes ? per_token.ptr : nullptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr; a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
  a.state_indices = p.spec.int64_indices ? static_cast<const void*>(idx64.ptr) : idx32.ptr;
  if (!p.cu_seqlens.empty()) a.cu_seqlens = cu.ptr;
  if (int32_cu) {
    a.cu_seqlens = nullptr;
    a.cu_seqlens_int32 = cu32.ptr;
  }
  // Explicit on / off, never kAuto: each test pins the launch it is named after.
  a.programmatic_dependent_launch = choice.pdl ? PdlMode::kOn : PdlMode::kOff;
  const VariantScope scope(choice.variant);
  DecodeResult r;
  cudaStream_t s = nullptr;
  if (!legacy_stream) FKDA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads above ran on the legacy stream
  if (graph) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    FKDA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < steps && (i == 0 || r.status.ok()); ++i) r.status = decode(a, Backend::kCuda, s);
    FKDA_CUDA_CHECK(cudaStreamEndCapture(s, &gr));
    if (r.status.ok()) {
      FKDA_CUDA_CHECK(cudaGraphInstantiate(&ge, gr, 0));
      FKDA_CUDA_CHECK(cudaGraphLaunch(ge, s));
      FKDA_CUDA_CHECK(cudaStreamSynchronize(s));
      FKDA_CUDA_CHECK(cudaGraphExecDestroy(ge));
    }
    FKDA_CUDA_CHECK(cudaGraphDestroy(gr));
  } else {
    for (int i = 0; i < steps && (i == 0 || r.status.ok()); ++i) r.status = decode(a, Backend::kCuda, s);
  }
  FKDA_CUDA_CHECK(cudaStreamSynchronize(s));
  if (s != nullptr) FKDA_CUDA_CHECK(cudaStreamDestroy(s));
  if (!r.status.ok()) return r;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  r.out = out.to_host();
  r.pool = pool.to_host();
  r.per_token = per_token.to_host();
  return r;
}

// `steps` float64 decode steps on the host pool. The last problem's result is
// kept: the parameterised tests run every kernel choice of one problem in a row.
const DecodeResult& run_decode_cpu(const DecodeProblem& p, const std::string& key, int steps = 1) {
  static std::string cached_key;
  static DecodeResult cached;
  const std::string full_key = key + "/steps=" + std::to_string(steps);
  if (full_key == cached_key) return cached;
  DecodeResult r;
  r.out.assign(static_cast<size_t>(p.T * p.HV * p.V), 0xFFFF);
  r.pool = p.pool_bytes();
  r.per_token.assign(p.spec.per_token_states ? static_cast<size_t>(p.T * p.per_slot) * state_elem_bytes(p) : 0, 0xFF);
  for (int i = 0; i < steps && (i == 0 || r.status.ok()); ++i)
    r.status = decode(p.args(r.out.data(), r.pool.data(), r.per_token.empty() ? nullptr : r.per_token.data()),
                      Backend::kCpuReference, nullptr);
  cached_key = full_key;
  cached = std::move(r);
  return cached;
}

// GPU vs CPU: the state (fp32 pool) to `state_bar`; out is bf16 on both sides, so
// it is held to one bf16 ulp element-wise and its relative RMS is reported.
void compare(const DecodeProblem& p, const DecodeResult& gpu, const DecodeResult& cpu, double state_bar,
             const char* label) {
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
  ASSERT_TRUE(cpu.status.ok()) << cpu.status.message;
  const auto gs = state_bytes_to_float(gpu.pool, p.spec.state_dtype), cs = state_bytes_to_float(cpu.pool, p.spec.state_dtype);
  const double es = rel_rms(gs.data(), cs.data(), cs.size());
  size_t beyond_ulp = 0, differ = 0, written_mismatch = 0;
  std::vector<float> go, co;
  for (size_t i = 0; i < cpu.out.size(); ++i) {
    if ((cpu.out[i] == 0xFFFF) != (gpu.out[i] == 0xFFFF)) ++written_mismatch;  // padding rows stay poisoned
    if (cpu.out[i] == 0xFFFF) continue;
    const float a = bf16_to_float(gpu.out[i]), b = bf16_to_float(cpu.out[i]);
    go.push_back(a);
    co.push_back(b);
    if (gpu.out[i] != cpu.out[i]) ++differ;
    if (!(std::abs(a - b) <= std::abs(b) / 128 + 1e-6f)) ++beyond_ulp;
  }
  const double eo = co.empty() ? 0 : rel_rms(go.data(), co.data(), co.size());
  double et = 0;
  if (!cpu.per_token.empty()) {
    // Tokens of padding entries keep the poison (NaN) on both sides; compare the rest.
    const auto gt = state_bytes_to_float(gpu.per_token, p.spec.state_dtype), ct = state_bytes_to_float(cpu.per_token, p.spec.state_dtype);
    std::vector<float> gw, cw;
    size_t poison_mismatch = 0;
    for (size_t i = 0; i < ct.size(); ++i) {
      if (std::isnan(ct[i])) {
        if (!std::isnan(gt[i])) ++poison_mismatch;
        continue;
      }
      gw.push_back(gt[i]);
      cw.push_back(ct[i]);
    }
    et = cw.empty() ? 0 : rel_rms(gw.data(), cw.data(), cw.size());
    EXPECT_LE(et, state_bar) << label << ": per-token states";
    EXPECT_EQ(poison_mismatch, 0u) << label << ": per-token states of padding entries written";
  }
  std::printf("[ errors ] decode %-34s state %.2e  out %.2e (%zu/%zu bf16 differ)  per-token %.2e\n", label, es, eo,
              differ, co.size(), et);
  EXPECT_LE(es, state_bar) << label;
  EXPECT_EQ(beyond_ulp, 0u) << label << ": outputs more than one bf16 ulp apart";
  EXPECT_EQ(written_mismatch, 0u) << label << ": padding outputs written, or real ones not";
  // Slots no real sequence uses are bitwise untouched (the CPU decode leaves them so).
  EXPECT_EQ(gpu.pool.size(), cpu.pool.size());
  const size_t slot_bytes = static_cast<size_t>(p.per_slot) * state_elem_bytes(p);
  std::vector<bool> used(static_cast<size_t>(p.pool_size), false);
  for (int64_t n = 0; n < p.N; ++n)
    if (p.index(n) >= 0) used[static_cast<size_t>(p.index(n))] = true;
  const std::vector<uint8_t> initial = p.pool_bytes();
  for (int64_t s = 0; s < p.pool_size; ++s)
    if (!used[static_cast<size_t>(s)])
      EXPECT_EQ(0, std::memcmp(gpu.pool.data() + s * slot_bytes, initial.data() + s * slot_bytes, slot_bytes))
          << label << ": unused slot " << s << " written";
}

void skip_without_gpu() {
  std::string why;
  if (!cuda_backend_available(&why)) GTEST_SKIP() << "no GPU run: " << why;
}

struct Case {
  int64_t N, H, tokens;
  DType dtype;
  int64_t head_dim = 128;  // K = V (64: the latency kernel whatever the variant)
};

std::string case_name(const Case& c) {
  return "N" + std::to_string(c.N) + "_H" + std::to_string(c.H) + "_t" + std::to_string(c.tokens) + "_" +
         (c.dtype == DType::kFP32 ? "fp32" : "bf16") + (c.head_dim == 128 ? "" : "_K" + std::to_string(c.head_dim));
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class GpuDecodeCases : public ::testing::TestWithParam<std::tuple<Case, KernelChoice>> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(GpuDecodeCases, MatchesFloat64Recurrence) {
  const Case c = std::get<0>(GetParam());
  const KernelChoice kc = std::get<1>(GetParam());
  DecodeSpec spec;
  spec.num_seqs = c.N;
  spec.tokens_per_seq = c.tokens;
  spec.heads = c.H;
  spec.state_dtype = c.dtype;
  spec.head_dim = c.head_dim;
  spec.padding_entries = c.N > 2 ? 2 : 0;
  spec.int64_indices = c.N % 2 == 0;
  spec.per_token_states = c.tokens > 1;
  // One problem per case, shared by the kernel choices that follow it (the last
  // parameter varies fastest): generating a 0.5 GB pool took most of each test's
  // time at N = 256, H = 32 (as run_decode_cpu caches the reference).
  static std::string cached_case;
  static DecodeProblem cached_problem;
  if (cached_case != case_name(c)) {
    cached_problem = make_decode_problem(spec, 100 + c.N + c.H + c.tokens);
    cached_case = case_name(c);
  }
  const DecodeProblem& p = cached_problem;
  char label[128];
  std::snprintf(label, sizeof label, "N=%lld H=%lld t=%lld K=%lld %s %s", static_cast<long long>(c.N),
                static_cast<long long>(c.H), static_cast<long long>(c.tokens), static_cast<long long>(c.head_dim),
                to_string(c.dtype), kernel_choice_name(kc).c_str());
  // fp32 pool: the spec's 1e-5 (both sides run the recurrence at >= fp32).
  // bf16 pool: both round the new state to bf16; a few elements straddle a
  // rounding boundary and differ by one bf16 ulp, ~1e-3 relative RMS at most.
  compare(p, run_decode_cuda(p, kc), run_decode_cpu(p, case_name(c)), c.dtype == DType::kFP32 ? 1e-5 : 2e-3, label);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuDecodeCases,
    ::testing::Combine(::testing::Values(Case{1, 32, 1, DType::kFP32}, Case{7, 1, 1, DType::kFP32},
                                         Case{7, 64, 1, DType::kFP32}, Case{256, 32, 1, DType::kFP32},
                                         Case{1024, 1, 1, DType::kFP32}, Case{256, 32, 1, DType::kBF16},
                                         Case{5, 4, 4, DType::kFP32}, Case{5, 4, 3, DType::kBF16},
                                         Case{1, 32, 1, DType::kFP32, 64}, Case{256, 32, 1, DType::kBF16, 64},
                                         Case{300, 8, 1, DType::kFP32, 64}, Case{5, 4, 4, DType::kFP32, 64},
                                         Case{5, 4, 3, DType::kBF16, 64},
                                         // K = 64 from 128 (sequence, head) pairs: the two-row build,
                                         // with several tokens a sequence.
                                         Case{40, 4, 3, DType::kFP32, 64}, Case{33, 4, 2, DType::kBF16, 64}),
                       ::testing::ValuesIn(all_kernel_choices())),
    [](const ::testing::TestParamInfo<std::tuple<Case, KernelChoice>>& info) {
      return case_name(std::get<0>(info.param)) + "_" + kernel_choice_name(std::get<1>(info.param));
    });

class GpuDecodeKernels : public ::testing::TestWithParam<KernelChoice> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(GpuDecodeKernels, VariableTokensPerSequence) {
  DecodeSpec spec;
  spec.seq_tokens = {1, 4, 2, 1, 3};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.padding_entries = 1;
  spec.per_token_states = true;
  const DecodeProblem p = make_decode_problem(spec, 7);
  const std::string label = "varlen tokens, GVA " + kernel_choice_name(GetParam());
  compare(p, run_decode_cuda(p, GetParam()), run_decode_cpu(p, "varlen"), 1e-5, label.c_str());
}

// int32 boundaries (vLLM's offsets) read on the device: bitwise the int64 run.
TEST_P(GpuDecodeKernels, Int32CuSeqlensEqualInt64) {
  DecodeSpec spec;
  spec.seq_tokens = {1, 4, 2, 1, 3};
  spec.heads = 2;
  spec.padding_entries = 1;
  spec.per_token_states = true;
  const DecodeProblem p = make_decode_problem(spec, 17);
  const DecodeResult wide = run_decode_cuda(p, GetParam());
  const DecodeResult narrow = run_decode_cuda(p, GetParam(), false, 1, false, /*int32_cu=*/true);
  ASSERT_TRUE(wide.status.ok()) << wide.status.message;
  ASSERT_TRUE(narrow.status.ok()) << narrow.status.message;
  EXPECT_EQ(wide.out, narrow.out);
  EXPECT_EQ(wide.pool, narrow.pool);
  EXPECT_EQ(wide.per_token, narrow.per_token);
}

// Sequences without tokens among others (device cu_seqlens, no host copy of the
// lengths): the CPU decode's result, and their slots bitwise as they were.
TEST_P(GpuDecodeKernels, SequencesWithoutTokensKeepTheirState) {
  for (const DType dtype : {DType::kFP32, DType::kBF16}) {
    DecodeSpec spec;
    spec.seq_tokens = {2, 0, 3, 0, 1, 0};
    spec.heads = 2;
    spec.v_heads = 4;
    spec.padding_entries = 1;
    spec.per_token_states = true;
    spec.state_dtype = dtype;
    const DecodeProblem p = make_decode_problem(spec, 27);
    const std::string label = std::string("zero tokens ") + to_string(dtype) + " " + kernel_choice_name(GetParam());
    const DecodeResult gpu = run_decode_cuda(p, GetParam());
    compare(p, gpu, run_decode_cpu(p, std::string("zero tokens ") + to_string(dtype)),
            dtype == DType::kFP32 ? 1e-5 : 2e-3, label.c_str());
    const std::vector<uint8_t> initial = p.pool_bytes();
    const size_t slot_bytes = static_cast<size_t>(p.per_slot) * state_elem_bytes(p);
    for (int64_t n = 0; n < p.N; ++n)
      if (p.index(n) >= 0 && p.cu_seqlens[n] == p.cu_seqlens[n + 1])
        EXPECT_EQ(0, std::memcmp(gpu.pool.data() + p.index(n) * slot_bytes, initial.data() + p.index(n) * slot_bytes,
                                 slot_bytes))
            << label << ": sequence " << n << " has no tokens, but its slot changed";
  }
}

// exp(A_log) past fp32's range (A_log = 100, inf) where g + dt_bias is 0: the
// gate is sigmoid(0), as with any finite scale (common/gate.h), not NaN. With
// g = dt_bias = 0 everywhere the call is bitwise the call with A_log = 0, and it
// matches the float64 decode. K = 128 and 64 (the latency kernel).
TEST_P(GpuDecodeKernels, OverflowingExpALogAtAZeroGateArgument) {
  for (const int64_t head_dim : {128, 64}) {
    DecodeSpec spec;
    spec.seq_tokens = {1, 3, 2};
    spec.heads = 2;
    spec.head_dim = head_dim;
    spec.padding_entries = 1;
    DecodeProblem p = make_decode_problem(spec, 37);
    std::fill(p.g.begin(), p.g.end(), uint16_t{0});
    std::fill(p.dt_bias.begin(), p.dt_bias.end(), 0.f);
    std::fill(p.A_log.begin(), p.A_log.end(), 0.f);
    const DecodeResult plain = run_decode_cuda(p, GetParam());
    ASSERT_TRUE(plain.status.ok()) << plain.status.message;
    for (const float a_log : {100.f, std::numeric_limits<float>::infinity()}) {
      std::fill(p.A_log.begin(), p.A_log.end(), a_log);
      const std::string label = "A_log " + std::to_string(a_log) + ", K " + std::to_string(head_dim) + " " +
                                kernel_choice_name(GetParam());
      const DecodeResult big = run_decode_cuda(p, GetParam());
      compare(p, big, run_decode_cpu(p, label), 1e-5, label.c_str());
      EXPECT_EQ(big.out, plain.out) << label;
      EXPECT_EQ(big.pool, plain.pool) << label;
    }
  }
}

TEST_P(GpuDecodeKernels, CudaGraphReplayEqualsDirectCall) {
  DecodeSpec spec;
  spec.num_seqs = 9;
  spec.heads = 8;
  spec.padding_entries = 2;
  const DecodeProblem p = make_decode_problem(spec, 8);
  const DecodeResult direct = run_decode_cuda(p, GetParam()), graph = run_decode_cuda(p, GetParam(), /*graph=*/true);
  ASSERT_TRUE(direct.status.ok()) << direct.status.message;
  ASSERT_TRUE(graph.status.ok()) << graph.status.message;
  EXPECT_EQ(direct.out, graph.out);
  EXPECT_EQ(direct.pool, graph.pool);
}

// Three steps back to back, each reading the pool the previous one wrote and
// writing what it read: with PDL, a kernel that touched memory before its
// predecessor finished would read a stale state or clobber one still being read.
// Directly on a stream, as one CUDA graph (programmatic edges), and on stream 0.
TEST_P(GpuDecodeKernels, ChainedStepsMatchFloat64Steps) {
  DecodeSpec spec;
  spec.num_seqs = 6;
  spec.heads = 32;
  spec.padding_entries = 1;
  const DecodeProblem p = make_decode_problem(spec, 11);
  const DecodeResult& cpu = run_decode_cpu(p, "chained", 3);
  const std::string label = "3 chained steps " + kernel_choice_name(GetParam());
  compare(p, run_decode_cuda(p, GetParam(), /*graph=*/false, 3), cpu, 1e-5, label.c_str());
  compare(p, run_decode_cuda(p, GetParam(), /*graph=*/true, 3), cpu, 1e-5, (label + " graph").c_str());
  // The legacy default stream (what stream 0 means to a caller, e.g. torch's default).
  compare(p, run_decode_cuda(p, GetParam(), /*graph=*/false, 3, /*legacy_stream=*/true), cpu, 1e-5,
          (label + " stream 0").c_str());
}

// The degenerate-key class (tests/common/degenerate_problem.h) through decode:
// several tokens per sequence with (nearly) collinear or anti-aligned keys, b → 1,
// slow decay, against the float64 CPU decode. The decode runs the token
// recurrence in fp32, with no inverse, so the fp32 bar holds here too.
TEST_P(GpuDecodeKernels, DegenerateKeys) {
  const DegenerateCase cases[] = {{KeyPattern::kCollinear, 0.0, 8.f, true},
                                  {KeyPattern::kCollinear, 1e-2, 0.f, true},
                                  {KeyPattern::kAntiAligned, 0.0, 8.f, true},
                                  {KeyPattern::kServingRepeat, 0.0, 8.f, true}};
  for (const DegenerateCase& c : cases) {
    DecodeSpec spec;
    spec.seq_tokens = {1, 37, 5, 16};
    spec.heads = 2;
    spec.per_token_states = true;
    DecodeProblem p = make_decode_problem(spec, 12);
    make_inputs_degenerate(p, p.T, c, 12);
    const std::string label = c.label() + " " + kernel_choice_name(GetParam());
    compare(p, run_decode_cuda(p, GetParam()), run_decode_cpu(p, "degenerate " + c.label()), 1e-5, label.c_str());
  }
}

// Device-resident decode arguments past their tensors: state_indices past the
// pool and cu_seqlens past T. The pool, out and the per-token states sit inside
// sentinel-filled buffers; the kernels must leave every sentinel byte alone, and
// check_device_faults() must name the argument and the first bad sequence.
struct DecodeGuardCase {
  const char* name;
  int variant;  // forced kernel variant
  bool bad_index;  // else: bad cu_seqlens
  bool int32_cu = false;  // the boundaries as cu_seqlens_int32
  int64_t head_dim = 128;
  int64_t heads = 2;
};

void run_decode_guard(const DecodeGuardCase& gc) {
  ASSERT_TRUE(check_device_faults(nullptr).ok()) << "a fault was recorded before this test";
  DecodeSpec spec;
  spec.seq_tokens = {2, 3, 1, 4};
  spec.heads = gc.heads;
  spec.head_dim = gc.head_dim;
  spec.per_token_states = true;
  DecodeProblem p = make_decode_problem(spec, 13);
  int64_t expect_first = 0;
  std::vector<int64_t> cu = p.cu_seqlens;
  if (gc.bad_index) {
    p.idx32[1] = static_cast<int32_t>(p.pool_size + 3);
    p.idx32[3] = 0x7fffffff;
    expect_first = 1;
  } else {
    cu[3] = p.T + 4096;  // sequence 2 ends past T, sequence 3 starts there
    expect_first = 2;
  }
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> dcu(cu);
  DeviceBuffer<int32_t> dcu32(std::vector<int32_t>(cu.begin(), cu.end()));
  DeviceBuffer<int32_t> idx(p.idx32);
  GuardedDeviceBuffer pool(p.pool_bytes());
  GuardedDeviceBuffer out(std::vector<uint8_t>(static_cast<size_t>(p.T * p.HV * p.V) * 2, 0xFF));
  GuardedDeviceBuffer per_token(std::vector<uint8_t>(static_cast<size_t>(p.T * p.per_slot) * state_elem_bytes(p), 0xFF));
  DecodeArgs a = p.args(out.data(), pool.data(), per_token.data());
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr; a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
  a.state_indices = idx.ptr;
  a.index_type = IndexType::kInt32;
  a.cu_seqlens = gc.int32_cu ? nullptr : dcu.ptr;
  a.cu_seqlens_int32 = gc.int32_cu ? dcu32.ptr : nullptr;
  a.cu_seqlens_host = nullptr;  // device values only: nothing checked on the host
  const VariantScope scope(gc.variant);
  const Status st = decode(a, Backend::kCuda, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(pool.damaged(), 0u) << gc.name << ": the pool's guard bands were written";
  EXPECT_EQ(out.damaged(), 0u) << gc.name << ": out's guard bands were written";
  EXPECT_EQ(per_token.damaged(), 0u) << gc.name << ": per_token_states' guard bands were written";
  const Status f = check_device_faults(nullptr);
  EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << f.message;
  const char* arg = gc.bad_index ? "state_indices (decode)" : "cu_seqlens (decode)";
  EXPECT_NE(f.message.find(arg), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("first at sequence " + std::to_string(expect_first) + "."), std::string::npos)
      << f.message;
  std::printf("[ guard ] decode %-28s guard bytes intact; check_device_faults: %s\n", gc.name, f.message.c_str());
  EXPECT_TRUE(check_device_faults(nullptr).ok()) << "the record is cleared by a check";
}

TEST(GpuDecodeGuardBand, EveryVariantBadIndicesAndCuSeqlens) {
  skip_without_gpu();
  if (IsSkipped()) return;
  for (int v = 0; v < sm90::decode_variant_count(); ++v) {
    for (bool bad_index : {true, false}) {
      const std::string name = std::string(sm90::decode_variant_name(v)) + (bad_index ? " state_indices" : " cu_seqlens");
      run_decode_guard({name.c_str(), v, bad_index});
    }
    const std::string name = std::string(sm90::decode_variant_name(v)) + " cu_seqlens_int32";
    run_decode_guard({name.c_str(), v, false, /*int32_cu=*/true});
  }
  // K = V = 64 (the latency kernel whatever the variant).
  run_decode_guard({"K=64 state_indices", 0, true, false, 64});
  run_decode_guard({"K=64 cu_seqlens", 0, false, false, 64});
  // And its two-row build (4 sequences x 64 heads = 256 pairs).
  run_decode_guard({"K=64 H=64 state_indices", 0, true, false, 64, 64});
  run_decode_guard({"K=64 H=64 cu_seqlens", 0, false, false, 64, 64});
}

// Speculative verify on pool slots (DecodeArgs::verify_slots, num_accepted_tokens)
// on the GPU: the same pool and out as the float64 CPU verify on the same inputs
// (pool to the decode state bars, out within one bf16 ulp), for both pool dtypes
// and index types. Row n of state_indices holds C = 4 slots; sequence 1 is a
// padding row (its start column is -1), sequence 2 skips its second token's
// write (-1), sequence 3 starts from its last column.
struct VerifyCase {
  std::vector<int64_t> idx, accepted;
  int64_t C;
};
VerifyCase verify_case() { return {{0, 1, 2, 3, -1, 4, 5, 6, 7, -1, 8, 9, 10, 11, 12, 13}, {2, 1, 1, 4}, 4}; }

DecodeResult run_verify(const DecodeProblem& p, const VerifyCase& vc, Backend backend) {
  const bool i64 = p.spec.int64_indices;
  std::vector<int32_t> idx32(vc.idx.begin(), vc.idx.end()), acc32(vc.accepted.begin(), vc.accepted.end());
  DecodeResult r;
  r.out.assign(static_cast<size_t>(p.T * p.HV * p.V), 0xFFFF);
  r.pool = p.pool_bytes();
  if (backend != Backend::kCuda) {
    DecodeArgs a = p.args(r.out.data(), r.pool.data(), nullptr);
    a.state_indices = i64 ? static_cast<const void*>(vc.idx.data()) : idx32.data();
    a.num_accepted_tokens = i64 ? static_cast<const void*>(vc.accepted.data()) : acc32.data();
    a.verify_slots = vc.C;
    r.status = decode(a, backend, nullptr);
    return r;
  }
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(r.out);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> cu(p.cu_seqlens), idx64(vc.idx), acc64(vc.accepted);
  DeviceBuffer<int32_t> didx32(idx32), dacc32(acc32);
  DeviceBuffer<uint8_t> pool(r.pool);
  DecodeArgs a = p.args(out.ptr, pool.ptr, nullptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr; a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
  if (!p.cu_seqlens.empty()) a.cu_seqlens = cu.ptr;
  a.state_indices = i64 ? static_cast<const void*>(idx64.ptr) : didx32.ptr;
  a.num_accepted_tokens = i64 ? static_cast<const void*>(acc64.ptr) : dacc32.ptr;
  a.verify_slots = vc.C;
  r.status = decode(a, Backend::kCuda, nullptr);
  if (!r.status.ok()) return r;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  r.out = out.to_host();
  r.pool = pool.to_host();
  return r;
}

// The CUDA verify against the float64 CPU verify of the same call: the pool within
// pool_bar, every written out within one bf16 ulp, and the same out rows written
// (0xFFFF: a row left unwritten). `label` follows "decode verify" in the printed line.
void expect_verify_agrees(const DecodeResult& gpu, const DecodeResult& cpu, DType state_dtype, double pool_bar,
                          const std::string& label) {
  const auto gs = state_bytes_to_float(gpu.pool, state_dtype), cs = state_bytes_to_float(cpu.pool, state_dtype);
  const double pool = rel_rms(gs.data(), cs.data(), cs.size());
  size_t beyond_ulp = 0, written_mismatch = 0;
  for (size_t i = 0; i < cpu.out.size(); ++i) {
    if ((cpu.out[i] == 0xFFFF) != (gpu.out[i] == 0xFFFF)) ++written_mismatch;
    if (cpu.out[i] == 0xFFFF) continue;
    const float a = bf16_to_float(gpu.out[i]), b = bf16_to_float(cpu.out[i]);
    if (!(std::abs(a - b) <= std::abs(b) / 128 + 1e-6f)) ++beyond_ulp;
  }
  std::printf("[ errors ] decode verify%s: pool %.2e\n", label.c_str(), pool);
  EXPECT_LE(pool, pool_bar);
  EXPECT_EQ(beyond_ulp, 0u) << "outputs more than one bf16 ulp apart";
  EXPECT_EQ(written_mismatch, 0u) << "padding outputs written, or real ones not";
}

class GpuDecodeVerify : public ::testing::TestWithParam<std::tuple<DType, bool, int64_t>> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(GpuDecodeVerify, MatchesTheCpuVerify) {
  // At K = 64 also with 32 value heads: 128 (sequence, head) pairs, the two-row build.
  for (const int64_t v_heads : {int64_t{4}, int64_t{32}}) {
    if (v_heads == 32 && std::get<2>(GetParam()) != 64) continue;
    SCOPED_TRACE("v_heads " + std::to_string(v_heads));
    DecodeSpec spec;
    spec.seq_tokens = {3, 2, 4, 1};
    spec.heads = 2;
    spec.v_heads = v_heads;
    spec.extra_slots = 14;  // 18 slots: 0..13 named by the rows, 14..17 by none
    spec.state_dtype = std::get<0>(GetParam());
    spec.int64_indices = std::get<1>(GetParam());
    spec.head_dim = std::get<2>(GetParam());
    const DecodeProblem p = make_decode_problem(spec, 21);
    ASSERT_GE(p.pool_size, 14);
    const VerifyCase vc = verify_case();
    const DecodeResult gpu = run_verify(p, vc, Backend::kCuda), cpu = run_verify(p, vc, Backend::kCpuReference);
    ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
    ASSERT_TRUE(cpu.status.ok()) << cpu.status.message;
    const std::vector<uint8_t> initial = p.pool_bytes();
    const size_t slot_bytes = static_cast<size_t>(p.per_slot) * state_elem_bytes(p);
    for (int64_t s = 14; s < p.pool_size; ++s)
      EXPECT_EQ(0, std::memcmp(gpu.pool.data() + s * slot_bytes, initial.data() + s * slot_bytes, slot_bytes))
          << "slot " << s << " is in no row, but was written";
    expect_verify_agrees(gpu, cpu, spec.state_dtype, spec.state_dtype == DType::kFP32 ? 1e-5 : 2e-3,
                         " K=" + std::to_string(spec.head_dim) + " HV=" + std::to_string(v_heads) + " " +
                             to_string(spec.state_dtype) + (spec.int64_indices ? " int64" : " int32"));
  }
}
INSTANTIATE_TEST_SUITE_P(Pools, GpuDecodeVerify,
                         ::testing::Combine(::testing::Values(DType::kFP32, DType::kBF16), ::testing::Bool(),
                                            ::testing::Values(int64_t{128}, int64_t{64})),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_int64" : "_int32") + "_K" +
                                  std::to_string(std::get<2>(info.param));
                         });

// A verify row without tokens between others: nothing of it is written (its
// states go to its token columns, and it has none), as on the CPU.
TEST(GpuDecodeVerifyEmptyRow, WritesNothing) {
  skip_without_gpu();
  if (IsSkipped()) return;
  DecodeSpec spec;
  spec.seq_tokens = {3, 2, 0, 1};  // row 2: slots {7, -1, 8, 9}, starting from 7
  spec.heads = 2;
  spec.extra_slots = 14;
  const DecodeProblem p = make_decode_problem(spec, 23);
  const VerifyCase vc = verify_case();
  const DecodeResult gpu = run_verify(p, vc, Backend::kCuda), cpu = run_verify(p, vc, Backend::kCpuReference);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
  ASSERT_TRUE(cpu.status.ok()) << cpu.status.message;
  expect_verify_agrees(gpu, cpu, spec.state_dtype, 1e-5, " empty row");
  const std::vector<uint8_t> initial = p.pool_bytes();
  const size_t slot_bytes = static_cast<size_t>(p.per_slot) * state_elem_bytes(p);
  for (const int64_t s : {int64_t{7}, int64_t{8}, int64_t{9}})
    EXPECT_EQ(0, std::memcmp(gpu.pool.data() + s * slot_bytes, initial.data() + s * slot_bytes, slot_bytes))
        << "slot " << s << " of the empty row was written";
}

// Device-resident verify arguments out of range: a count outside [1, C], a
// token's slot past the pool, and a sequence with more tokens than C (device
// cu_seqlens, no host copy). Nothing outside the pool and out is written, and
// check_device_faults names each argument.
TEST(GpuDecodeVerifyGuard, BadCountsSlotsAndLengthsAreSkippedAndReported) {
  skip_without_gpu();
  if (IsSkipped()) return;
  ASSERT_TRUE(check_device_faults(nullptr).ok()) << "a fault was recorded before this test";
  DecodeSpec spec;
  spec.seq_tokens = {3, 2, 4, 1};
  spec.heads = 2;
  spec.extra_slots = 14;
  const DecodeProblem p = make_decode_problem(spec, 22);
  VerifyCase vc = verify_case();
  vc.accepted[0] = 0;                      // sequence 0: no start column
  vc.idx[3 * vc.C + 1] = p.pool_size + 5;  // sequence 3, token 1: past the pool
  // Sequence 3 gets 5 tokens (one past its row's 4 slots): sequence 2 ends where it starts.
  std::vector<int64_t> cu = p.cu_seqlens;  // {0, 3, 5, 9, 10}
  cu[3] = cu[4] - 5;
  std::vector<int32_t> idx32(vc.idx.begin(), vc.idx.end()), acc32(vc.accepted.begin(), vc.accepted.end());
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> dcu(cu);
  DeviceBuffer<int32_t> didx(idx32), dacc(acc32);
  GuardedDeviceBuffer pool(p.pool_bytes());
  GuardedDeviceBuffer out(std::vector<uint8_t>(static_cast<size_t>(p.T * p.HV * p.V) * 2, 0xFF));
  DecodeArgs a = p.args(out.data(), pool.data(), nullptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr; a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
  a.cu_seqlens = dcu.ptr;
  a.cu_seqlens_host = nullptr;
  a.state_indices = didx.ptr;
  a.num_accepted_tokens = dacc.ptr;
  a.verify_slots = vc.C;
  const Status st = decode(a, Backend::kCuda, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(pool.damaged(), 0u) << "the pool's guard bands were written";
  EXPECT_EQ(out.damaged(), 0u) << "out's guard bands were written";
  const Status f = check_device_faults(nullptr);
  EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << f.message;
  for (const char* arg : {"num_accepted_tokens (decode)", "state_indices (decode)", "cu_seqlens (decode, verify)"})
    EXPECT_NE(f.message.find(arg), std::string::npos) << arg << " not named: " << f.message;
  std::printf("[ guard ] decode verify: guard bytes intact; check_device_faults: %s\n", f.message.c_str());
  EXPECT_TRUE(check_device_faults(nullptr).ok()) << "the record is cleared by a check";
}

// One column with counts (fla's serving form, no draft tokens): state_indices
// [N, 1] and num_accepted_tokens of ones is the plain step, on the verify build;
// the float64 CPU decode of the same call is the oracle. A count of 2 on the
// device has no column: that sequence is skipped (its slot and out rows
// untouched) and reported.
TEST(GpuDecodeVerify1, OneColumnIsThePlainStep) {
  skip_without_gpu();
  if (IsSkipped()) return;
  ASSERT_TRUE(check_device_faults(nullptr).ok()) << "a fault was recorded before this test";
  for (const int64_t dim : {int64_t{128}, int64_t{64}}) {
    DecodeSpec spec;
    spec.seq_tokens = {1, 1, 1, 1};
    spec.heads = 2;
    spec.v_heads = 4;
    spec.head_dim = dim;
    const DecodeProblem p = make_decode_problem(spec, 23);
    VerifyCase vc{{0, -1, 2, 5}, {1, 1, 1, 1}, 1};
    const DecodeResult gpu = run_verify(p, vc, Backend::kCuda), cpu = run_verify(p, vc, Backend::kCpuReference);
    ASSERT_TRUE(gpu.status.ok()) << gpu.status.message;
    ASSERT_TRUE(cpu.status.ok()) << cpu.status.message;
    expect_verify_agrees(gpu, cpu, spec.state_dtype, 1e-5, ", one column, K=" + std::to_string(dim));

    vc.accepted[3] = 2;  // no second column
    const DecodeResult bad = run_verify(p, vc, Backend::kCuda);
    ASSERT_TRUE(bad.status.ok()) << bad.status.message;
    const size_t slot_bytes = static_cast<size_t>(p.per_slot) * state_elem_bytes(p);
    const std::vector<uint8_t> initial = p.pool_bytes();
    EXPECT_EQ(0, std::memcmp(bad.pool.data() + 5 * slot_bytes, initial.data() + 5 * slot_bytes, slot_bytes))
        << "the skipped sequence's slot was written";
    for (int64_t e = 0; e < p.HV * p.V; ++e) EXPECT_EQ(bad.out[static_cast<size_t>(3 * p.HV * p.V + e)], 0xFFFF);
    const Status f = check_device_faults(nullptr);
    EXPECT_NE(f.message.find("num_accepted_tokens (decode)"), std::string::npos) << f.message;
  }
}

TEST(GpuDecode, UnsupportedHeadDimIsRejectedWithMessage) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  DecodeSpec spec;
  spec.head_dim = 96;  // K = V = 64 and 128 run
  const DecodeProblem p = make_decode_problem(spec, 9);
  const DecodeResult r = run_decode_cuda(p, KernelChoice{0, false});
  EXPECT_EQ(r.status.code, StatusCode::kNotSupported);
  EXPECT_NE(r.status.message.find("head_dim"), std::string::npos) << r.status.message;
}

int variant_index(const char* name) {
  for (int v = 0; v < sm90::decode_variant_count(); ++v)
    if (std::string(sm90::decode_variant_name(v)) == name) return v;
  return -1;
}

// Token tensors as views of one fused projection output on CUDA: the latency
// kernel's strided build, bitwise its dense build on the same problem (the same
// math, other addresses), for K = 128 and 64, fp32 and bf16 pools, one token and
// several a sequence; and within the bars of the float64 recurrence.
TEST(GpuDecode, StridedTokenViewsAreTheDenseLatencyKernel) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t dim;
    DType state;
    std::vector<int64_t> tokens;
  };
  const Case cases[] = {{128, DType::kFP32, {1, 1, 1, 1}}, {128, DType::kBF16, {1, 3, 2}}, {64, DType::kFP32, {2, 1, 4}},
                        {64, DType::kBF16, {1, 1, 1}}};
  for (const Case& cs : cases) {
    DecodeSpec spec;
    spec.seq_tokens = cs.tokens;
    spec.heads = 2;
    spec.v_heads = 4;
    spec.head_dim = cs.dim;
    spec.state_dtype = cs.state;
    spec.per_token_states = true;
    const DecodeProblem p = make_decode_problem(spec, 41);
    const std::string label = "strided K=" + std::to_string(cs.dim) + (cs.state == DType::kFP32 ? " fp32" : " bf16");
    // The dense run, on the latency kernel the strided path runs.
    const DecodeResult dense = run_decode_cuda(p, KernelChoice{variant_index("lat"), false});
    ASSERT_TRUE(dense.status.ok()) << dense.status.message;
    const FusedTokenViews fused = fused_token_views(p, /*pad=*/8);  // rows stay 16-byte aligned
    DeviceBuffer<uint16_t> buf(fused.data);
    DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
    DeviceBuffer<int64_t> cu(p.cu_seqlens);
    DeviceBuffer<int32_t> idx(p.idx32);
    DeviceBuffer<uint8_t> pool(p.pool_bytes());
    DeviceBuffer<uint16_t> out(static_cast<size_t>(p.T * p.HV * p.V));
    DeviceBuffer<uint8_t> per_token(static_cast<size_t>(p.T * p.per_slot) * state_elem_bytes(p));
    FKDA_CUDA_CHECK(cudaMemset(out.ptr, 0xFF, out.n * 2));
    FKDA_CUDA_CHECK(cudaMemset(per_token.ptr, 0xFF, per_token.n));
    DecodeArgs a = p.args(out.ptr, pool.ptr, per_token.ptr);
    fused.apply(a, buf.ptr, p);
    a.A_log = A_log.ptr;
    a.dt_bias = dt_bias.ptr;
    a.state_indices = idx.ptr;
    a.index_type = IndexType::kInt32;
    if (!p.cu_seqlens.empty()) a.cu_seqlens = cu.ptr;
    const Status st = decode(a, Backend::kCuda, nullptr);
    ASSERT_TRUE(st.ok()) << label << ": " << st.message;
    FKDA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(out.to_host(), dense.out) << label;
    EXPECT_EQ(pool.to_host(), dense.pool) << label;
    EXPECT_EQ(per_token.to_host(), dense.per_token) << label;
    // The bars of GpuDecodeCases: fp32 pools 1e-5, bf16 pools one bf16 ulp on a few elements.
    compare(p, dense, run_decode_cpu(p, label), cs.state == DType::kFP32 ? 1e-5 : 2e-3, label.c_str());
  }
}

// The production choice at a bf16 serving size (N = 64, H = 32: 2048 (sequence,
// head) pairs, where it picks packed, the kernel that keeps the state as bf16
// pairs and so rounds it after every token). One token a sequence: packed runs
// and must give fuse-ef-occ's bits (the same math, one rounding). Two tokens, or
// cu_seqlens: fuse-ef-occ must run instead, bit for bit, and not packed, whose
// extra rounding stays inside the bf16 tolerance and so needs this check.
TEST(GpuDecode, ProductionBf16ServingSizesMatchFuseEfOcc) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  const int fuse = variant_index("fuse-ef-occ"), packed = variant_index("packed");
  ASSERT_GE(fuse, 0);
  ASSERT_GE(packed, 0);
  for (int tokens : {1, 2, 0}) {  // 0: one token a sequence given through cu_seqlens
    DecodeSpec spec;
    spec.num_seqs = 64;
    spec.heads = 32;
    spec.state_dtype = DType::kBF16;
    spec.padding_entries = 2;
    if (tokens == 0) spec.seq_tokens.assign(64, 1);
    else spec.tokens_per_seq = tokens;
    spec.per_token_states = tokens == 2;
    const DecodeProblem p = make_decode_problem(spec, 300 + tokens);
    const std::string label = "production bf16 N=64 H=32 " + std::string(tokens == 0 ? "cu_seqlens" : "t=" + std::to_string(tokens));
    const DecodeResult prod = run_decode_cuda(p, KernelChoice{-1, true});
    const DecodeResult ref = run_decode_cuda(p, KernelChoice{fuse, true});
    ASSERT_TRUE(prod.status.ok()) << label << ": " << prod.status.message;
    ASSERT_TRUE(ref.status.ok()) << label << ": " << ref.status.message;
    EXPECT_EQ(prod.out, ref.out) << label;
    EXPECT_EQ(prod.pool, ref.pool) << label;
    EXPECT_EQ(prod.per_token, ref.per_token) << label;
    if (tokens == 1) {  // packed itself, forced, gives the same bits for one token
      const DecodeResult forced = run_decode_cuda(p, KernelChoice{packed, true});
      ASSERT_TRUE(forced.status.ok()) << forced.status.message;
      EXPECT_EQ(forced.pool, ref.pool) << label;
    }
    compare(p, prod, run_decode_cpu(p, label), 2e-3, label.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuDecodeKernels, ::testing::ValuesIn(all_kernel_choices()),
                         [](const ::testing::TestParamInfo<KernelChoice>& info) {
                           return kernel_choice_name(info.param);
                         });

#else

TEST(GpuDecode, SkippedWithoutCudaBuild) {
  std::string why;
  if (!cuda_backend_available(&why)) GTEST_SKIP() << "no GPU run: " << why;
  FAIL() << "cuda_backend_available() is true in a build without CUDA";
}

#endif

}  // namespace
}  // namespace flashkda::testing
