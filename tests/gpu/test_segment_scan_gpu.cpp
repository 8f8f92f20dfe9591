// The affine segment scan on the GPU (spec section 6; label "gpu"): sequences cut
// into segments of a forced number of chunks, from one chunk to many, against the
// float64 oracle; segment boundaries next to partial chunks, mixed varlen batches,
// every state dtype, GVA, graph capture, bitwise determinism, degenerate keys,
// out formed both ways (pass 3's chains, and by superposition: o⁰ + S_in·P), and
// the launch heuristic's choice. Skips, saying why, when the CUDA backend is
// not built or no sm_90 device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <random>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include "sm90/segment_plan.h"
#include "sm90/sm90_forward.h"
#include "tests/common/degenerate_problem.h"
#endif

namespace flashkda::testing {
namespace {

#ifdef FLASHKDA_WITH_CUDA

// The segment scan is held to the same bars as one chain (gpu_harness.h).

class GpuSegmentScan : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

// outputs: how the segment scan forms out (sm90::LaunchOverride::outputs): 0 the
// plan's choice (by superposition without checkpoints), 1 chains again, 2 by
// superposition.
void force_segments(int64_t seg_chunks, int outputs = 0) {
  sm90::LaunchOverride o;
  o.seg_chunks = seg_chunks;
  o.outputs = outputs;
  sm90::set_launch_override(o);
}
constexpr int kOutputsByChains = 1, kOutputsBySuperposition = 2;
std::string outputs_name(int outputs) { return outputs == kOutputsByChains ? "chains" : "superposed"; }

struct Errors {
  double out = 0, state = 0;
};

Errors errors_of(const HostProblem& p, const RunResult& gpu, const char* label) {
  EXPECT_TRUE(gpu.status.ok()) << gpu.status.message;
  if (!gpu.status.ok()) return {1e30, 1e30};
  const OracleResult ref = run_oracle(p);
  Errors e;
  e.out = rel_rms(gpu.out.data(), ref.out.data(), ref.out.size());
  e.state = gpu.final_state.empty() ? 0.0 : rel_rms(gpu.final_state.data(), ref.final_state.data(), ref.final_state.size());
  std::printf("[ errors ] segment scan %-28s T=%lld N=%lld HV=%lld K=%lld: out %.3e  state %.3e\n", label,
              static_cast<long long>(p.tokens()), static_cast<long long>(p.N), static_cast<long long>(p.HV),
              static_cast<long long>(p.K), e.out, e.state);
  return e;
}

void expect_within_bars(const HostProblem& p, const Errors& e) {
  const bool bf16 = p.spec.initial_state == DType::kBF16 || p.spec.final_state == DType::kBF16;
  EXPECT_LE(e.out, bf16 ? kBf16StateBar : kOutBar);
  if (p.spec.final_state != DType::kNone) EXPECT_LE(e.state, bf16 ? kBf16StateBar : kStateBar);
}

// Arguments for workspace_size alone: only sizes matter, so every device input
// gets one aligned address that workspace_size never dereferences, and each
// output one of its own (validate() refuses an output that shares memory with
// another argument).
ForwardArgs sizing_args(const HostProblem& p) {
  void* const fake = reinterpret_cast<void*>(uintptr_t{1} << 30);
  ForwardArgs a = p.host_args(reinterpret_cast<void*>(uintptr_t{1} << 31), reinterpret_cast<void*>(uintptr_t{1} << 32));
  a.q = a.k = a.v = a.g = a.beta = fake;
  a.A_log = a.dt_bias = static_cast<const float*>(fake);
  if (a.initial_state != nullptr) a.initial_state = fake;
  if (a.cu_seqlens != nullptr) a.cu_seqlens = static_cast<const int64_t*>(fake);
  return a;
}

// [blocks] of [R, C] elements of `elem` bytes -> [C, R].
std::vector<uint8_t> transpose_state_bytes(const std::vector<uint8_t>& x, int64_t blocks, int64_t R, int64_t C,
                                           size_t elem) {
  std::vector<uint8_t> y(x.size());
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(&y[((b * C + c) * R + r) * elem], &x[((b * R + r) * C + c) * elem], elem);
  return y;
}

// The plans that read the initial state and write the final state in different
// kernels or CTAs: one chain a sequence in 8- and 4-warp CTAs, the segment scan with
// out by chains (pass 3 stores the final state) and by superposition (the
// composition stores it: staged and register forms), and the split call (the
// resume's composition reads the initial state).
struct StatePlan {
  const char* name;
  sm90::LaunchOverride o;
  bool split;
};
std::vector<StatePlan> state_plans() {
  auto forced = [](int64_t seg_chunks, int outputs, int compose) {
    sm90::LaunchOverride o;
    o.seg_chunks = seg_chunks;
    o.outputs = outputs;
    o.compose = compose;
    return o;
  };
  auto v_split = [&](int v) {
    sm90::LaunchOverride o = forced(-1, 0, 0);
    o.v_split = v;
    return o;
  };
  // The split call with forced segments: its composition reads the initial state
  // (with one segment a sequence, pass 3's chain reads it instead).
  return {{"one chain, 8 warps", v_split(1), false},
          {"one chain, 4 warps", v_split(2), false},
          {"segments, chains", forced(4, kOutputsByChains, 0), false},
          {"segments, superposed", forced(4, kOutputsBySuperposition, 0), false},
          {"segments, superposed, register compose", forced(4, kOutputsBySuperposition, 1), false},
          {"split call, segments", forced(4, 0, 0), true}};
}

// Key-major initial / final states (ForwardArgs::states_key_major, fla's layout):
// bitwise the value-major run on transposed states, whichever kernel reads and
// writes them: one chain a sequence in 8- and 4-warp CTAs (load before, store after
// the chunk loop), the segment scan with out by chains (pass 3 stores the final
// state) and by superposition (the composition stores it: staged and register
// forms), and the split call (the resume's composition reads the initial state),
// K = 128 and 64, fp32 and bf16 states. (The checkpoint variants: random calls.)
TEST_F(GpuSegmentScan, KeyMajorStatesAreTheValueMajorRunTransposed) {
  const std::vector<StatePlan> modes = state_plans();
  for (int64_t K : {128, 64}) {
    for (DType t : {DType::kFP32, DType::kBF16}) {
      ProblemSpec spec;
      spec.seqlens = {300, 17, 0, 129};
      spec.heads = 2;
      spec.v_heads = 4;
      spec.head_dim = K;
      spec.initial_state = spec.final_state = t;
      const HostProblem p = make_problem(spec, 90 + K);
      HostProblem km = p;
      const int64_t blocks = p.N * p.HV;
      if (t == DType::kFP32) {
        std::vector<uint8_t> b(p.init_f32.size() * 4);
        std::memcpy(b.data(), p.init_f32.data(), b.size());
        b = transpose_state_bytes(b, blocks, p.V, p.K, 4);
        std::memcpy(km.init_f32.data(), b.data(), b.size());
      } else {
        std::vector<uint8_t> b(p.init_bf16.size() * 2);
        std::memcpy(b.data(), p.init_bf16.data(), b.size());
        b = transpose_state_bytes(b, blocks, p.V, p.K, 2);
        std::memcpy(km.init_bf16.data(), b.data(), b.size());
      }
      for (const StatePlan& m : modes) {
        SCOPED_TRACE(std::string(m.name) + " K=" + std::to_string(K) + (t == DType::kFP32 ? " fp32" : " bf16"));
        sm90::set_launch_override(m.o);
        SplitSummaries s_vm, s_km;
        const RunResult vm = run_cuda(p, nullptr, 0, m.split ? &s_vm : nullptr);
        const RunResult kr = run_cuda(km, nullptr, 0, m.split ? &s_km : nullptr, /*states_key_major=*/true);
        ASSERT_TRUE(vm.status.ok()) << vm.status.message;
        ASSERT_TRUE(kr.status.ok()) << kr.status.message;
        EXPECT_EQ(vm.out_bits, kr.out_bits);
        EXPECT_EQ(transpose_state_bytes(vm.state_bytes, blocks, p.V, p.K, t == DType::kFP32 ? 4 : 2),
                  kr.state_bytes);
      }
      sm90::set_launch_override({});
    }
  }
}

// An engine's in-place state update, final_state == initial_state: under every plan
// above the same out and final state, bit for bit, as with a final state of its
// own. A plan that read some of a sequence's initial state after another CTA or
// kernel had written part of its final state over it would differ. Value- and
// key-major, fp32 and bf16, K = 128 and 64.
TEST_F(GpuSegmentScan, FinalStateOverTheInitialStateIsTheOutOfPlaceRun) {
  const std::vector<StatePlan> modes = state_plans();
  for (int64_t K : {128, 64}) {
    for (DType t : {DType::kFP32, DType::kBF16}) {
      ProblemSpec spec;
      spec.seqlens = {300, 17, 0, 129, 64};
      spec.heads = 2;
      spec.v_heads = 4;
      spec.head_dim = K;
      spec.initial_state = spec.final_state = t;
      const HostProblem p = make_problem(spec, 120 + K);
      for (const bool key_major : {false, true}) {
        for (const StatePlan& m : modes) {
          SCOPED_TRACE(std::string(m.name) + " K=" + std::to_string(K) + (t == DType::kFP32 ? " fp32" : " bf16") +
                       (key_major ? " key-major" : ""));
          sm90::set_launch_override(m.o);
          SplitSummaries s_out, s_in;
          const RunResult apart = run_cuda(p, nullptr, 0, m.split ? &s_out : nullptr, key_major);
          const RunResult over = run_cuda(p, nullptr, 0, m.split ? &s_in : nullptr, key_major,
                                          /*state_in_place=*/true);
          ASSERT_TRUE(apart.status.ok()) << apart.status.message;
          ASSERT_TRUE(over.status.ok()) << over.status.message;
          EXPECT_EQ(apart.out_bits, over.out_bits);
          EXPECT_EQ(apart.state_bytes, over.state_bytes);
        }
      }
      sm90::set_launch_override({});
    }
  }
}

// The workspace of a split call holds the segment states: a forced split that
// silently fell back to one chain would not show in the results.
void expect_split(const HostProblem& p) {
  const ForwardArgs a = sizing_args(p);
  size_t split = 0, whole = 0;
  ASSERT_TRUE(workspace_size(a, Backend::kCuda, &split).ok());
  const sm90::LaunchOverride forced = {0, 0, -1};
  sm90::set_launch_override(forced);
  ASSERT_TRUE(workspace_size(a, Backend::kCuda, &whole).ok());
  EXPECT_GT(split, whole) << "the forced plan did not split";
}

// Outputs by superposition keep o⁰ and P in the workspace (12 KB a chunk and head
// at K = 128): a forced mode that silently fell back would not show in the results.
// (A varlen batch's plan also lists the sequences the composition walks, from two
// segments superposed and three by chains: up to 4 bytes a sequence more.)
void expect_outputs_mode(const HostProblem& p, int64_t seg_chunks, int outputs) {
  const ForwardArgs a = sizing_args(p);
  size_t superposed = 0, chains = 0;
  force_segments(seg_chunks, kOutputsBySuperposition);
  ASSERT_TRUE(workspace_size(a, Backend::kCuda, &superposed).ok());
  force_segments(seg_chunks, kOutputsByChains);
  ASSERT_TRUE(workspace_size(a, Backend::kCuda, &chains).ok());
  const size_t tile = p.K == 64 ? 6144 : 12288;  // o⁰ fp32 + P bf16, 16 tokens
  const size_t slots = static_cast<size_t>(p.N + (p.tokens() + 15) / 16);
  const size_t tiles = slots * static_cast<size_t>(p.HV) * tile;
  EXPECT_GE(superposed - chains, tiles) << outputs_name(outputs);
  EXPECT_LE(superposed - chains, tiles + 4 * static_cast<size_t>(p.N)) << outputs_name(outputs);
  force_segments(seg_chunks, outputs);
}

// Suites that take (forced segment chunks, head dim): K = V = 64 runs its own
// instantiations of the kernels (shared_storage.cuh).
using SegAndDim = std::tuple<int64_t, int64_t>;
using SegDimOutputs = std::tuple<int64_t, int64_t, int>;
std::string seg_and_dim_name(const ::testing::TestParamInfo<SegAndDim>& info) {
  const int64_t seg = std::get<0>(info.param);
  return (seg < 0 ? std::string("seg_auto") : "seg" + std::to_string(seg)) + "_K" +
         std::to_string(std::get<1>(info.param));
}
const auto kHeadDims = ::testing::Values(int64_t{128}, int64_t{64});

class GpuSegmentLength : public GpuSegmentScan, public ::testing::WithParamInterface<SegDimOutputs> {};

// Mixed varlen: empty, one-token, partial-chunk and long sequences, so that
// some are cut into many segments, some into two or three (the last one
// partial), and some not at all; out formed both ways.
TEST_P(GpuSegmentLength, VarlenMatchesOracle) {
  const int64_t seg = std::get<0>(GetParam());
  const int outputs = std::get<2>(GetParam());
  ProblemSpec spec;
  spec.seqlens = {0, 1, 15, 17, 100, 250, 513, 1000, 31};
  spec.heads = 3;
  spec.head_dim = std::get<1>(GetParam());
  const HostProblem p = make_problem(spec, 100 + seg);
  expect_outputs_mode(p, seg, outputs);
  const RunResult gpu = run_cuda(p);
  expect_within_bars(p, errors_of(p, gpu, ("seg_chunks=" + std::to_string(seg) + " " + outputs_name(outputs)).c_str()));
  force_segments(seg, outputs);
  expect_split(p);
}
INSTANTIATE_TEST_SUITE_P(SegChunks, GpuSegmentLength,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8, 21), kHeadDims,
                                            ::testing::Values(kOutputsByChains, kOutputsBySuperposition)),
                         [](const auto& info) {
                           return "seg" + std::to_string(std::get<0>(info.param)) + "_K" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  outputs_name(std::get<2>(info.param));
                         });

