// Engines' layouts on the CUDA forward (spec section 7; label "gpu"): int32
// cu_seqlens, q/k/v/g/beta as strided views of one fused projection, and the
// forward on a state pool in place (int32 / int64 indices, negative = no slot,
// has_initial_state, padded slots, fp32 and bf16). Each is checked bitwise
// against the dense call it stands for, alone and through the segment scan; an
// index past the pool is skipped inside guard bands and reported by
// check_device_faults(). Skips, saying why, without a CUDA build or sm_90 device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/gpu/gpu_harness.h"

#ifdef FLASHKDA_WITH_CUDA
#include "sm90/sm90_forward.h"
#endif

namespace flashkda::testing {
namespace {

#ifdef FLASHKDA_WITH_CUDA

// A problem's inputs on the device, and dense ForwardArgs pointing at them.
struct DeviceInputs {
  DeviceBuffer<uint16_t> q, k, v, g, beta;
  DeviceBuffer<float> A_log, dt_bias;
  DeviceBuffer<int64_t> cu;
  explicit DeviceInputs(const HostProblem& p)
      : q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta), A_log(p.A_log), dt_bias(p.dt_bias), cu(p.cu_seqlens) {}
  ForwardArgs args(const HostProblem& p, void* out) const {
    ForwardArgs a = p.host_args(out, nullptr);
    a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
    a.A_log = A_log.ptr; a.dt_bias = dt_bias.ptr;
    a.initial_state = nullptr;
    a.initial_state_dtype = a.final_state_dtype = DType::kNone;
    if (!p.cu_seqlens.empty()) {
      a.cu_seqlens = cu.ptr;
      a.cu_seqlens_host = p.cu_seqlens.data();
    }
    return a;
  }
};

// `a` (writing `out`) run from the problem's fp32 initial state: out and the
// final state bitwise those of the dense run.
void expect_bitwise_dense(ForwardArgs a, const HostProblem& p, const DeviceBuffer<uint16_t>& out,
                          const RunResult& dense) {
  DeviceBuffer<float> init(p.init_f32), fin(p.state_elems());
  a.initial_state = init.ptr;
  a.final_state = fin.ptr;
  a.initial_state_dtype = a.final_state_dtype = DType::kFP32;
  const Status s = run_forward(a);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(out.to_host(), dense.out_bits);
  const std::vector<float> f = fin.to_host();
  EXPECT_EQ(0, std::memcmp(f.data(), dense.state_bytes.data(), dense.state_bytes.size()));
}

// Param: (forced segment chunks, -1: none; head dim), the head dim read by
// varlen_spec through the current test's parameter.
class GpuEngineLayouts : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    sm90::set_launch_override({0, 0, std::get<0>(GetParam())});
  }
  void TearDown() override { sm90::set_launch_override({}); }
};

ProblemSpec varlen_spec(DType state) {
  ProblemSpec spec;
  spec.seqlens = {37, 0, 300, 21, 130};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.head_dim = std::get<1>(GpuEngineLayouts::GetParam());
  spec.initial_state = spec.final_state = state;
  return spec;
}

TEST_P(GpuEngineLayouts, Int32CuSeqlensAreBitwiseTheInt64Run) {
  const HostProblem p = make_problem(varlen_spec(DType::kFP32), 61);
  const RunResult dense = run_cuda(p);
  ASSERT_TRUE(dense.status.ok()) << dense.status.message;

  DeviceInputs in(p);
  std::vector<int32_t> cu32(p.cu_seqlens.begin(), p.cu_seqlens.end());
  DeviceBuffer<int32_t> d_cu32(cu32);
  DeviceBuffer<uint16_t> out(p.out_elems());
  ForwardArgs a = in.args(p, out.ptr);
  a.cu_seqlens = nullptr;
  a.cu_seqlens_host = nullptr;  // engines pass none: nothing about the lengths is known on the host
  a.cu_seqlens_int32 = d_cu32.ptr;
  expect_bitwise_dense(a, p, out, dense);
  EXPECT_TRUE(check_device_faults(nullptr).ok());
}

// A_log and dt_bias need only 4-byte alignment (validate.cpp): views that start one
// float into a buffer (8-byte aligned + 4) give the dense run's bits.
TEST_P(GpuEngineLayouts, WeightsAtFourByteOffsetsAreBitwiseTheDenseRun) {
  const HostProblem p = make_problem(varlen_spec(DType::kFP32), 64);
  const RunResult dense = run_cuda(p);
  ASSERT_TRUE(dense.status.ok()) << dense.status.message;
  std::vector<float> a_log(p.A_log.size() + 1, 0.f), dt_bias(p.dt_bias.size() + 1, 0.f);
  std::copy(p.A_log.begin(), p.A_log.end(), a_log.begin() + 1);
  std::copy(p.dt_bias.begin(), p.dt_bias.end(), dt_bias.begin() + 1);
  DeviceInputs in(p);
  DeviceBuffer<float> d_a_log(a_log), d_dt_bias(dt_bias);  // cudaMalloc: 256-byte aligned
  DeviceBuffer<uint16_t> out(p.out_elems());
  ForwardArgs a = in.args(p, out.ptr);
  a.A_log = d_a_log.ptr + 1;
  a.dt_bias = d_dt_bias.ptr + 1;
  expect_bitwise_dense(a, p, out, dense);
}

