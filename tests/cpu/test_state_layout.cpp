// Key-major initial / final states (ForwardArgs::states_key_major: [N, HV, K, V],
// fla's layout) on the CPU backends: bitwise the value-major call on the transposed
// states, for fp32 and bf16 states, either state alone, through the C ABI too (a
// state pool with the flag: test_state_pool.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "flashkda/flashkda_c.h"

namespace flashkda::testing {
namespace {

struct LayoutCase {
  DType initial, final_;
};

class StatesKeyMajor : public ::testing::TestWithParam<std::tuple<Backend, LayoutCase>> {};

TEST_P(StatesKeyMajor, IsTheValueMajorCallOnTransposedStates) {
  const auto [backend, lc] = GetParam();
  ProblemSpec spec;
  spec.seqlens = {37, 0, 64, 21};
  spec.heads = 2;
  spec.v_heads = 4;
  spec.initial_state = lc.initial;
  spec.final_state = lc.final_;
  const HostProblem p = make_problem_kv(spec, 32, 48, 71);  // K != V: the layouts differ in shape too
  const int64_t blocks = p.N * p.HV;
  const size_t elem = lc.final_ == DType::kBF16 ? 2 : 4;

  // Value-major, as before.
  std::vector<uint16_t> out_vm(p.out_elems(), 1);
  std::vector<unsigned char> fin_vm(p.state_elems() * elem, 0x5a);
  ASSERT_TRUE(forward(p.host_args(out_vm.data(), fin_vm.data()), backend, nullptr, 0, nullptr).ok());

  // Key-major: the same initial states transposed in, final states transposed out.
  HostProblem km = p;
  km.init_f32 = transpose_blocks(p.init_f32, blocks, p.V, p.K);
  km.init_bf16 = transpose_blocks(p.init_bf16, blocks, p.V, p.K);
  std::vector<uint16_t> out_km(p.out_elems(), 2);
  std::vector<unsigned char> fin_km(p.state_elems() * elem, 0xa5);
  ForwardArgs a = km.host_args(out_km.data(), fin_km.data());
  a.states_key_major = true;
  const Status s = forward(a, backend, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(std::memcmp(out_vm.data(), out_km.data(), out_vm.size() * sizeof(uint16_t)), 0);
  if (lc.final_ == DType::kFP32) {
    std::vector<float> vm(p.state_elems()), got(p.state_elems());
    std::memcpy(vm.data(), fin_vm.data(), fin_vm.size());
    std::memcpy(got.data(), fin_km.data(), fin_km.size());
    EXPECT_EQ(transpose_blocks(vm, blocks, p.V, p.K), got);
  } else if (lc.final_ == DType::kBF16) {
    std::vector<uint16_t> vm(p.state_elems()), got(p.state_elems());
    std::memcpy(vm.data(), fin_vm.data(), fin_vm.size());
    std::memcpy(got.data(), fin_km.data(), fin_km.size());
    EXPECT_EQ(transpose_blocks(vm, blocks, p.V, p.K), got);
  }

  // The C ABI gives the same bits.
  if (lc.final_ != DType::kNone) {
    std::vector<uint16_t> out_c(p.out_elems(), 3);
    std::vector<unsigned char> fin_c(p.state_elems() * elem, 0x33);
    flashkda_forward_args c;
    flashkda_forward_args_init(&c);
    c.q = a.q; c.k = a.k; c.v = a.v; c.g = a.g; c.beta = a.beta; c.A_log = a.A_log; c.dt_bias = a.dt_bias;
    c.out = out_c.data();
    c.initial_state = a.initial_state;
    c.initial_state_dtype = static_cast<int32_t>(a.initial_state_dtype);
    c.final_state = fin_c.data();
    c.final_state_dtype = static_cast<int32_t>(a.final_state_dtype);
    c.states_key_major = 1;
    c.cu_seqlens = a.cu_seqlens; c.num_seqs = a.num_seqs;
    c.batch = a.batch; c.seqlen = a.seqlen; c.num_heads = a.num_heads; c.num_v_heads = a.num_v_heads;
    c.head_dim_k = a.head_dim_k; c.head_dim_v = a.head_dim_v;
    c.scale = a.scale; c.lower_bound = a.lower_bound;
    ASSERT_EQ(flashkda_forward(&c, static_cast<int32_t>(backend), nullptr, 0, nullptr), FLASHKDA_STATUS_OK)
        << flashkda_last_error();
    EXPECT_EQ(out_c, out_km);
    EXPECT_EQ(fin_c, fin_km);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, StatesKeyMajor,
    ::testing::Combine(::testing::Values(Backend::kCpuReference, Backend::kCpuChunked),
                       ::testing::Values(LayoutCase{DType::kFP32, DType::kFP32}, LayoutCase{DType::kBF16, DType::kBF16},
                                         LayoutCase{DType::kNone, DType::kFP32},
                                         LayoutCase{DType::kFP32, DType::kNone})));

}  // namespace
}  // namespace flashkda::testing