// One long sequence in many segments (512 of one chunk: the composition's
// longest chain), and the heuristic's own choice at H = 12.
TEST_F(GpuSegmentScan, ManySegmentsOneSequence) {
  ProblemSpec spec;
  spec.seqlen = 8192 + 7;
  spec.heads = 2;
  const HostProblem p = make_problem(spec, 7);
  force_segments(1);
  expect_within_bars(p, errors_of(p, run_cuda(p), "seg_chunks=1, 513 segments"));
}

TEST_F(GpuSegmentScan, HeuristicSplitAtTwelveHeads) {
  ProblemSpec spec;
  spec.seqlen = 8192;
  spec.heads = 12;
  const HostProblem p = make_problem(spec, 8);
  expect_within_bars(p, errors_of(p, run_cuda(p), "heuristic H=12"));
  expect_split(p);
}

TEST_F(GpuSegmentScan, BatchedWithoutCuSeqlens) {
  ProblemSpec spec;
  spec.batch = 3;
  spec.seqlen = 333;
  spec.heads = 2;
  const HostProblem p = make_problem(spec, 9);
  force_segments(4);
  expect_within_bars(p, errors_of(p, run_cuda(p), "batched seg_chunks=4"));
}

TEST_F(GpuSegmentScan, GroupedValueHeads) {
  ProblemSpec spec;
  spec.seqlens = {500, 77};
  spec.heads = 2;
  spec.v_heads = 6;
  const HostProblem p = make_problem(spec, 10);
  force_segments(3);
  expect_within_bars(p, errors_of(p, run_cuda(p), "GVA seg_chunks=3"));
}

// A varlen call without cu_seqlens_host, as engines make it: the plan launches
// the segment scan for the finest pieces and the prologue's set-up CTA picks
// the segments from the lengths on the device. For mixed and equal batches
// (int64 and int32 boundaries, empty sequences, K = 64): the pieces it wrote
// are what segment_plan.h's rule gives for the true lengths; the result is
// within the bars, and bitwise the host-planned call of the same segments (the
// same cut forced with the lengths on the host, or one pass where nothing is cut).
struct DevicePlannedRun {
  RunResult r;
  sm90::LaunchPlan plan;
  int32_t pieces = 0;
};
DevicePlannedRun run_with_lengths_on_device(const HostProblem& p, bool int32_cu) {
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(p.out_elems());
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias), init(p.init_f32), fin(p.state_elems());
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  DeviceBuffer<int32_t> cu32(std::vector<int32_t>(p.cu_seqlens.begin(), p.cu_seqlens.end()));
  ForwardArgs a = p.host_args(out.ptr, fin.ptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr; a.initial_state = init.ptr;
  a.cu_seqlens = int32_cu ? nullptr : cu.ptr;
  a.cu_seqlens_int32 = int32_cu ? cu32.ptr : nullptr;
  a.cu_seqlens_host = nullptr;
  DevicePlannedRun d;
  int sms = 0;
  FKDA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  d.r.status = sm90::launch_plan_for(a, sms, &d.plan);
  if (!d.r.status.ok()) return d;
  size_t bytes = 0;
  d.r.status = workspace_size(a, Backend::kCuda, &bytes);
  if (!d.r.status.ok()) return d;
  DeviceBuffer<uint8_t> ws(bytes);
  FKDA_CUDA_CHECK(cudaMemset(out.ptr, 0xFF, out.n * 2));
  d.r.status = forward(a, Backend::kCuda, ws.ptr, bytes, nullptr);
  if (!d.r.status.ok()) return d;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  if (d.plan.device_segments)
    FKDA_CUDA_CHECK(cudaMemcpy(&d.pieces, ws.ptr + sm90::device_segment_plan_offset(a, d.plan), 4,
                               cudaMemcpyDeviceToHost));
  d.r.out_bits = out.to_host();
  d.r.out = bf16_vector_to_float(d.r.out_bits);
  d.r.final_state = fin.to_host();
  d.r.state_bytes.resize(d.r.final_state.size() * 4);
  std::memcpy(d.r.state_bytes.data(), d.r.final_state.data(), d.r.state_bytes.size());
  return d;
}

TEST_F(GpuSegmentScan, SegmentsPlannedOnTheDeviceWhereOnlyItHasTheLengths) {
  struct Case {
    int64_t heads, head_dim;
    std::vector<int64_t> seqlens;
    bool int32_cu;
  };
  std::vector<int64_t> prefill_among_short = {3000};
  for (int i = 0; i < 11; ++i) prefill_among_short.push_back(i == 4 ? 0 : 17 + 40 * i);
  const std::vector<Case> cases = {
      {4, 128, prefill_among_short, false},
      {4, 128, prefill_among_short, true},
      {8, 128, {1024, 1024, 1024, 1024}, false},        // equal: a coarser cut, or none
      {2, 128, {400, 400, 400, 400, 400, 400}, true},  // short: nothing cut
      {4, 64, {2500, 0, 300, 31}, false},
      {2, 128, {40, 4000, 700}, true},
      {2, 128, {1500, 1500, 1500, 1500, 1500, 1500, 37}, false},  // many cut, partial last segments
      {2, 64, {2100, 3, 2100, 2100, 900}, true},
  };
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const Case& c : cases) {
    ProblemSpec spec;
    spec.seqlens = c.seqlens;
    spec.heads = c.heads;
    spec.head_dim = c.head_dim;
    const HostProblem p = make_problem(spec, 90 + c.heads);
    const DevicePlannedRun d = run_with_lengths_on_device(p, c.int32_cu);
    ASSERT_TRUE(d.r.status.ok()) << d.r.status.message;
    ASSERT_TRUE(d.plan.device_segments) << "a case the device plans (heads " << c.heads << ")";
    // The rule on the true lengths, for the family launched.
    const sm90::ProblemShape known = sm90::problem_shape(p.host_args(nullptr, nullptr));
    const int32_t expected = sm90::device_plan_pieces(known, d.plan.superposed_outputs, d.plan.seg_chunks, sms);
    const std::string label = "device plan H=" + std::to_string(c.heads) + " K=" + std::to_string(c.head_dim) +
                              " pieces=" + std::to_string(d.pieces) + "x" + std::to_string(d.plan.seg_chunks);
    EXPECT_EQ(d.pieces, expected) << label;
    expect_within_bars(p, errors_of(p, d.r, label.c_str()));
    // The host-planned call of the same segments.
    sm90::LaunchOverride same{};
    if (d.pieces == sm90::kWholeSequences) {
      same.seg_chunks = -1;
      same.v_split = 2;
    } else {
      same.seg_chunks = static_cast<int64_t>(d.pieces) * d.plan.seg_chunks;
      same.outputs = d.plan.superposed_outputs ? kOutputsBySuperposition : kOutputsByChains;
    }
    sm90::set_launch_override(same);
    const RunResult host = run_cuda(p);
    sm90::set_launch_override({});
    ASSERT_TRUE(host.status.ok()) << host.status.message;
    EXPECT_EQ(d.r.out_bits, host.out_bits) << label;
    EXPECT_EQ(d.r.state_bytes, host.state_bytes) << label;
  }
}

