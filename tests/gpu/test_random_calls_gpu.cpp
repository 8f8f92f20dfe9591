// Random calls of the CUDA forward against the float64 reference (label "gpu"):
// every feature drawn at once (tests/common/random_calls.h says which), and the
// heuristic's launch plan or a forced one (segments of a few chunks, outputs by
// chains or superposition, V split, record loads). The GPU's results are compared
// sequence by sequence, entry by entry and slot by slot with the same arguments
// run through the CPU reference; what no sequence owns (pool slots, slot padding,
// spare checkpoint entries, guard bands) must keep its bytes. Skips, saying why,
// without a CUDA build or an sm_90 device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include "sm90/sm90_forward.h"
#include "tests/common/random_calls.h"
#endif

namespace flashkda::testing {
namespace {

#ifdef FLASHKDA_WITH_CUDA

using namespace random_calls;

// Spec section 2's bars against float64 (gpu_harness.h). out is compared after
// both sides' bf16 rounding: the reference's rounding adds at most 2^-9 of each
// element (relative), so a GPU out within kOutBar of the exact one is within
// kOutBar + 2^-9 of the rounded reference (triangle inequality). States and
// checkpoints in bf16: kBf16StateBar (through a bf16 rounding, as in the
// feature tests). A bf16 initial state enters both sides exactly, so out keeps
// its own bar.
constexpr double kBf16Rounding = 1.0 / 512;
constexpr int kCalls = 48;

Results run_gpu(const Call& c) {
  const HostProblem& p = c.p;
  DeviceBuffer<uint8_t> q(c.q.bytes), k(c.k.bytes), v(c.v.bytes), g(c.g.bytes), beta(c.beta.bytes);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias);
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  DeviceBuffer<int32_t> cu32(std::vector<int32_t>(p.cu_seqlens.begin(), p.cu_seqlens.end()));
  DeviceBuffer<uint16_t> init_bf16(p.init_bf16);
  DeviceBuffer<float> init_f32(p.init_f32);
  GuardedDeviceBuffer out(std::vector<uint8_t>(p.out_elems() * 2, 0xff));  // NaN: unwritten shows
  GuardedDeviceBuffer fin(final_state_start(c));
  GuardedDeviceBuffer pool(c.pool_bytes);
  GuardedDeviceBuffer ck(std::vector<uint8_t>(ck_size(c), kUntouched));
  DeviceBuffer<uint8_t> slots(index_bytes(c.slots, c.index_type)), has(c.has_state);
  DeviceBuffer<int64_t> slot_ck_offsets(c.slot_ck_offsets);
  DeviceBuffer<uint8_t> slot_ck_slots(index_bytes(c.slot_ck_slots, c.index_type));
  const void* init = c.state_in_place                       ? static_cast<const void*>(fin.data())
                     : p.spec.initial_state == DType::kBF16 ? static_cast<const void*>(init_bf16.ptr)
                                                            : static_cast<const void*>(init_f32.ptr);
  const Buffers b{q.ptr + c.q.offset_bytes(), k.ptr + c.k.offset_bytes(), v.ptr + c.v.offset_bytes(),
                  g.ptr + c.g.offset_bytes(), beta.ptr + c.beta.offset_bytes(), A_log.ptr, dt_bias.ptr, cu.ptr,
                  cu32.ptr, out.data(), init, fin.data(), pool.data(), slots.ptr, has.ptr, ck.data(),
                  slot_ck_offsets.ptr, slot_ck_slots.ptr};
  sm90::LaunchOverride plan;
  plan.v_split = c.plan.v_split;
  plan.seg_chunks = c.plan.seg_chunks;
  plan.outputs = c.plan.outputs;
  plan.records = c.plan.records;
  plan.compose = c.plan.compose;
  sm90::set_launch_override(plan);
  const Status s = run_forward(call_args(c, b, true));
  sm90::set_launch_override({});
  EXPECT_TRUE(s.ok()) << s.message;
  const Status faults = check_device_faults(nullptr);
  EXPECT_TRUE(faults.ok()) << faults.message;
  EXPECT_EQ(out.damaged() + fin.damaged() + pool.damaged() + ck.damaged(), 0u) << "a write outside the tensors";
  Results r;
  auto back = [](const GuardedDeviceBuffer& d) {
    std::vector<uint8_t> h(d.bytes);
    if (d.bytes) FKDA_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.bytes, cudaMemcpyDeviceToHost));
    return h;
  };
  const std::vector<uint8_t> o = back(out);
  r.out.resize(p.out_elems());
  if (!o.empty()) std::memcpy(r.out.data(), o.data(), o.size());
  r.fin = back(fin);
  r.pool = back(pool);
  r.ck = back(ck);
  return r;
}

class GpuRandomCalls : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { sm90::set_launch_override({}); }
};

TEST_P(GpuRandomCalls, MatchTheReference) {
  const Call c = draw_call(static_cast<uint64_t>(GetParam()));
  SCOPED_TRACE(c.what);
  ASSERT_TRUE(check_device_faults(nullptr).ok());
  const Results ref = run_on_host(c, Backend::kCpuReference);
  const Results gpu = run_gpu(c);
  const Worst w = compare(c, gpu, ref, Bars{kOutBar + kBf16Rounding, kStateBar, kBf16StateBar});
  std::printf("[ errors ] random call %d %s: out %.3e state %.3e checkpoints %.3e\n", GetParam(), c.what.c_str(),
              w.out, w.state, w.checkpoints);
}

INSTANTIATE_TEST_SUITE_P(Seeds, GpuRandomCalls, seeds(kCalls));

#endif  // FLASHKDA_WITH_CUDA

TEST(GpuRandomCallsBuild, SkippedWithoutCudaBuild) {
#ifdef FLASHKDA_WITH_CUDA
  GTEST_SKIP() << "CUDA build: the random calls run above";
#else
  GTEST_SKIP() << "no GPU run: built without the CUDA backend (FLASHKDA_WITH_CUDA off)";
#endif
}

}  // namespace
}  // namespace flashkda::testing