// Per token [q | k | v | g | beta | pad] with the width a multiple of 8 (rows
// 16-byte aligned): every tensor a strided view of one buffer.
TEST_P(GpuEngineLayouts, FusedProjectionViewsAreBitwiseTheDenseRun) {
  const HostProblem p = make_problem(varlen_spec(DType::kFP32), 62);
  const RunResult dense = run_cuda(p);
  ASSERT_TRUE(dense.status.ok()) << dense.status.message;
  const int64_t T = p.tokens(), H = p.H, HV = p.HV, K = p.K, V = p.V;
  const int64_t q0 = 0, k0 = H * K, v0 = 2 * H * K, g0 = v0 + HV * V, beta0 = g0 + HV * K;
  const int64_t width = (beta0 + HV + 8 + 7) / 8 * 8;
  std::vector<uint16_t> fused(static_cast<size_t>(T * width), 0x7fc1);  // NaN bits in the padding
  for (int64_t t = 0; t < T; ++t) {
    uint16_t* row = fused.data() + t * width;
    std::memcpy(row + q0, p.q.data() + t * H * K, H * K * 2);
    std::memcpy(row + k0, p.k.data() + t * H * K, H * K * 2);
    std::memcpy(row + v0, p.v.data() + t * HV * V, HV * V * 2);
    std::memcpy(row + g0, p.g.data() + t * HV * K, HV * K * 2);
    std::memcpy(row + beta0, p.beta.data() + t * HV, HV * 2);
  }
  DeviceInputs in(p);
  DeviceBuffer<uint16_t> d_fused(fused), out(p.out_elems());
  ForwardArgs a = in.args(p, out.ptr);
  a.q = d_fused.ptr + q0;
  a.k = d_fused.ptr + k0;
  a.v = d_fused.ptr + v0;
  a.g = d_fused.ptr + g0;
  a.beta = d_fused.ptr + beta0;
  a.q_token_stride = a.k_token_stride = a.v_token_stride = a.g_token_stride = a.beta_token_stride = width;
  a.q_head_stride = a.k_head_stride = K;
  a.v_head_stride = V;
  a.g_head_stride = K;
  a.beta_head_stride = 1;
  expect_bitwise_dense(a, p, out, dense);
}

// The pool run against the dense run whose initial states are what the pool
// gives each sequence: the slot's state, or zero (no slot, or
// has_initial_state 0). Slots nobody owns keep their bytes.
void check_pool(DType dtype, IndexType index_type) {
  const HostProblem p = make_problem(varlen_spec(dtype), 63);
  const int64_t N = p.N, per_slot = p.HV * p.V * p.K, stride = per_slot + 64, P = 9;
  const size_t esize = dtype == DType::kFP32 ? 4 : 2;
  const std::vector<int64_t> slots = {7, 2, -1, 0, 5};  // sequence 2 has no slot
  const std::vector<uint8_t> has = {1, 1, 1, 0, 1};     // sequence 3 starts from zero but owns slot 0
  // The pool: distinct bytes everywhere; the owned slots hold the sequences' initial states.
  std::vector<uint8_t> pool(static_cast<size_t>(P * stride) * esize);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(i * 37 + 11) & 0x3f;  // small finite values
  const uint8_t* init = dtype == DType::kFP32 ? reinterpret_cast<const uint8_t*>(p.init_f32.data())
                                              : reinterpret_cast<const uint8_t*>(p.init_bf16.data());
  HostProblem dense_problem = p;
  for (int64_t n = 0; n < N; ++n) {
    if (slots[n] >= 0)
      std::memcpy(pool.data() + slots[n] * stride * esize, init + n * per_slot * esize, per_slot * esize);
    if (slots[n] < 0 || !has[n]) {
      if (dtype == DType::kFP32)
        std::fill_n(dense_problem.init_f32.begin() + n * per_slot, per_slot, 0.f);
      else
        std::fill_n(dense_problem.init_bf16.begin() + n * per_slot, per_slot, uint16_t{0});
    }
  }
  const RunResult dense = run_cuda(dense_problem);
  ASSERT_TRUE(dense.status.ok()) << dense.status.message;

  DeviceInputs in(p);
  GuardedDeviceBuffer d_pool(pool);
  std::vector<uint8_t> idx_bytes;
  for (int64_t s : slots) {
    if (index_type == IndexType::kInt64) {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&s);
      idx_bytes.insert(idx_bytes.end(), b, b + 8);
    } else {
      const int32_t s32 = static_cast<int32_t>(s);
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&s32);
      idx_bytes.insert(idx_bytes.end(), b, b + 4);
    }
  }
  DeviceBuffer<uint8_t> d_idx(idx_bytes), d_has(has);
  DeviceBuffer<uint16_t> out(p.out_elems());
  ForwardArgs a = in.args(p, out.ptr);
  a.state_pool = d_pool.data();
  a.state_pool_dtype = dtype;
  a.pool_size = P;
  a.pool_stride = stride;
  a.state_indices = d_idx.ptr;
  a.state_index_type = index_type;
  a.has_initial_state = d_has.ptr;
  const Status s = run_forward(a);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(out.to_host(), dense.out_bits);
  EXPECT_EQ(d_pool.damaged(), 0u);
  std::vector<uint8_t> after(pool.size());
  FKDA_CUDA_CHECK(cudaMemcpy(after.data(), d_pool.data(), after.size(), cudaMemcpyDeviceToHost));
  std::vector<uint8_t> expect = pool;
  for (int64_t n = 0; n < N; ++n)
    if (slots[n] >= 0)
      std::memcpy(expect.data() + slots[n] * stride * esize, dense.state_bytes.data() + n * per_slot * esize,
                  per_slot * esize);
  EXPECT_TRUE(after == expect) << "the pool differs from the dense run's final states (or an unowned slot changed)";
  EXPECT_TRUE(check_device_faults(nullptr).ok());
}