// An engine captures the forward once and replays it with new boundaries in the
// same cu_seqlens buffer (the same N and T, so the same launches): the device
// plans each replay from the lengths the buffer then holds. Every replay gives
// the bits of a direct call with those lengths, within the bars; the direct
// call, run twice, the same bits.
std::vector<RunResult> replay_with_lengths_on_device(const HostProblem& p,
                                                     const std::vector<std::vector<int64_t>>& boundaries) {
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(p.out_elems());
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias), init(p.init_f32), fin(p.state_elems());
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  ForwardArgs a = p.host_args(out.ptr, fin.ptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr; a.initial_state = init.ptr;
  a.cu_seqlens = cu.ptr;
  a.cu_seqlens_host = nullptr;
  std::vector<RunResult> results(boundaries.size());
  size_t bytes = 0;
  Status s = workspace_size(a, Backend::kCuda, &bytes);
  if (!s.ok()) {
    results[0].status = s;
    return results;
  }
  DeviceBuffer<uint8_t> ws(bytes);
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FKDA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  FKDA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  s = forward(a, Backend::kCuda, ws.ptr, bytes, stream);
  FKDA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  if (s.ok()) {
    FKDA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (size_t i = 0; i < boundaries.size(); ++i) {
      FKDA_CUDA_CHECK(cudaMemcpy(cu.ptr, boundaries[i].data(), cu.n * sizeof(int64_t), cudaMemcpyHostToDevice));
      // On the replay's stream: a non-blocking stream does not wait for the legacy one.
      FKDA_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0xFF, out.n * 2, stream));
      FKDA_CUDA_CHECK(cudaMemsetAsync(fin.ptr, 0xFF, fin.n * 4, stream));
      FKDA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      FKDA_CUDA_CHECK(cudaStreamSynchronize(stream));
      RunResult& r = results[i];
      r.out_bits = out.to_host();
      r.out = bf16_vector_to_float(r.out_bits);
      r.final_state = fin.to_host();
      r.state_bytes.resize(r.final_state.size() * 4);
      std::memcpy(r.state_bytes.data(), r.final_state.data(), r.state_bytes.size());
    }
    FKDA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  }
  FKDA_CUDA_CHECK(cudaGraphDestroy(graph));
  FKDA_CUDA_CHECK(cudaStreamDestroy(stream));
  for (RunResult& r : results) r.status = s;
  return results;
}

TEST_F(GpuSegmentScan, DevicePlannedGraphFollowsEachReplaysLengths) {
  // Twelve sequences of 3,600 tokens in all: a prefill among short requests,
  // the same prefill last, equal lengths, two prefills; then the first again.
  const std::vector<int64_t> prefill_first = {3000, 20, 40, 60, 80, 0, 100, 50, 70, 90, 30, 60};
  const std::vector<int64_t> prefill_last(prefill_first.rbegin(), prefill_first.rend());
  const std::vector<std::vector<int64_t>> batches = {prefill_first, prefill_last, std::vector<int64_t>(12, 300),
                                                     {1700, 20, 20, 20, 20, 1700, 20, 20, 20, 20, 20, 20},
                                                     prefill_first};
  for (const int64_t head_dim : {128, 64}) {
    std::vector<HostProblem> problems;
    std::vector<std::vector<int64_t>> boundaries;
    for (const auto& lengths : batches) {
      ProblemSpec spec;
      spec.seqlens = lengths;
      spec.heads = 4;
      spec.head_dim = head_dim;
      problems.push_back(make_problem(spec, 120));  // the same T and N: the same inputs
      boundaries.push_back(problems.back().cu_seqlens);
    }
    const std::vector<RunResult> replays = replay_with_lengths_on_device(problems[0], boundaries);
    ASSERT_TRUE(replays[0].status.ok()) << replays[0].status.message;
    for (size_t i = 0; i < batches.size(); ++i) {
      const std::string label = "graph replay " + std::to_string(i) + " K=" + std::to_string(head_dim);
      const DevicePlannedRun direct = run_with_lengths_on_device(problems[i], false);
      const DevicePlannedRun again = run_with_lengths_on_device(problems[i], false);
      ASSERT_TRUE(direct.r.status.ok()) << direct.r.status.message;
      ASSERT_TRUE(direct.plan.device_segments) << label << ": a call the device plans";
      EXPECT_EQ(replays[i].out_bits, direct.r.out_bits) << label;
      EXPECT_EQ(replays[i].state_bytes, direct.r.state_bytes) << label;
      EXPECT_EQ(again.r.out_bits, direct.r.out_bits) << label << ": run to run";
      EXPECT_EQ(again.r.state_bytes, direct.r.state_bytes) << label << ": run to run";
      expect_within_bars(problems[i], errors_of(problems[i], replays[i], label.c_str()));
    }
  }
}

class GpuSegmentStates
    : public GpuSegmentScan,
      public ::testing::WithParamInterface<std::tuple<std::tuple<DType, DType>, int64_t, int>> {};

// The final states come from the last segment's chain (chains) or from the
// composition (superposed): both into every state dtype; two segments (pass 2's
// shortest chain) and five.
TEST_P(GpuSegmentStates, EveryStateDtypeCombination) {
  const int outputs = std::get<2>(GetParam());
  for (const int64_t seg : {10, 4}) {
    ProblemSpec spec;
    spec.seqlens = {300, 130};
    spec.heads = 2;
    spec.initial_state = std::get<0>(std::get<0>(GetParam()));
    spec.final_state = std::get<1>(std::get<0>(GetParam()));
    spec.head_dim = std::get<1>(GetParam());
    const HostProblem p = make_problem(spec, 11);
    force_segments(seg, outputs);
    const std::string label = "states seg_chunks=" + std::to_string(seg) + " " + outputs_name(outputs);
    expect_within_bars(p, errors_of(p, run_cuda(p), label.c_str()));
  }
}
INSTANTIATE_TEST_SUITE_P(States, GpuSegmentStates,
                         ::testing::Combine(::testing::Values(std::make_tuple(DType::kNone, DType::kNone),
                                                              std::make_tuple(DType::kNone, DType::kFP32),
                                                              std::make_tuple(DType::kBF16, DType::kNone),
                                                              std::make_tuple(DType::kFP32, DType::kNone),
                                                              std::make_tuple(DType::kBF16, DType::kBF16),
                                                              std::make_tuple(DType::kFP32, DType::kFP32)),
                                            kHeadDims, ::testing::Values(kOutputsByChains, kOutputsBySuperposition)),
                         [](const auto& info) {
                           const auto& states = std::get<0>(info.param);
                           return std::string(to_string(std::get<0>(states))) + "_to_" +
                                  to_string(std::get<1>(states)) + "_K" + std::to_string(std::get<1>(info.param)) +
                                  "_" + outputs_name(std::get<2>(info.param));
                         });

// Captured in a CUDA graph and replayed on one workspace: the same bits as a
// direct call; and two direct calls give the same bits.
TEST_F(GpuSegmentScan, GraphReplayAndRepeatAreBitwiseIdentical) {
  for (const int outputs : {kOutputsByChains, kOutputsBySuperposition}) {
    for (const int64_t head_dim : {128, 64}) {
      ProblemSpec spec;
      spec.seqlens = {700, 3, 1200};
      spec.heads = 4;
      spec.head_dim = head_dim;
      const HostProblem p = make_problem(spec, 12);
      force_segments(5, outputs);
      const RunResult a = run_cuda(p), b = run_cuda(p), replayed = run_cuda(p, nullptr, 3);
      ASSERT_TRUE(a.status.ok()) << a.status.message;
      ASSERT_TRUE(b.status.ok()) << b.status.message;
      ASSERT_TRUE(replayed.status.ok()) << replayed.status.message;
      EXPECT_EQ(a.out_bits, b.out_bits) << "K=" << head_dim << " " << outputs_name(outputs);
      EXPECT_EQ(a.state_bytes, b.state_bytes) << "K=" << head_dim << " " << outputs_name(outputs);
      EXPECT_EQ(a.out_bits, replayed.out_bits) << "K=" << head_dim << " " << outputs_name(outputs);
      EXPECT_EQ(a.state_bytes, replayed.state_bytes) << "K=" << head_dim << " " << outputs_name(outputs);
      expect_within_bars(p, errors_of(p, replayed, ("graph replay seg_chunks=5 " + outputs_name(outputs)).c_str()));
    }
  }
}

