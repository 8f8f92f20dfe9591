// Checkpoints on the CUDA forward (spec section 7; label "gpu"): every c tokens
// (key-major as fla's `h`, or value-major; fp32 or bf16) and into pool slots
// (vLLM's "align" mode), against the float64 oracle's own checkpoints, one chain
// and through the segment scan; writing them leaves out and the final state
// bitwise unchanged; invalid slot checkpoints are skipped and reported.
// Skips, saying why, without a CUDA build or an sm_90 device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include "common/bf16.h"
#include "sm90/sm90_forward.h"
#endif

namespace flashkda::testing {
namespace {

#ifdef FLASHKDA_WITH_CUDA

const std::vector<int64_t> kSeqlens = {37, 0, 300, 21, 130, 64};

struct CkCase {
  DType dtype;
  bool value_major;
  int64_t interval;
  int64_t seg_chunks;  // forced plan: -1 one chain, > 0 segments
  int64_t head_dim = 128;
  int v_split = 0;  // forced plan: 0 the heuristic's, 1 one 8-warp CTA a head, 2 two 4-warp CTAs
  int records = 0;  // forced 4-warp record loads: 0 the heuristic's, 1 cp.async, 2 bulk copy
  int storer = 0;   // forced entry storer (bulk records): 0 the heuristic's, 1 without, 2 with
  std::string name() const {
    return std::string(dtype == DType::kFP32 ? "fp32" : "bf16") + (value_major ? "_vk" : "_kv") + "_c" +
           std::to_string(interval) + (seg_chunks < 0 ? "_chain" : "_seg" + std::to_string(seg_chunks)) +
           (head_dim == 128 ? "" : "_K" + std::to_string(head_dim)) +
           (v_split == 0 ? "" : "_vsplit" + std::to_string(v_split)) +
           (records == 1 ? "_cp_async" : records == 2 ? "_bulk_copy" : "") +
           (storer == 1 ? "_no_storer" : storer == 2 ? "_storer" : "");
  }
};

std::vector<float> as_float(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<float> f(bytes.size() / (t == DType::kFP32 ? 4 : 2));
  for (size_t i = 0; i < f.size(); ++i) {
    if (t == DType::kFP32) std::memcpy(&f[i], bytes.data() + 4 * i, 4);
    else {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      f[i] = bf16_to_float(b);
    }
  }
  return f;
}

class GpuCheckpoints : public ::testing::TestWithParam<CkCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

// Case c on sequences of the given lengths (H = 2, HV = 4); int32_cu: the
// boundaries as cu_seqlens_int32 without a host copy, as engines pass them.
void expect_checkpoints_match(const CkCase& c, const std::vector<int64_t>& seqlens, uint64_t seed,
                              bool int32_cu = false) {
  ProblemSpec spec;
  spec.seqlens = seqlens;
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = c.head_dim;
  const HostProblem p = make_problem(spec, seed);
  int64_t entries = 0;
  for (int64_t L : seqlens) entries += (L + c.interval - 1) / c.interval;
  const size_t esize = c.dtype == DType::kFP32 ? 4 : 2;
  const size_t ck_bytes = static_cast<size_t>(entries * p.HV * p.K * p.V) * esize;

  // The oracle's checkpoints (float64 steps, then the dtype's rounding).
  std::vector<uint8_t> ref_ck(ck_bytes);
  {
    std::vector<uint16_t> out(p.out_elems());
    std::vector<float> fin(p.state_elems());
    ForwardArgs a = p.host_args(out.data(), fin.data());
    a.checkpoints = ref_ck.data();
    a.checkpoints_dtype = c.dtype;
    a.checkpoint_interval = c.interval;
    a.checkpoints_capacity = entries;
    a.checkpoints_value_major = c.value_major;
    const Status s = forward(a, Backend::kCpuReference, nullptr, 0, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
  }

  // The plain call on the plan the checkpoints force (a segment scan's out by
  // chains, not by superposition, which rounds differently): the same bits.
  sm90::LaunchOverride same_plan = {c.v_split, 0, c.seg_chunks, c.records};
  same_plan.outputs = 1;
  same_plan.entry_storer = c.storer;
  sm90::set_launch_override(same_plan);
  const RunResult plain = run_cuda(p);
  ASSERT_TRUE(plain.status.ok()) << plain.status.message;
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(p.out_elems());
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias), init(p.init_f32), fin(p.state_elems());
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  DeviceBuffer<int32_t> cu32(std::vector<int32_t>(p.cu_seqlens.begin(), p.cu_seqlens.end()));
  GuardedDeviceBuffer ck(ck_bytes);
  ForwardArgs a = p.host_args(out.ptr, fin.ptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr; a.initial_state = init.ptr;
  a.cu_seqlens = int32_cu ? nullptr : cu.ptr;
  a.cu_seqlens_int32 = int32_cu ? cu32.ptr : nullptr;
  a.cu_seqlens_host = int32_cu ? nullptr : p.cu_seqlens.data();
  a.checkpoints = ck.data();
  a.checkpoints_dtype = c.dtype;
  a.checkpoint_interval = c.interval;
  a.checkpoints_capacity = entries;
  a.checkpoints_value_major = c.value_major;
  const Status s = run_forward(a);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(ck.damaged(), 0u) << "checkpoints' guard bands were written";
  EXPECT_EQ(out.to_host(), plain.out_bits) << "checkpoints changed out";
  const std::vector<float> f = fin.to_host();
  EXPECT_EQ(0, std::memcmp(f.data(), plain.state_bytes.data(), plain.state_bytes.size()))
      << "checkpoints changed the final state";
  std::vector<uint8_t> got(ck_bytes);
  FKDA_CUDA_CHECK(cudaMemcpy(got.data(), ck.data(), ck_bytes, cudaMemcpyDeviceToHost));
  const std::vector<float> gf = as_float(got, c.dtype), rf = as_float(ref_ck, c.dtype);
  const double e = rel_rms(gf.data(), rf.data(), rf.size());
  std::printf("[ errors ] checkpoints %-22s %lld entries: %.3e\n", c.name().c_str(), static_cast<long long>(entries), e);
  EXPECT_LE(e, c.dtype == DType::kFP32 ? kStateBar : kBf16StateBar);
  // Entry by entry too: a missing or misplaced entry must not hide in the average.
  const size_t per_entry = static_cast<size_t>(p.HV * p.K * p.V);
  for (int64_t i = 0; i < entries; ++i) {
    const double ei = rel_rms(gf.data() + i * per_entry, rf.data() + i * per_entry, per_entry);
    EXPECT_LE(ei, 2 * (c.dtype == DType::kFP32 ? kStateBar : kBf16StateBar)) << "entry " << i;
  }
}

TEST_P(GpuCheckpoints, MatchTheOracleAndLeaveTheResultAlone) { expect_checkpoints_match(GetParam(), kSeqlens, 81); }

// A checkpoint call of case c on the device with fp32 states `init` (value-major,
// or key-major with states_key_major): out's bits, the final state's and the entries'.
struct CkRun {
  std::vector<uint16_t> out;
  std::vector<float> fin;
  std::vector<uint8_t> ck;
};
CkRun run_checkpoint_call(const HostProblem& p, const CkCase& c, int64_t entries, const std::vector<float>& init,
                          bool states_key_major) {
  const size_t ck_bytes = static_cast<size_t>(entries * p.HV * p.K * p.V) * (c.dtype == DType::kFP32 ? 4 : 2);
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(p.out_elems());
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias), s0(init), fin(p.state_elems());
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  GuardedDeviceBuffer ck(ck_bytes);
  ForwardArgs a = p.host_args(out.ptr, fin.ptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr; a.initial_state = s0.ptr;
  a.cu_seqlens = cu.ptr;
  a.states_key_major = states_key_major;
  a.checkpoints = ck.data();
  a.checkpoints_dtype = c.dtype;
  a.checkpoint_interval = c.interval;
  a.checkpoints_capacity = entries;
  a.checkpoints_value_major = c.value_major;
  CkRun r;
  const Status st = run_forward(a);
  EXPECT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(ck.damaged(), 0u);
  r.out = out.to_host();
  r.fin = fin.to_host();
  r.ck.resize(ck_bytes);
  FKDA_CUDA_CHECK(cudaMemcpy(r.ck.data(), ck.data(), ck_bytes, cudaMemcpyDeviceToHost));
  return r;
}

// Key-major states (ForwardArgs::states_key_major) in the checkpoint variants of the
// recurrence, whose chunk loop holds the stops: the same out and entries, and the
// final state transposed, as the call on value-major states, in each CTA shape and
// record path, one chain and segments, K = 128 and 64.
TEST_F(GpuCheckpoints, KeyMajorStatesAreTheValueMajorCallTransposed) {
  for (const CkCase& c : {CkCase{DType::kBF16, false, 64, -1, 128, 1}, CkCase{DType::kBF16, false, 64, -1, 128, 2, 1},
                          CkCase{DType::kBF16, false, 64, -1, 128, 2, 2}, CkCase{DType::kFP32, true, 16, 3},
                          CkCase{DType::kBF16, false, 64, -1, 64}}) {
    SCOPED_TRACE(c.name());
    ProblemSpec spec;
    spec.seqlens = kSeqlens;
    spec.heads = 2;
    spec.v_heads = 4;
    spec.head_dim = c.head_dim;
    const HostProblem p = make_problem(spec, 84);
    int64_t entries = 0;
    for (int64_t L : kSeqlens) entries += (L + c.interval - 1) / c.interval;
    sm90::LaunchOverride plan = {c.v_split, 0, c.seg_chunks, c.records};
    plan.outputs = 1;
    sm90::set_launch_override(plan);
    const int64_t blocks = p.N * p.HV;
    const CkRun vm = run_checkpoint_call(p, c, entries, p.init_f32, false);
    const CkRun km = run_checkpoint_call(p, c, entries, transpose_blocks(p.init_f32, blocks, p.V, p.K), true);
    EXPECT_EQ(vm.out, km.out);
    EXPECT_EQ(transpose_blocks(vm.fin, blocks, p.V, p.K), km.fin);
    EXPECT_EQ(vm.ck, km.ck);
  }
}

// An engine's prefill batch: many short sequences, empty ones among them, one
// chain and through the segment scan. Each sequence's first entry comes from a
// table the prologue's set-up CTA sums (checkpoints.cuh).
TEST_F(GpuCheckpoints, ManySequences) {
  std::vector<int64_t> seqlens;
  for (int i = 0; i < 75; ++i) seqlens.push_back(i % 9 == 4 ? 0 : 1 + (i * 37) % 150);
  seqlens.push_back(700);
  for (const CkCase& c : {CkCase{DType::kBF16, false, 64, -1}, CkCase{DType::kFP32, true, 16, -1},
                          CkCase{DType::kBF16, false, 32, 3}, CkCase{DType::kBF16, false, 16, -1, 64}}) {
    SCOPED_TRACE(c.name());
    expect_checkpoints_match(c, seqlens, 82);
  }
}

// More sequences than the set-up CTA sums in one pass (kEntriesPerThread x its
// threads = 1,024): the running total between passes, a power-of-two interval (a shift)
// and another (a division), int64 and int32 boundaries.
TEST_F(GpuCheckpoints, MoreSequencesThanOneSetupPass) {
  std::vector<int64_t> seqlens;
  for (int i = 0; i < 1100; ++i) seqlens.push_back(i % 13 == 5 ? 0 : 1 + (i * 53) % 100);
  seqlens[1030] = 300;
  for (const bool int32_cu : {false, true})
    for (const CkCase& c : {CkCase{DType::kBF16, false, 64, -1}, CkCase{DType::kBF16, false, 48, 3}}) {
      SCOPED_TRACE(c.name() + (int32_cu ? " cu_seqlens_int32" : ""));
      expect_checkpoints_match(c, seqlens, 83, int32_cu);
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuCheckpoints,
                         ::testing::Values(CkCase{DType::kBF16, false, 64, -1}, CkCase{DType::kFP32, false, 64, -1},
                                           CkCase{DType::kFP32, true, 16, -1}, CkCase{DType::kBF16, true, 32, -1},
                                           CkCase{DType::kBF16, false, 64, 3}, CkCase{DType::kFP32, true, 16, 2},
                                           CkCase{DType::kFP32, false, 48, 5}, CkCase{DType::kBF16, false, 64, -1, 64},
                                           CkCase{DType::kFP32, true, 16, -1, 64}, CkCase{DType::kFP32, false, 64, 3, 64},
                                           CkCase{DType::kBF16, true, 32, 2, 64},
                                           // bf16 key-major entries (transposed in registers): a stop
                                           // every chunk, both CTA shapes, segments
                                           CkCase{DType::kBF16, false, 16, -1, 128, 1}, CkCase{DType::kBF16, false, 16, -1, 128, 2},
                                           CkCase{DType::kBF16, false, 64, -1, 128, 1}, CkCase{DType::kBF16, false, 16, 3},
                                           CkCase{DType::kBF16, false, 16, 2, 64},
                                           // 4-warp CTAs with records by bulk copy (the heuristic's
                                           // choice where CTAs share SMs, larger than these)
                                           CkCase{DType::kBF16, false, 16, -1, 128, 2, 2},
                                           CkCase{DType::kFP32, true, 16, -1, 128, 2, 2},
                                           CkCase{DType::kBF16, false, 64, 3, 128, 0, 2},
                                           // bf16 key-major entries by the entry storer (these lengths
                                           // average under 16 chunks: the heuristic would not take it),
                                           // and without it on the long rows' plans: a stop every chunk
                                           // (the stage reused at once), every 64 tokens, segments
                                           CkCase{DType::kBF16, false, 16, -1, 128, 1, 0, 2},
                                           CkCase{DType::kBF16, false, 64, -1, 128, 1, 0, 2},
                                           CkCase{DType::kBF16, false, 16, -1, 128, 2, 2, 2},
                                           CkCase{DType::kBF16, false, 64, -1, 128, 2, 2, 2},
                                           CkCase{DType::kBF16, false, 16, 3, 128, 0, 2, 2},
                                           CkCase{DType::kBF16, false, 64, 3, 128, 0, 2, 2},
                                           CkCase{DType::kFP32, true, 16, -1, 128, 1, 0, 2},
                                           CkCase{DType::kBF16, false, 64, -1, 128, 1, 0, 1}),
                         [](const auto& info) { return info.param.name(); });

// The forward of `p` on the fp32 device pool `pool` (P slots, sequence n on
// slots[n]) with slot checkpoints (offsets, ck_slots: [N, 2]), everything
// uploaded here; cu_host: the host copy of the boundaries, or null.
Status run_with_slot_checkpoints(const HostProblem& p, void* pool, int64_t P, const std::vector<int32_t>& slots,
                                 const std::vector<int64_t>& offsets, const std::vector<int32_t>& ck_slots,
                                 const int64_t* cu_host) {
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), out(p.out_elems());
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> cu(p.cu_seqlens), d_off(offsets);
  DeviceBuffer<int32_t> d_slots(slots), d_ck_slots(ck_slots);
  ForwardArgs a = p.host_args(out.ptr, nullptr);
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
  a.cu_seqlens = cu.ptr;
  a.cu_seqlens_host = cu_host;
  a.state_pool = pool;
  a.state_pool_dtype = DType::kFP32;
  a.pool_size = P;
  a.state_indices = d_slots.ptr;
  a.state_index_type = IndexType::kInt32;
  a.slot_checkpoint_offsets = d_off.ptr;
  a.slot_checkpoint_slots = d_ck_slots.ptr;
  return run_forward(a);
}

// vLLM's align mode: up to two 16-aligned offsets per sequence into pool slots,
// against the CPU oracle on the same pool; unused slots keep their bytes.
// Param: (forced segment chunks, -1 one chain; head dim).
class GpuSlotCheckpoints : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
  int64_t seg() const { return std::get<0>(GetParam()); }
  int64_t head_dim() const { return std::get<1>(GetParam()); }
};

TEST_P(GpuSlotCheckpoints, MatchTheOracle) {
  ASSERT_TRUE(check_device_faults(nullptr).ok());
  ProblemSpec spec;
  spec.seqlens = kSeqlens;
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = head_dim();
  spec.initial_state = spec.final_state = DType::kNone;
  const HostProblem p = make_problem(spec, 82);
  const int64_t per_slot = p.HV * p.V * p.K, P = 14;
  // Sequence n owns slot n; its checkpoints go to slots 6.. (the last: the final state, offset == L).
  const std::vector<int32_t> slots = {0, 1, 2, 3, 4, 5};
  const std::vector<int64_t> offsets = {16, 32, -1, -1, 288, 64, 16, -1, 128, -1, 64, -1};
  const std::vector<int32_t> ck_slots = {6, 7, -1, -1, 8, 9, 10, -1, 11, -1, 12, -1};
  std::vector<float> pool(static_cast<size_t>(P * per_slot));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = 0.01f * static_cast<float>(i % 97);

  std::vector<float> ref_pool = pool;
  {
    std::vector<uint16_t> out(p.out_elems());
    ForwardArgs a = p.host_args(out.data(), nullptr);
    a.state_pool = ref_pool.data();
    a.state_pool_dtype = DType::kFP32;
    a.pool_size = P;
    a.state_indices = slots.data();
    a.state_index_type = IndexType::kInt32;
    a.slot_checkpoint_offsets = offsets.data();
    a.slot_checkpoint_slots = ck_slots.data();
    const Status s = forward(a, Backend::kCpuReference, nullptr, 0, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
  }
  sm90::set_launch_override({0, 0, seg()});
  DeviceBuffer<float> d_pool(pool);
  const Status s = run_with_slot_checkpoints(p, d_pool.ptr, P, slots, offsets, ck_slots, p.cu_seqlens.data());
  ASSERT_TRUE(s.ok()) << s.message;
  const std::vector<float> got = d_pool.to_host();
  for (int64_t slot = 0; slot < P; ++slot) {
    const float* g0 = got.data() + slot * per_slot;
    const float* r0 = ref_pool.data() + slot * per_slot;
    if (slot == 13) {
      EXPECT_EQ(0, std::memcmp(g0, pool.data() + slot * per_slot, per_slot * 4)) << "slot 13 belongs to nobody";
      continue;
    }
    const double e = rel_rms(g0, r0, static_cast<size_t>(per_slot));
    std::printf("[ errors ] slot checkpoints seg=%lld K=%lld slot %lld: %.3e\n", static_cast<long long>(seg()),
                static_cast<long long>(head_dim()), static_cast<long long>(slot), e);
    EXPECT_LE(e, kStateBar) << "slot " << slot;
  }
  EXPECT_TRUE(check_device_faults(nullptr).ok());
}

// Offsets not on a 16-token boundary, past the sequence, or slots past the pool:
// skipped (nothing outside the pool written) and reported by name.
TEST_P(GpuSlotCheckpoints, InvalidEntriesAreSkippedAndReported) {
  ASSERT_TRUE(check_device_faults(nullptr).ok());
  ProblemSpec spec;
  spec.seqlens = {37, 300};
  spec.heads = 1;
  spec.head_dim = head_dim();
  spec.initial_state = spec.final_state = DType::kNone;
  const HostProblem p = make_problem(spec, 83);
  const int64_t per_slot = p.HV * p.V * p.K, P = 4;
  const std::vector<int32_t> slots = {0, 1};
  const std::vector<int64_t> offsets = {17, 48, 64, 16};    // seq 0: not aligned, past L = 37; seq 1: fine
  const std::vector<int32_t> ck_slots = {2, 3, 1 << 20, 2};  // seq 1: entry 0 past the pool
  sm90::set_launch_override({0, 0, seg()});
  std::vector<uint8_t> pool_bytes(static_cast<size_t>(P * per_slot) * 4, 0);
  GuardedDeviceBuffer d_pool(pool_bytes);
  // Device values only: nothing about the offsets is checked on the host.
  const Status s = run_with_slot_checkpoints(p, d_pool.data(), P, slots, offsets, ck_slots, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(d_pool.damaged(), 0u);
  std::vector<float> got(static_cast<size_t>(P * per_slot));
  FKDA_CUDA_CHECK(cudaMemcpy(got.data(), d_pool.data(), got.size() * 4, cudaMemcpyDeviceToHost));
  bool slot3_untouched = true;
  for (int64_t i = 0; i < per_slot; ++i) slot3_untouched = slot3_untouched && got[3 * per_slot + i] == 0.f;
  EXPECT_TRUE(slot3_untouched) << "slot 3 was named only by an invalid entry";
  bool slot2_written = false;
  for (int64_t i = 0; i < per_slot; ++i) slot2_written = slot2_written || got[2 * per_slot + i] != 0.f;
  EXPECT_TRUE(slot2_written) << "sequence 1's valid checkpoint (16 tokens, slot 2) is missing";
  const Status f = check_device_faults(nullptr);
  EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << f.message;
  EXPECT_NE(f.message.find("slot_checkpoint_offsets / slot_checkpoint_slots (forward)"), std::string::npos)
      << f.message;
  EXPECT_NE(f.message.find("first at sequence 0."), std::string::npos) << f.message;
}

INSTANTIATE_TEST_SUITE_P(Plans, GpuSlotCheckpoints,
                         ::testing::Combine(::testing::Values(int64_t{-1}, int64_t{3}),
                                            ::testing::Values(int64_t{128}, int64_t{64})),
                         [](const auto& info) {
                           const int64_t seg = std::get<0>(info.param);
                           return (seg < 0 ? std::string("one_chain") : "segments_of_" + std::to_string(seg)) + "_K" +
                                  std::to_string(std::get<1>(info.param));
                         });

#endif  // FLASHKDA_WITH_CUDA

TEST(GpuCheckpointsBuild, SkippedWithoutCudaBuild) {
#ifdef FLASHKDA_WITH_CUDA
  GTEST_SKIP() << "CUDA build: the checkpoint GPU tests above run (or skip for lack of a device)";
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

}  // namespace
}  // namespace flashkda::testing