TEST_P(GpuEngineLayouts, PoolFp32Int32IndicesIsTheDenseRun) { check_pool(DType::kFP32, IndexType::kInt32); }
TEST_P(GpuEngineLayouts, PoolFp32Int64IndicesIsTheDenseRun) { check_pool(DType::kFP32, IndexType::kInt64); }
TEST_P(GpuEngineLayouts, PoolBf16IsTheDenseRun) { check_pool(DType::kBF16, IndexType::kInt32); }

// An index past the pool: that sequence reads and writes nothing (the pool sits
// in guard bands and its slots keep their bytes), the others run, and the fault
// names state_indices and the sequence.
TEST_P(GpuEngineLayouts, PoolIndexPastThePoolIsSkippedAndReported) {
  ASSERT_TRUE(check_device_faults(nullptr).ok());
  const HostProblem p = make_problem(varlen_spec(DType::kFP32), 64);
  const int64_t per_slot = p.HV * p.V * p.K, P = 5;
  std::vector<float> pool(static_cast<size_t>(P * per_slot), 0.25f);
  const std::vector<int32_t> slots = {0, 1, 1 << 30, 3, 4};
  DeviceInputs in(p);
  std::vector<uint8_t> bytes(pool.size() * 4);
  std::memcpy(bytes.data(), pool.data(), bytes.size());
  GuardedDeviceBuffer d_pool(bytes);
  DeviceBuffer<int32_t> d_idx(slots);
  DeviceBuffer<uint16_t> out(p.out_elems());
  ForwardArgs a = in.args(p, out.ptr);
  a.state_pool = d_pool.data();
  a.state_pool_dtype = DType::kFP32;
  a.pool_size = P;
  a.state_indices = d_idx.ptr;
  a.state_index_type = IndexType::kInt32;
  const Status s = run_forward(a);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(d_pool.damaged(), 0u);
  std::vector<float> after(pool.size());
  FKDA_CUDA_CHECK(cudaMemcpy(after.data(), d_pool.data(), after.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::equal(after.begin() + 2 * per_slot, after.begin() + 3 * per_slot, pool.begin() + 2 * per_slot))
      << "slot 2 belongs to no sequence";
  const Status f = check_device_faults(nullptr);
  EXPECT_EQ(f.code, StatusCode::kInvalidArgument) << f.message;
  EXPECT_NE(f.message.find("state_indices (forward)"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("first at sequence 2."), std::string::npos) << f.message;
}

INSTANTIATE_TEST_SUITE_P(Plans, GpuEngineLayouts,
                         ::testing::Combine(::testing::Values(int64_t{-1}, int64_t{3}),
                                            ::testing::Values(int64_t{128}, int64_t{64})),
                         [](const auto& info) {
                           const int64_t seg = std::get<0>(info.param);
                           return (seg < 0 ? std::string("one_chain") : "segments_of_" + std::to_string(seg)) + "_K" +
                                  std::to_string(std::get<1>(info.param));
                         });

#endif  // FLASHKDA_WITH_CUDA

TEST(GpuEngineLayoutsBuild, SkippedWithoutCudaBuild) {
#ifdef FLASHKDA_WITH_CUDA
  GTEST_SKIP() << "CUDA build: the engine-layout GPU tests above run (or skip for lack of a device)";
#else
  GTEST_SKIP() << "no GPU run: this build has no CUDA kernels (FLASHKDA_ENABLE_CUDA=OFF)";
#endif
}

}  // namespace
}  // namespace flashkda::testing