// The composition's two forms (segment_compose_kernel.cuh) run the same FMAs in
// the same order (ComposeQuarters: four key quarters, whether one thread runs
// them or groups of warps hand theirs over): the register form and the staged
// form with each of its row counts (4, 8, 16, 32 a CTA, forced; one, two and
// four groups of warps) give the same bits, in a forward (both ways
// of forming out, every state read and written) and in a summaries call with its
// resumed forward. The plan itself takes the staged form for these few chains.
TEST_F(GpuSegmentScan, CompositionFormsAreBitwiseEqual) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  constexpr int kRegisterForm = 1;
  for (const int64_t head_dim : {128, 64}) {
    ProblemSpec spec;
    spec.seqlens = {700, 3, 1200};
    spec.heads = 2;
    spec.head_dim = head_dim;
    spec.initial_state = DType::kFP32;
    spec.final_state = DType::kFP32;
    const HostProblem p = make_problem(spec, 15);
    const std::string dim = "K=" + std::to_string(head_dim);
    ASSERT_GT(sm90::staged_compose_rows(p.N * p.HV, head_dim, sms), 0) << dim;
    ASSERT_GT(sm90::staged_compose_rows(2 * p.N * p.HV, head_dim, sms), 0) << dim << ", summaries";
    auto run = [&](int compose, int outputs, SplitSummaries* sum) {
      sm90::LaunchOverride o;
      o.seg_chunks = 5;
      o.outputs = outputs;
      o.compose = compose;
      sm90::set_launch_override(o);
      const RunResult r = run_cuda(p, nullptr, 0, sum);
      EXPECT_TRUE(r.status.ok()) << r.status.message;
      return r;
    };
    const RunResult chains = run(kRegisterForm, kOutputsByChains, nullptr);
    const RunResult superposed = run(kRegisterForm, kOutputsBySuperposition, nullptr);
    expect_within_bars(p, errors_of(p, chains, "register composition chains"));
    expect_within_bars(p, errors_of(p, superposed, "register composition superposed"));
    SplitSummaries split;
    const RunResult resumed = run(kRegisterForm, 0, &split);
    for (const int rows : {4, 8, 16, 32}) {
      const std::string label = dim + ", staged form, " + std::to_string(rows) + " rows a CTA";
      const RunResult c = run(rows, kOutputsByChains, nullptr), s = run(rows, kOutputsBySuperposition, nullptr);
      EXPECT_EQ(c.out_bits, chains.out_bits) << label << ", chains";
      EXPECT_EQ(c.state_bytes, chains.state_bytes) << label << ", chains";
      EXPECT_EQ(s.out_bits, superposed.out_bits) << label << ", superposed";
      EXPECT_EQ(s.state_bytes, superposed.state_bytes) << label << ", superposed";
      SplitSummaries staged_split;
      const RunResult r = run(rows, 0, &staged_split);
      EXPECT_EQ(staged_split.M, split.M) << label << ", summaries";
      EXPECT_EQ(staged_split.B, split.B) << label << ", summaries";
      EXPECT_EQ(r.out_bits, resumed.out_bits) << label << ", resumed";
      EXPECT_EQ(r.state_bytes, resumed.state_bytes) << label << ", resumed";
    }
  }
}

// M is a product of contractions from near-collinear keys: the summaries must
// stay as accurate as one chain on the degenerate class.
TEST_F(GpuSegmentScan, DegenerateKeysAcrossSegments) {
  for (const DegenerateCase& c : {DegenerateCase{KeyPattern::kCollinear, 0.0, 8.f, true, false},
                                  DegenerateCase{KeyPattern::kAntiAligned, 1e-3, 8.f, true, false},
                                  DegenerateCase{KeyPattern::kServingRepeat, 0.0, 8.f, true, true}}) {
    ProblemSpec spec;
    spec.seqlens = {1500, 45};
    spec.heads = 2;
    const HostProblem p = make_degenerate_problem(spec, c, 13);
    force_segments(6);
    const Errors e = errors_of(p, run_cuda(p), c.label().c_str());
    EXPECT_LE(e.out, kDegenerateBar) << c.label();
    EXPECT_LE(e.state, kDegenerateBar) << c.label();
  }
}

// A long single head in many segments (the T = 1M regime, shortened so the
// float64 oracle stays quick): the composition runs 60+ steps.
TEST_F(GpuSegmentScan, LongSingleHead) {
  for (const int64_t head_dim : {128, 64}) {
    sm90::set_launch_override({});  // the heuristic's plan (expect_split leaves one forced)
    ProblemSpec spec;
    spec.seqlen = 131072;
    spec.heads = 1;
    spec.head_dim = head_dim;
    const HostProblem p = make_problem(spec, 14);
    expect_within_bars(p, errors_of(p, run_cuda(p), "heuristic H=1 T=131072"));
    expect_split(p);
  }
}

// The tensor-parallel table's H = 1, T = 2^20 row itself: one full head against
// the float64 recurrence (spec section 5 asks for the bars at T = 1M), in the
// heuristic's plan (~66 segments, the composition's whole chain). K = 128 only:
// the test takes ~25 s on a 16-core host, nearly all of it the
// inputs and the oracle (which splits the head's rows over the cores).
TEST_F(GpuSegmentScan, MillionTokenHeadWithinBars) {
  sm90::set_launch_override({});
  ProblemSpec spec;
  spec.seqlen = int64_t{1} << 20;
  spec.heads = 1;
  const HostProblem p = make_problem(spec, 15);
  expect_within_bars(p, errors_of(p, run_cuda(p), "heuristic H=1 T=2^20"));
  expect_split(p);
}

// One sequence of `seqlen` tokens without cu_seqlens, or the varlen batch
// `seqlens`; fp32 initial and final states.
ProblemSpec fp32_states_spec(int64_t head_dim, int64_t heads, int64_t seqlen, std::vector<int64_t> seqlens = {}) {
  ProblemSpec spec;
  if (seqlens.empty())
    spec.seqlen = seqlen;
  else
    spec.seqlens = std::move(seqlens);
  spec.heads = heads;
  spec.head_dim = head_dim;
  spec.initial_state = DType::kFP32;
  spec.final_state = DType::kFP32;
  return spec;
}

// Outputs by superposition over many short segments (128 at T = 65536): the
// composition runs 127 steps and the output kernel forms each segment's out
// from the S_in it left; both forms of the composition, K = 128 and 64, and a
// varlen batch with several heads. Repeated calls give the same bits, and the
// result meets the oracle's bars.
TEST_F(GpuSegmentScan, SuperposedOutputsOfManySegments) {
  constexpr int kRegisterForm = 1, kPlannedForm = 0, kRepeats = 4;
  for (const int64_t head_dim : {128, 64}) {
    for (const bool varlen : {false, true}) {
      const ProblemSpec spec =
          varlen ? fp32_states_spec(head_dim, 3, 0, {9000, 17, 20000, 4100}) : fp32_states_spec(head_dim, 1, 65536);
      const HostProblem p = make_problem(spec, 16);
      for (const int compose : {kRegisterForm, kPlannedForm}) {
        sm90::LaunchOverride o;
        o.seg_chunks = 32;
        o.outputs = kOutputsBySuperposition;
        o.compose = compose;
        sm90::set_launch_override(o);
        const std::string label = "many segments K=" + std::to_string(head_dim) + (varlen ? " varlen" : " T=65536") +
                                  (compose == kRegisterForm ? " register" : " planned") + " composition";
        const RunResult first = run_cuda(p);
        ASSERT_TRUE(first.status.ok()) << first.status.message;
        for (int i = 1; i < kRepeats; ++i) {
          const RunResult again = run_cuda(p);
          ASSERT_TRUE(again.status.ok()) << again.status.message;
          EXPECT_EQ(again.out_bits, first.out_bits) << label << ", call " << i;
          EXPECT_EQ(again.state_bytes, first.state_bytes) << label << ", call " << i;
        }
        expect_within_bars(p, errors_of(p, first, label.c_str()));
      }
    }
  }
}

// The output kernel's two CTA sizes (8 chunks, or 16 where its grid is many waves
// deep: sm90_forward.cu, output_chunks_per_cta) form each chunk's out by the same
// products: the same bits, on segments that are a whole number of CTAs (32
// chunks) and not (40: 16 + 16 + 8 against five of 8), one sequence and varlen,
// K = 128 and 64.
TEST_F(GpuSegmentScan, OutputCtaSizesGiveTheSameBits) {
  for (const int64_t head_dim : {128, 64}) {
    for (const bool varlen : {false, true}) {
      const ProblemSpec spec =
          varlen ? fp32_states_spec(head_dim, 2, 0, {3000, 17, 5000, 1100}) : fp32_states_spec(head_dim, 1, 12345);
      const HostProblem p = make_problem(spec, 17);
      for (const int64_t seg : {int64_t{32}, int64_t{40}}) {
        const std::string label = "output CTA sizes K=" + std::to_string(head_dim) + (varlen ? " varlen" : " T=12345") +
                                  " segments of " + std::to_string(seg);
        sm90::LaunchOverride o;
        o.seg_chunks = seg;
        o.outputs = kOutputsBySuperposition;
        o.output_chunks = 8;
        sm90::set_launch_override(o);
        const RunResult a = run_cuda(p);
        o.output_chunks = 16;
        sm90::set_launch_override(o);
        const RunResult b = run_cuda(p);
        ASSERT_TRUE(a.status.ok()) << a.status.message;
        ASSERT_TRUE(b.status.ok()) << b.status.message;
        EXPECT_EQ(a.out_bits, b.out_bits) << label;
        EXPECT_EQ(a.state_bytes, b.state_bytes) << label;
        expect_within_bars(p, errors_of(p, b, label.c_str()));
      }
    }
  }
}

// The forward is linear in (v, initial state), and every rounding in it commutes
// with a power-of-two scale, so value head 1 with both scaled by 2^60 must give
// exactly 2^60 times head 0's out and final state, bit for bit, through the
// segment scan's hand-overs (o⁰, P, the composed S_in): a form of them at a fixed
// scale (fp16, say) would overflow there (docs/perf-log.md, "o⁰ as scaled fp16").
// Value head 2 at 2^-24 would put such a form in its subnormals; there a state
// decayed below fp32's normal range may flush, so it is held to a tight tolerance
// instead of the bits. Segment 0 of each sequence (its o⁰ is its out) and the later
// ones (o⁰ + S_in·P), K = 128 and 64.
TEST_F(GpuSegmentScan, SuperposedOutputsKeepTheirScale) {
  constexpr int kHeadScale[3] = {0, 60, -24};
  for (const int64_t head_dim : {128, 64}) {
    ProblemSpec spec = fp32_states_spec(head_dim, 1, 0, {3000, 517});
    spec.v_heads = 3;
    const HostProblem base = make_problem(spec, 18);
    ASSERT_EQ(base.HV, 3);
    HostProblem p = base;
    for (int64_t t = 0; t < p.tokens(); ++t)
      for (int64_t hv = 0; hv < p.HV; ++hv)
        for (int64_t e = 0; e < p.V; ++e) {
          uint16_t& x = p.v[static_cast<size_t>((t * p.HV + hv) * p.V + e)];
          x = float_to_bf16(std::ldexp(bf16_to_float(x), kHeadScale[hv]));
        }
    const int64_t per_head = p.V * p.K;
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t hv = 0; hv < p.HV; ++hv)
        for (int64_t i = 0; i < per_head; ++i) {
          float& x = p.init_f32[static_cast<size_t>((n * p.HV + hv) * per_head + i)];
          x = std::ldexp(x, kHeadScale[hv]);
        }
    force_segments(8, kOutputsBySuperposition);
    const RunResult a = run_cuda(base);
    const RunResult b = run_cuda(p);
    ASSERT_TRUE(a.status.ok()) << a.status.message;
    ASSERT_TRUE(b.status.ok()) << b.status.message;
    for (int64_t hv = 0; hv < p.HV; ++hv) {
      int64_t differ = 0;
      double diff2 = 0, ref2 = 0;
      auto compare = [&](float got, float unscaled) {
        const double want = std::ldexp(static_cast<double>(unscaled), kHeadScale[hv]);
        differ += static_cast<double>(got) != want;
        diff2 += (got - want) * (got - want);
        ref2 += want * want;
      };
      for (int64_t t = 0; t < p.tokens(); ++t)
        for (int64_t e = 0; e < p.V; ++e) {
          const size_t i = static_cast<size_t>((t * p.HV + hv) * p.V + e);
          compare(b.out[i], a.out[i]);
        }
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t i = 0; i < per_head; ++i) {
          const size_t j = static_cast<size_t>((n * p.HV + hv) * per_head + i);
          compare(b.final_state[j], a.final_state[j]);
        }
      const std::string label = "K=" + std::to_string(head_dim) + " value head " + std::to_string(hv) +
                                " at 2^" + std::to_string(kHeadScale[hv]);
      if (kHeadScale[hv] >= 0)
        EXPECT_EQ(differ, 0) << label;
      else
        EXPECT_LE(std::sqrt(diff2 / ref2), 1e-6) << label;
    }
  }
}

// The two calls of a context-parallel forward (ForwardArgs::summaries_M, then
// resume_from_summaries), with one segment per sequence and with many: the
// summaries against the CPU oracle's segment_summaries of the whole sequences
// (slow decay, so that M carries the state through and a wrong M shows), and
// the resumed forward against the float64 oracle.
class GpuSplitCalls : public GpuSegmentScan, public ::testing::WithParamInterface<SegAndDim> {};

TEST_P(GpuSplitCalls, SummariesAndResumeMatchTheOracle) {
  const int64_t seg = std::get<0>(GetParam());
  ProblemSpec spec;
  spec.seqlens = {0, 1, 17, 300, 1000, 45};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = std::get<1>(GetParam());
  spec.initial_state = DType::kFP32;
  spec.final_state = DType::kFP32;
  HostProblem p = make_problem(spec, 40 + seg);
  for (auto& g : p.g) g = float_to_bf16(kSlowGate);
  for (auto& x : p.A_log) x = 0.f;
  for (auto& x : p.dt_bias) x = 0.f;
  force_segments(seg);
  SplitSummaries sum;
  const RunResult gpu = run_cuda(p, nullptr, 0, &sum);
  const std::string label = "split calls seg_chunks=" + std::to_string(seg) + " K=" + std::to_string(p.K);
  expect_within_bars(p, errors_of(p, gpu, label.c_str()));
  ASSERT_TRUE(gpu.status.ok());

  std::vector<int64_t> segs;
  for (int64_t n = 0; n < p.N; ++n) {
    segs.push_back(p.cu_seqlens[n]);
    segs.push_back(p.cu_seqlens[n + 1]);
  }
  std::vector<float> M(sum.M.size()), B(sum.B.size());
  SegmentSummaryArgs a;
  a.inputs = p.host_args(nullptr, nullptr);
  a.segments = segs.data();
  a.num_segments = p.N;
  a.M = M.data();
  a.B = B.data();
  const Status st = segment_summaries(a, Backend::kCpuReference);
  ASSERT_TRUE(st.ok()) << st.message;
  const double m_err = rel_rms(sum.M.data(), M.data(), M.size());
  const double b_err = rel_rms(sum.B.data(), B.data(), B.size());
  std::printf("[ errors ] %-40s summaries: M %.3e  B %.3e\n", label.c_str(), m_err, b_err);
  EXPECT_LE(m_err, kStateBar);
  EXPECT_LE(b_err, kStateBar);
}
INSTANTIATE_TEST_SUITE_P(SegChunks, GpuSplitCalls, ::testing::Combine(::testing::Values(-1, 1, 3, 8), kHeadDims),
                         seg_and_dim_name);

// segment_summaries on kCuda: given ranges (whole sequences, inside one, one
// token, empty, overlapping, in any order) from device memory, against the CPU
// oracle's on the same inputs (slow decay, so that M carries the state through),
// at both head dims and with int32 boundaries; a range crossing two sequences is
// refused by name.
TEST_F(GpuSegmentScan, SummariesOfGivenRangesMatchTheCpu) {
  for (const int64_t head_dim : {128, 64}) {
    ProblemSpec spec;
    spec.seqlens = {300, 45, 0, 513};
    spec.heads = 2;
    spec.v_heads = 4;
    spec.head_dim = head_dim;
    HostProblem p = make_problem(spec, 60);
    for (auto& g : p.g) g = float_to_bf16(kSlowGate);
    for (auto& x : p.A_log) x = 0.f;
    for (auto& x : p.dt_bias) x = 0.f;
    const std::vector<int64_t> segs = {0, 300, 17, 200, 300, 301, 345, 345, 345, 858, 400, 700, 299, 300};
    const int64_t S = static_cast<int64_t>(segs.size() / 2);
    const size_t m_elems = static_cast<size_t>(S * p.HV * p.K * p.K), b_elems = static_cast<size_t>(S * p.HV * p.V * p.K);
    std::vector<float> M_ref(m_elems), B_ref(b_elems);
    {
      SegmentSummaryArgs a;
      a.inputs = p.host_args(nullptr, nullptr);
      a.segments = segs.data();
      a.num_segments = S;
      a.M = M_ref.data();
      a.B = B_ref.data();
      const Status st = segment_summaries(a, Backend::kCpuReference);
      ASSERT_TRUE(st.ok()) << st.message;
    }
    DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta);
    DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
    DeviceBuffer<int64_t> cu(p.cu_seqlens), d_segs(segs);
    DeviceBuffer<int32_t> cu32(std::vector<int32_t>(p.cu_seqlens.begin(), p.cu_seqlens.end()));
    for (const bool int32_cu : {false, true}) {
      DeviceBuffer<float> M(m_elems), B(b_elems);
      FKDA_CUDA_CHECK(cudaMemset(M.ptr, 0xFF, m_elems * 4));  // NaN: an element never written fails
      FKDA_CUDA_CHECK(cudaMemset(B.ptr, 0xFF, b_elems * 4));
      SegmentSummaryArgs a;
      a.inputs = p.host_args(nullptr, nullptr);
      a.inputs.q = q.ptr; a.inputs.k = k.ptr; a.inputs.v = v.ptr; a.inputs.g = g.ptr; a.inputs.beta = beta.ptr;
      a.inputs.A_log = A_log.ptr; a.inputs.dt_bias = dt_bias.ptr;
      a.inputs.cu_seqlens = int32_cu ? nullptr : cu.ptr;
      a.inputs.cu_seqlens_int32 = int32_cu ? cu32.ptr : nullptr;
      a.inputs.cu_seqlens_host = nullptr;
      a.segments = d_segs.ptr;
      a.num_segments = S;
      a.M = M.ptr;
      a.B = B.ptr;
      const Status st = segment_summaries(a, Backend::kCuda);
      ASSERT_TRUE(st.ok()) << st.message;
      const std::vector<float> gm = M.to_host(), gb = B.to_host();
      const double m_err = rel_rms(gm.data(), M_ref.data(), m_elems), b_err = rel_rms(gb.data(), B_ref.data(), b_elems);
      std::printf("[ errors ] segment summaries of %lld ranges K=%lld%s: M %.3e  B %.3e\n", static_cast<long long>(S),
                  static_cast<long long>(head_dim), int32_cu ? " (int32 cu_seqlens)" : "", m_err, b_err);
      EXPECT_LE(m_err, kStateBar);
      EXPECT_LE(b_err, kStateBar);
      // The empty range is exactly (I, 0).
      const size_t per_m = static_cast<size_t>(p.HV * p.K * p.K), per_b = static_cast<size_t>(p.HV * p.V * p.K);
      EXPECT_EQ(0, std::memcmp(gm.data() + 3 * per_m, M_ref.data() + 3 * per_m, per_m * 4));
      EXPECT_EQ(0, std::memcmp(gb.data() + 3 * per_b, B_ref.data() + 3 * per_b, per_b * 4));

      // A range across the boundary of sequences 0 and 1: refused, naming the argument.
      const std::vector<int64_t> bad = {290, 310};
      DeviceBuffer<int64_t> d_bad(bad);
      a.segments = d_bad.ptr;
      a.num_segments = 1;
      const Status refused = segment_summaries(a, Backend::kCuda);
      EXPECT_EQ(refused.code, StatusCode::kInvalidArgument) << refused.message;
      EXPECT_NE(refused.message.find("segments: segment 0"), std::string::npos) << refused.message;

      // Device boundaries that break the rules: read on the host and refused by name.
      std::vector<int64_t> bad_cu = p.cu_seqlens;
      bad_cu[2] = bad_cu[1] - 1;
      DeviceBuffer<int64_t> d_bad_cu(bad_cu);
      DeviceBuffer<int32_t> d_bad_cu32(std::vector<int32_t>(bad_cu.begin(), bad_cu.end()));
      a.segments = d_segs.ptr;
      a.num_segments = S;
      a.inputs.cu_seqlens = int32_cu ? nullptr : d_bad_cu.ptr;
      a.inputs.cu_seqlens_int32 = int32_cu ? d_bad_cu32.ptr : nullptr;
      const Status bad_bounds = segment_summaries(a, Backend::kCuda);
      EXPECT_EQ(bad_bounds.code, StatusCode::kInvalidArgument) << bad_bounds.message;
      EXPECT_NE(bad_bounds.message.find("cu_seqlens: expected non-decreasing values"), std::string::npos)
          << bad_bounds.message;
    }
  }
}

// compose_summaries on kCuda against the CPU's float64 composition: the same
// float64 sums rounded to fp32 (they may differ in the last place where the two
// order or fuse them differently), out of place and in place over either input,
// on a stream of its own; shapes from the heads' 64 and 128 to odd ones.
TEST_F(GpuSegmentScan, ComposeSummariesMatchTheCpu) {
  struct Shape { int64_t count, K, V; };
  for (const Shape sh : {Shape{6, 128, 128}, Shape{5, 64, 64}, Shape{3, 40, 72}, Shape{2, 128, 1}, Shape{1, 1, 128}}) {
    const size_t m_elems = static_cast<size_t>(sh.count * sh.K * sh.K), b_elems = static_cast<size_t>(sh.count * sh.V * sh.K);
    std::mt19937_64 rng(static_cast<uint64_t>(sh.K * 1000 + sh.V));
    std::normal_distribution<float> normal(0.f, 1.f);
    auto randn = [&](size_t n, float scale) {
      std::vector<float> x(n);
      for (float& e : x) e = scale * normal(rng);
      return x;
    };
    const float ms = 1.f / std::sqrt(static_cast<float>(sh.K));  // keeps M1·M2 of unit size
    const std::vector<float> M1 = randn(m_elems, ms), M2 = randn(m_elems, ms), B1 = randn(b_elems, 1.f),
                             B2 = randn(b_elems, 1.f);
    std::vector<float> M_ref(m_elems), B_ref(b_elems);
    ComposeSummariesArgs c;
    c.count = sh.count;
    c.head_dim_k = sh.K;
    c.head_dim_v = sh.V;
    c.M1 = M1.data(); c.B1 = B1.data(); c.M2 = M2.data(); c.B2 = B2.data();
    c.M = M_ref.data(); c.B = B_ref.data();
    ASSERT_TRUE(compose_summaries(c, Backend::kCpuReference).ok());

    cudaStream_t stream;
    FKDA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // 0: new outputs; 1: in place of (M1, B1); 2: in place of (M2, B2).
    for (int where = 0; where < 3; ++where) {
      DeviceBuffer<float> dM1(M1), dB1(B1), dM2(M2), dB2(B2), dM(m_elems), dB(b_elems);
      // NaN: an element never written fails. Set on the call's stream: a
      // non-blocking stream does not wait for the legacy one, and a poison still
      // in flight there overwrote the call's results.
      FKDA_CUDA_CHECK(cudaMemsetAsync(dM.ptr, 0xFF, m_elems * 4, stream));
      FKDA_CUDA_CHECK(cudaMemsetAsync(dB.ptr, 0xFF, b_elems * 4, stream));
      ComposeSummariesArgs g = c;
      g.M1 = dM1.ptr; g.B1 = dB1.ptr; g.M2 = dM2.ptr; g.B2 = dB2.ptr;
      g.M = where == 0 ? dM.ptr : where == 1 ? dM1.ptr : dM2.ptr;
      g.B = where == 0 ? dB.ptr : where == 1 ? dB1.ptr : dB2.ptr;
      g.stream = stream;
      const Status st = compose_summaries(g, Backend::kCuda);
      ASSERT_TRUE(st.ok()) << st.message;
      FKDA_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> gm = (where == 0 ? dM : where == 1 ? dM1 : dM2).to_host();
      const std::vector<float> gb = (where == 0 ? dB : where == 1 ? dB1 : dB2).to_host();
      auto worst_ulps = [](const std::vector<float>& x, const std::vector<float>& ref, size_t* differ) {
        double worst = 0;
        *differ = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          if (x[i] == ref[i]) continue;
          ++*differ;
          const double ulp = std::ldexp(1.0, std::ilogb(ref[i]) - 23);
          worst = std::max(worst, std::isfinite(x[i]) ? std::fabs(double(x[i]) - ref[i]) / ulp : 1e30);
        }
        return worst;
      };
      size_t dm = 0, db = 0;
      const double um = worst_ulps(gm, M_ref, &dm), ub = worst_ulps(gb, B_ref, &db);
      std::printf("[ errors ] compose count=%lld K=%lld V=%lld (%s): M %zu of %zu differ (<= %.0f ulp), B %zu of %zu "
                  "(<= %.0f ulp)\n",
                  static_cast<long long>(sh.count), static_cast<long long>(sh.K), static_cast<long long>(sh.V),
                  where == 0 ? "new outputs" : where == 1 ? "in place of 1" : "in place of 2", dm, m_elems, um, db,
                  b_elems, ub);
      EXPECT_LE(um, 1.0);
      EXPECT_LE(ub, 1.0);
    }
    FKDA_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// bf16 states and no initial state through the resume call.
TEST_F(GpuSegmentScan, SplitCallsOtherStates) {
  for (const auto& [in, out] : {std::pair<DType, DType>{DType::kBF16, DType::kBF16}, {DType::kNone, DType::kFP32}}) {
    ProblemSpec spec;
    spec.seqlens = {700, 90};
    spec.heads = 2;
    spec.initial_state = in;
    spec.final_state = out;
    const HostProblem p = make_problem(spec, 50);
    force_segments(4);
    SplitSummaries sum;
    expect_within_bars(p, errors_of(p, run_cuda(p, nullptr, 0, &sum), "split calls, other states"));
  }
}

// The two calls plan their segments from the shapes alone: a summaries call and a
// resume call size the same workspace whether or not each has cu_seqlens_host,
// and the heuristic's plan (nothing forced) gives the oracle's results.
TEST_F(GpuSegmentScan, SplitCallsPlanAloneFromShapes) {
  ProblemSpec spec;
  spec.seqlens = {5000, 37, 2963};
  spec.heads = 2;
  spec.initial_state = DType::kFP32;
  spec.final_state = DType::kFP32;
  const HostProblem p = make_problem(spec, 51);
  // Sizes only: never dereferenced. The outputs get addresses of their own
  // (validate() refuses an output that shares memory with another argument).
  auto fake_at = [](int shift) { return reinterpret_cast<void*>(uintptr_t{1} << shift); };
  void* const fake = fake_at(30);
  ForwardArgs a = p.host_args(fake_at(31), fake_at(32));
  a.q = a.k = a.v = a.g = a.beta = fake;
  a.A_log = a.dt_bias = static_cast<const float*>(fake);
  a.initial_state = fake;
  a.cu_seqlens = static_cast<const int64_t*>(fake);
  a.resume_from_summaries = true;
  ForwardArgs summaries = a;
  summaries.resume_from_summaries = false;
  summaries.out = nullptr;
  summaries.initial_state = summaries.final_state = nullptr;
  summaries.initial_state_dtype = summaries.final_state_dtype = DType::kNone;
  summaries.summaries_M = static_cast<float*>(fake_at(33));
  summaries.summaries_B = static_cast<float*>(fake_at(34));
  size_t sizes[4] = {};
  for (int i = 0; i < 4; ++i) {
    ForwardArgs b = i < 2 ? a : summaries;
    b.cu_seqlens_host = i % 2 == 0 ? p.cu_seqlens.data() : nullptr;
    const Status st = workspace_size(b, Backend::kCuda, &sizes[i]);
    ASSERT_TRUE(st.ok()) << st.message;
  }
  EXPECT_EQ(sizes[0], sizes[1]);
  EXPECT_EQ(sizes[0], sizes[2]);
  EXPECT_EQ(sizes[0], sizes[3]);
  SplitSummaries sum;
  expect_within_bars(p, errors_of(p, run_cuda(p, nullptr, 0, &sum), "split calls, heuristic plan"));
}

#endif  // FLASHKDA_WITH_CUDA

// The composition's staged form: the fewest rows a CTA that keep its grid within
// the SM count, else the register form.
TEST(SegmentPlan, StagedCompositionRows) {
#ifdef FLASHKDA_WITH_CUDA
  constexpr int kH200Sms = 132;
  EXPECT_EQ(sm90::staged_compose_rows(1, 128, kH200Sms), 4);    // H = 1, T = 1M: 32 CTAs
  EXPECT_EQ(sm90::staged_compose_rows(4, 128, kH200Sms), 4);    // 128 CTAs
  EXPECT_EQ(sm90::staged_compose_rows(5, 128, kH200Sms), 8);
  EXPECT_EQ(sm90::staged_compose_rows(12, 128, kH200Sms), 16);  // 96 CTAs
  EXPECT_EQ(sm90::staged_compose_rows(24, 128, kH200Sms), 32);
  EXPECT_EQ(sm90::staged_compose_rows(33, 128, kH200Sms), 32);
  EXPECT_EQ(sm90::staged_compose_rows(34, 128, kH200Sms), 0);
  EXPECT_EQ(sm90::staged_compose_rows(12, 64, kH200Sms), 8);
  EXPECT_EQ(sm90::staged_compose_rows(66, 64, kH200Sms), 32);
  EXPECT_EQ(sm90::staged_compose_rows(67, 64, kH200Sms), 0);
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

// The heuristic (host code, no device needed): one chain per sequence where the
// heads fill the GPU (the standard table), segments where a few long chains
// would bound the call, never fewer than three segments per cut sequence with
// pass 3's chains, and out by superposition where the cost model takes it.
TEST(SegmentPlan, HeuristicChoices) {
#ifdef FLASHKDA_WITH_CUDA
  constexpr int kH200Sms = 132;
  auto plan = [](int64_t seqs, int64_t heads, int64_t chunks_each) {
    sm90::ProblemShape s;
    s.seqs = seqs;
    s.heads = heads;
    s.total_chunks = seqs * chunks_each;
    s.longest_chunks = chunks_each;
    return sm90::choose_launch_plan(s, kH200Sms);
  };
  EXPECT_EQ(plan(1, 96, 512).seg_chunks, 0);
  EXPECT_EQ(plan(1, 64, 512).seg_chunks, 0);
  EXPECT_EQ(plan(8, 64, 64).seg_chunks, 0);
  EXPECT_EQ(plan(8, 96, 64).seg_chunks, 0);
  EXPECT_EQ(plan(1, 12, 64).seg_chunks, 0);   // T = 1024: too short to gain
  EXPECT_EQ(plan(4, 12, 512).seg_chunks, 0);  // 4 x 8192: pass 1 would not fit one wave
  EXPECT_EQ(plan(1, 48, 512).seg_chunks, 0);
  // V split: one 8-warp CTA a chain where each gets an SM of its own (96
  // chains) or where there are at least three chains an SM of at least 16
  // chunks on average; two 4-warp CTAs where the halves fit one an SM (64
  // chains), between one and three chains an SM (the smaller CTAs fill the
  // last wave better) and on short sequences (the set-up is most of a CTA).
  for (const auto& [seqs, heads, chunks, v_split] :
       {std::tuple<int64_t, int64_t, int64_t, int>{1, 96, 512, 1}, {1, 64, 512, 2}, {8, 96, 64, 1}, {8, 64, 64, 1},
        {6, 64, 86, 2}, {3, 48, 128, 2}, {3, 64, 128, 2}, {3, 132, 128, 1}, {3, 131, 128, 2}, {32, 96, 16, 1},
        {32, 96, 15, 2}, {64, 96, 8, 2}, {512, 16, 1, 2}}) {
    const sm90::LaunchPlan p = plan(seqs, heads, chunks);
    EXPECT_EQ(p.v_split, v_split) << seqs << " x " << heads << " chains";
    if (p.v_split == 1) EXPECT_EQ(p.stages, 4);
  }
  for (const auto& [seqs, heads, chunks] : {std::tuple<int64_t, int64_t, int64_t>{1, 12, 512}, {1, 12, 2048},
                                            {1, 24, 512}, {1, 1, 65536}}) {
    const sm90::LaunchPlan p = plan(seqs, heads, chunks);
    EXPECT_GT(p.seg_chunks, 0) << heads << " heads, " << chunks << " chunks";
    if (p.seg_chunks > 0) EXPECT_GE((chunks + p.seg_chunks - 1) / p.seg_chunks, 3);
    EXPECT_EQ(p.v_split, 2);
  }
  // Pass 1 of H = 12, T = 8192 fits one wave of two CTAs per SM.
  const int64_t seg = plan(1, 12, 512).seg_chunks;
  const int64_t segments = (512 + seg - 1) / seg;
  EXPECT_LE(12 * (4 * segments - 6), 2 * kH200Sms);
  // K = 64: one 4-warp CTA per state (R = 1), two per segment in pass 1: about
  // twice the segments, and pass 1 still within one wave.
  sm90::ProblemShape s64;
  s64.seqs = 1;
  s64.heads = 12;
  s64.total_chunks = s64.longest_chunks = 512;
  s64.row_parts = 1;
  const int64_t seg64 = sm90::choose_launch_plan(s64, kH200Sms).seg_chunks;
  ASSERT_GT(seg64, 0);
  const int64_t segments64 = (512 + seg64 - 1) / seg64;
  EXPECT_GT(segments64, segments);
  EXPECT_LE(12 * (2 * segments64 - 3), 2 * kH200Sms);
  // Outputs by superposition (no checkpoints): pass 1 summarises every segment but
  // runs the first for real, heads · (2R·G − R) CTAs within one wave; taken where
  // the cost model says it saves a tenth of the chains' chain (12 heads, and one
  // or two on T = 1M), not at 24 heads (a segment fewer in a shorter chain, and
  // the output kernel's traffic: measured level or slower).
  auto superposed = [](int64_t seqs, int64_t heads, int64_t chunks_each, int64_t row_parts) {
    sm90::ProblemShape s;
    s.seqs = seqs;
    s.heads = heads;
    s.total_chunks = seqs * chunks_each;
    s.longest_chunks = chunks_each;
    s.row_parts = row_parts;
    s.superposable = true;
    return sm90::choose_launch_plan(s, kH200Sms);
  };
  EXPECT_EQ(superposed(1, 96, 512, 2).seg_chunks, 0);
  EXPECT_EQ(superposed(1, 48, 512, 2).seg_chunks, 0);
  EXPECT_EQ(superposed(4, 12, 512, 2).seg_chunks, 0);
  EXPECT_EQ(superposed(1, 12, 64, 2).seg_chunks, 0);  // T = 1024: not cut, as without superposition
  for (const auto& [heads, chunks, r, want] :
       {std::tuple<int64_t, int64_t, int64_t, bool>{12, 512, 2, true}, {24, 512, 2, false}, {12, 2048, 2, true},
        {24, 2048, 2, false},
        {1, 65536, 2, true}, {2, 65536, 2, true}, {1, 65536, 1, true}}) {
    const sm90::LaunchPlan p = superposed(1, heads, chunks, r);
    ASSERT_GT(p.seg_chunks, 0) << heads << " heads, " << chunks << " chunks";
    EXPECT_EQ(p.superposed_outputs, want) << heads << " heads, " << chunks << " chunks";
    const int64_t g = (chunks + p.seg_chunks - 1) / p.seg_chunks;
    if (p.superposed_outputs) EXPECT_LE(heads * (2 * r * g - r), 2 * kH200Sms) << heads << " heads, " << chunks;
    sm90::ProblemShape chains;
    chains.seqs = 1;
    chains.heads = heads;
    chains.total_chunks = chains.longest_chunks = chunks;
    chains.row_parts = r;
    if (!p.superposed_outputs) EXPECT_EQ(p.seg_chunks, sm90::choose_launch_plan(chains, kH200Sms).seg_chunks);
  }
  EXPECT_FALSE(plan(1, 12, 512).superposed_outputs);  // a call with checkpoints: pass 3 by chains
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

// A serving batch with known lengths: one long prefill among short sequences.
// Pass 1's CTAs of the cut sequences stay within one wave (the short ones run
// whole beside them); where no cut of the longest into enough segments fits,
// the batch runs in one pass.
TEST(SegmentPlan, MixedBatchesKeepTheCutSequencesInOneWave) {
#ifdef FLASHKDA_WITH_CUDA
  constexpr int kH200Sms = 132;
  constexpr int64_t kWave = 2 * kH200Sms;
  for (const bool superposable : {false, true})
    for (const int64_t heads : {12, 24, 48})
      for (const std::vector<int64_t>& tokens :
           {std::vector<int64_t>{8000, 64, 64, 64}, {8000, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64},
            {4000, 256, 256, 256, 256}, {4096, 4096, 256, 256, 256, 256, 256, 256, 256, 256},
            {64, 64, 30000, 100, 100, 100}}) {
        std::vector<int64_t> cu = {0};
        for (int64_t t : tokens) cu.push_back(cu.back() + t);
        sm90::ProblemShape s;
        s.seqs = static_cast<int64_t>(tokens.size());
        s.heads = heads;
        s.superposable = superposable;
        s.cu_seqlens_host = cu.data();
        s.longest_chunks = 0;
        for (int64_t t : tokens) {
          s.total_chunks += (t + 15) / 16;
          s.longest_chunks = std::max(s.longest_chunks, (t + 15) / 16);
        }
        const sm90::LaunchPlan p = sm90::choose_launch_plan(s, kH200Sms);
        SCOPED_TRACE(std::to_string(heads) + " heads, " + std::to_string(tokens.size()) + " sequences" +
                     (superposable ? ", superposable" : ""));
        if (p.seg_chunks == 0) continue;
        const int64_t r = s.row_parts, saving = p.superposed_outputs ? 1 : 3;
        int64_t cut = 0;
        for (int64_t t : tokens) {
          const int64_t c = (t + 15) / 16, g = (c + p.seg_chunks - 1) / p.seg_chunks;
          if (g > 1) cut += heads * (2 * r * g - saving * r);
        }
        EXPECT_LE(cut, kWave);
        EXPECT_GE((s.longest_chunks + p.seg_chunks - 1) / p.seg_chunks, p.superposed_outputs ? 2 : 3);
      }
  // Measured (docs/perf-log.md): 48 heads with one 8000-token sequence among
  // three of 64 ran faster in one pass; 12 and 24 heads faster split.
  auto mixed = [](int64_t heads) {
    static const int64_t cu[] = {0, 8000, 8064, 8128, 8192};
    sm90::ProblemShape s;
    s.seqs = 4;
    s.heads = heads;
    s.cu_seqlens_host = cu;
    s.total_chunks = 500 + 3 * 4;
    s.longest_chunks = 500;
    return sm90::choose_launch_plan(s, kH200Sms);
  };
  EXPECT_GT(mixed(12).seg_chunks, 0);
  EXPECT_GT(mixed(24).seg_chunks, 0);
  EXPECT_EQ(mixed(48).seg_chunks, 0);
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}


// The cost model (segment_plan.h, cut_pays): a batch whose short sequences
// already fill the GPU beside its long one runs in one pass; where the long
// chain bounds the call, the cut stays. The rows measured on the H200 with the
// host's lengths (docs/perf-log.md), and the device's choice for the same
// lengths (device_plan_pieces) alike.
TEST(SegmentPlan, CutOnlyWhereItPays) {
#ifdef FLASHKDA_WITH_CUDA
  constexpr int kH200Sms = 132;
  struct Row {
    int64_t heads;
    std::vector<int64_t> tokens;
    bool cut;
  };
  auto batch = [](int64_t first, int64_t n, int64_t len) {
    std::vector<int64_t> t = {first};
    t.insert(t.end(), n, len);
    return t;
  };
  const Row rows[] = {
      // one pass measured faster: 0.173 / 0.257 / 0.355 ms against 0.19 / 0.32 / 0.41 cut
      {12, batch(2000, 63, 64), false},
      {24, batch(2000, 63, 64), false},
      {24, batch(4000, 60, 64), false},
      // the model's tie (cut 185 steps against 188): one pass measured 0.260 ms, cut 0.285
      {12, [] { std::vector<int64_t> t = {3000, 3000, 3000}; t.insert(t.end(), 40, 64); return t; }(), false},
      // the cut measured faster: 0.237 / 0.262 / 0.200 / 0.407 / 1.458 ms against
      // 0.263 / 0.409 / 0.211 / 0.459 / 1.729 in one pass
      {12, batch(4000, 60, 64), true},
      {12, batch(8000, 15, 64), true},
      {12, {1300, 547, 2048, 963, 271, 3063}, true},
      {24, batch(8000, 3, 64), true},
      {24, batch(30000, 20, 100), true},
      // the tensor-parallel table's single sequences
      {12, {8192}, true},
      {12, {32768}, true},
      {24, {8192}, true},
      {1, {1 << 20}, true},
  };
  for (const Row& row : rows) {
    std::vector<int64_t> cu = {0};
    for (int64_t t : row.tokens) cu.push_back(cu.back() + t);
    sm90::ProblemShape s;
    s.seqs = static_cast<int64_t>(row.tokens.size());
    s.heads = row.heads;
    s.superposable = true;
    s.cu_seqlens_host = s.seqs > 1 ? cu.data() : nullptr;
    s.longest_chunks = 0;
    for (int64_t t : row.tokens) {
      s.total_chunks += (t + 15) / 16;
      s.longest_chunks = std::max(s.longest_chunks, (t + 15) / 16);
    }
    SCOPED_TRACE(std::to_string(row.heads) + " heads, " + std::to_string(row.tokens.size()) + " sequences, the first " +
                 std::to_string(row.tokens[0]) + " tokens");
    const sm90::LaunchPlan p = sm90::choose_launch_plan(s, kH200Sms);
    EXPECT_EQ(p.seg_chunks > 0, row.cut);
    if (s.seqs > 1) {
      // The device's choice from pieces of the finest plan (one sequence holding every token).
      sm90::ProblemShape skewed = s;
      skewed.skewed = true;
      skewed.cu_seqlens_host = nullptr;
      skewed.longest_chunks = s.total_chunks;
      const sm90::LaunchPlan finest = sm90::choose_launch_plan(skewed, kH200Sms);
      ASSERT_GT(finest.seg_chunks, 0);
      const int32_t pieces = sm90::device_plan_pieces(s, finest.superposed_outputs, finest.seg_chunks, kH200Sms);
      if (!row.cut) EXPECT_EQ(pieces, sm90::kWholeSequences);
    }
  }
  // The model itself: one chain of 500 steps alone, cut into 100-step segments
  // (~100 + the composition + the output kernel's ~4), pays; 4,000 sequences of
  // 4 chunks beside it (~1,100 steps of CTAs spread over the wave either way)
  // do not.
  sm90::SegmentRule r;
  r.heads = 12;
  r.row_parts = 2;
  r.wave = 2 * kH200Sms;
  r.seqs = 1;
  r.total_chunks = r.longest = 500;
  auto one = [](const auto& f) { return f(int64_t{500}); };
  EXPECT_TRUE(sm90::cut_pays(r, 100, true, one));
  EXPECT_TRUE(sm90::cut_pays(r, 100, false, one));
  EXPECT_FALSE(sm90::cut_pays(r, 0, true, one));
  r.seqs = 4001;
  r.total_chunks = 500 + 4000 * 4;
  auto many = [](const auto& f) { return f(int64_t{500}) + 4000 * f(int64_t{4}); };
  EXPECT_FALSE(sm90::cut_pays(r, 100, true, many));
  EXPECT_FALSE(sm90::cut_pays(r, 100, false, many));
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

// Lengths only on the device (varlen without cu_seqlens_host, as engines call):
// where one sequence holding every token would be cut, the plan launches the
// segment scan for those finest pieces and leaves the segments to the device;
// where even that cuts nothing (many heads), and where the host has the
// lengths, it is the heuristic's plan for the shape.
TEST(SegmentPlan, UnknownLengthsLeaveTheSegmentsToTheDevice) {
#ifdef FLASHKDA_WITH_CUDA
  constexpr int kH200Sms = 132;
  static const int64_t kCu[] = {0, 8000, 8064, 8128, 8192, 8256};  // read by no call below
  auto args = [](int64_t heads, int64_t seqs, bool host) {
    ForwardArgs a;
    a.batch = 1;
    a.seqlen = kCu[seqs];
    a.num_heads = a.num_v_heads = heads;
    a.head_dim_k = a.head_dim_v = 128;
    a.cu_seqlens = kCu;
    a.cu_seqlens_host = host ? kCu : nullptr;
    a.num_seqs = seqs;
    return a;
  };
  for (const int64_t heads : {1, 4, 12, 24}) {
    SCOPED_TRACE(std::to_string(heads) + " heads");
    sm90::LaunchPlan plan;
    ASSERT_TRUE(sm90::launch_plan_for(args(heads, 5, false), kH200Sms, &plan).ok());
    EXPECT_TRUE(plan.device_segments);
    EXPECT_TRUE(plan.listed_segments);
    sm90::ProblemShape skewed = sm90::problem_shape(args(heads, 5, false));
    skewed.skewed = true;
    skewed.longest_chunks = skewed.total_chunks;
    const sm90::LaunchPlan finest = sm90::choose_launch_plan(skewed, kH200Sms);
    EXPECT_EQ(plan.seg_chunks, finest.seg_chunks);
    EXPECT_EQ(plan.superposed_outputs, finest.superposed_outputs);
    ASSERT_TRUE(sm90::launch_plan_for(args(heads, 5, true), kH200Sms, &plan).ok());
    EXPECT_FALSE(plan.device_segments);
    EXPECT_EQ(plan.listed_segments, plan.seg_chunks > 0) << "the host's segments of several sequences, listed";
  }
  sm90::LaunchPlan plan;
  ASSERT_TRUE(sm90::launch_plan_for(args(96, 5, false), kH200Sms, &plan).ok());
  EXPECT_FALSE(plan.device_segments);
  EXPECT_EQ(plan.seg_chunks, 0);
  EXPECT_FALSE(plan.listed_segments);
  ASSERT_TRUE(sm90::launch_plan_for(args(12, 1, false), kH200Sms, &plan).ok());  // one sequence: its length is T
  EXPECT_FALSE(plan.device_segments);
  EXPECT_FALSE(plan.listed_segments) << "one sequence: segment slots, no lists";
  // The device's count of pieces: the fewest that cover the rule's segment, one
  // at least, and "whole" where the rule cuts nothing.
  EXPECT_EQ(sm90::pieces_per_segment(0, 40), sm90::kWholeSequences);
  EXPECT_EQ(sm90::pieces_per_segment(40, 40), 1);
  EXPECT_EQ(sm90::pieces_per_segment(41, 40), 2);
  EXPECT_EQ(sm90::pieces_per_segment(39, 40), 1);
  // ... and "whole" unless the longest still gets as many whole segments as
  // the kind needs to gain: three by chains, two superposed.
  EXPECT_EQ(sm90::device_segment_pieces(84, 41, 250, false), sm90::kWholeSequences);  // 123 + 123 + 4
  EXPECT_EQ(sm90::device_segment_pieces(84, 41, 250, true), 3);
  EXPECT_EQ(sm90::device_segment_pieces(84, 41, 369, false), 3);
  EXPECT_EQ(sm90::device_segment_pieces(84, 41, 368, false), sm90::kWholeSequences);
  EXPECT_EQ(sm90::device_segment_pieces(80, 40, 160, true), 2);
  EXPECT_EQ(sm90::device_segment_pieces(80, 40, 159, true), sm90::kWholeSequences);
  EXPECT_EQ(sm90::device_segment_pieces(0, 40, 1000, true), sm90::kWholeSequences);
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

// The room of the plan's lists (segment_list_room), which sizes the grids that
// read them, holds whatever the set-up CTA writes. For random varlen batches
// (skewed, equal, sparse, just past whole chunks; K = 128 and 64; 1 to 32 heads)
// the lists are counted as plan_segments_on_device counts them: without host
// lengths for any count of pieces a segment the device may choose, and there the
// later segments' pieces (the output kernel's entries), the later segments and
// the composed sequences stay within the room, itself within the segment slots
// (the grids' limit); with the host's lengths the room is the count.
TEST(SegmentPlan, ListsFitTheirRoomForAnyLengths) {
#ifdef FLASHKDA_WITH_CUDA
  constexpr int kH200Sms = 132;
  constexpr int64_t kChunk = 16;  // tokens a chunk (shared_storage.cuh)
  std::mt19937_64 rng(20261201);
  int device_plans = 0, host_plans = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t n = 2 + static_cast<int64_t>(rng() % 200);
    std::vector<int64_t> cu{0};
    for (int64_t i = 0; i < n; ++i) {
      int64_t len = 0;
      switch (trial % 4) {
        case 0: len = i == 0 ? 1 + static_cast<int64_t>(rng() % 200000) : static_cast<int64_t>(rng() % 300); break;
        case 1: len = 1 + static_cast<int64_t>(rng() % 4000); break;
        case 2: len = rng() % 3 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 70000); break;
        default: len = 16 * (1 + static_cast<int64_t>(rng() % 400)) + static_cast<int64_t>(rng() % 2); break;
      }
      cu.push_back(cu.back() + len);
    }
    if (cu.back() == 0) continue;
    ForwardArgs a;
    a.batch = 1;
    a.seqlen = cu.back();
    a.num_heads = a.num_v_heads = int64_t{1} << (rng() % 6);
    a.head_dim_k = a.head_dim_v = rng() % 2 == 0 ? 128 : 64;
    a.cu_seqlens = cu.data();
    a.num_seqs = n;
    for (const bool host : {false, true}) {
      a.cu_seqlens_host = host ? cu.data() : nullptr;
      sm90::LaunchPlan plan;
      ASSERT_TRUE(sm90::launch_plan_for(a, kH200Sms, &plan).ok());
      if (!plan.listed_segments) continue;
      ++(host ? host_plans : device_plans);
      ASSERT_EQ(plan.device_segments, !host);
      const sm90::ListRoom room = sm90::segment_list_room(a, plan);
      const int64_t piece = plan.seg_chunks, min_composed = plan.superposed_outputs ? 2 : 3;
      const int64_t slots = n + (a.seqlen + kChunk * piece - 1) / (kChunk * piece);
      EXPECT_LE(room.later, slots) << "trial " << trial;
      const std::vector<int64_t> pieces = host ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 3, 5, 8, 13, 64, 1 << 20};
      for (const int64_t m : pieces) {
        const int64_t seg = piece * m;
        int64_t later = 0, cut = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t c = (cu[i + 1] - cu[i] + kChunk - 1) / kChunk;
          const int64_t count = c > seg ? (c + seg - 1) / seg : 1;
          later += count - 1;
          cut += count >= min_composed ? 1 : 0;
        }
        const std::string at = "trial " + std::to_string(trial) + (host ? " host" : " device") + ", " +
                               std::to_string(m) + " pieces of " + std::to_string(piece);
        EXPECT_LE(later * m, room.later) << at << ": the output kernel's entries";
        EXPECT_LE(cut, room.cut) << at << ": the composed sequences";
        if (host) {
          EXPECT_EQ(room.later, std::max<int64_t>(1, later)) << at;
          EXPECT_EQ(room.cut, std::max<int64_t>(1, cut)) << at;
        }
      }
    }
  }
  EXPECT_GT(device_plans, 500);
  EXPECT_GT(host_plans, 500);
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

}  // namespace
}  // namespace flashkda::testing
