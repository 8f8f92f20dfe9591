// The C ABI (include/flashkda/flashkda_c.h): codes and messages, and results
// bitwise equal to the C++ API's.
#include "flashkda/flashkda_c.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/common/kda_problem.h"

namespace {

using flashkda::DType;
using flashkda::testing::HostProblem;
using flashkda::testing::ProblemSpec;

flashkda_forward_args to_c(const flashkda::ForwardArgs& a) {
  flashkda_forward_args c;
  flashkda_forward_args_init(&c);
  c.q = a.q; c.k = a.k; c.v = a.v; c.g = a.g; c.beta = a.beta;
  c.A_log = a.A_log; c.dt_bias = a.dt_bias; c.out = a.out;
  c.initial_state = a.initial_state; c.initial_state_dtype = static_cast<int32_t>(a.initial_state_dtype);
  c.final_state = a.final_state; c.final_state_dtype = static_cast<int32_t>(a.final_state_dtype);
  c.cu_seqlens = a.cu_seqlens; c.cu_seqlens_host = a.cu_seqlens_host; c.num_seqs = a.num_seqs;
  c.batch = a.batch; c.seqlen = a.seqlen; c.num_heads = a.num_heads; c.num_v_heads = a.num_v_heads;
  c.head_dim_k = a.head_dim_k; c.head_dim_v = a.head_dim_v;
  c.scale = a.scale; c.lower_bound = a.lower_bound;
  return c;
}

HostProblem small_problem(bool varlen) {
  ProblemSpec s;
  s.seqlen = 37;
  s.heads = 2;
  s.v_heads = 4;
  s.head_dim = 32;
  if (varlen) s.seqlens = {19, 0, 21};
  return flashkda::testing::make_problem(s, 11);
}

TEST(CApi, LayoutAndVersion) {
  static_assert(sizeof(void*) != 8 || sizeof(flashkda_forward_args) == 168, "C struct layout changed");
  static_assert(sizeof(void*) != 8 || offsetof(flashkda_forward_args, lower_bound) == 164, "C struct layout changed");
  EXPECT_EQ(flashkda_abi_version(), FLASHKDA_C_ABI_VERSION);
  EXPECT_STREQ(flashkda_version(), "0.1.0");
  flashkda_forward_args a;
  std::memset(&a, 0xff, sizeof a);
  flashkda_forward_args_init(&a);
  EXPECT_EQ(a.q, nullptr);
  EXPECT_EQ(a.batch, 0);
  EXPECT_EQ(a.lower_bound, -5.f);
  EXPECT_STREQ(flashkda_status_string(FLASHKDA_STATUS_INVALID_ARGUMENT), "kInvalidArgument");
  EXPECT_STREQ(flashkda_status_string(99), "unknown status");
}

TEST(CApi, ErrorCodeAndMessage) {
  HostProblem p = small_problem(false);
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems());
  flashkda_forward_args c = to_c(p.host_args(out.data(), fin.data()));
  c.lower_bound = 0.5f;
  EXPECT_EQ(flashkda_forward(&c, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "lower_bound: expected a finite value in [-5, 0), got 0.5");
  EXPECT_EQ(flashkda_validate(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);

  // The message is per thread.
  std::string other;
  std::thread([&] { other = flashkda_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(flashkda_last_error()).find("lower_bound"), std::string::npos);

  // A successful call clears it.
  c.lower_bound = -5.f;
  EXPECT_EQ(flashkda_validate(&c, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_OK);
  EXPECT_STREQ(flashkda_last_error(), "");

  // Unknown enum values are argument errors, not crashes.
  EXPECT_EQ(flashkda_validate(&c, 42), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("backend"), std::string::npos);
  c.final_state_dtype = 17;
  EXPECT_EQ(flashkda_validate(&c, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("final_state_dtype"), std::string::npos);

  EXPECT_EQ(flashkda_validate(nullptr, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "args: null pointer");
}

TEST(CApi, WorkspaceSize) {
  HostProblem p = small_problem(false);
  std::vector<uint16_t> out(p.out_elems());
  std::vector<float> fin(p.state_elems());
  flashkda_forward_args c = to_c(p.host_args(out.data(), fin.data()));
  uint64_t bytes = 77;
  EXPECT_EQ(flashkda_workspace_size(&c, FLASHKDA_BACKEND_CPU_CHUNKED, &bytes), FLASHKDA_STATUS_OK);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(flashkda_workspace_size(&c, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
}

TEST(CApi, CudaAvailableMatchesCpp) {
  std::string why;
  const bool cpp = flashkda::cuda_backend_available(&why);
  EXPECT_EQ(flashkda_cuda_available(), cpp ? 1 : 0);
  if (!cpp) EXPECT_EQ(std::string(flashkda_last_error()), why);
}

// The C entry point and the C++ one give bitwise identical results.
void expect_same_as_cpp(bool varlen, int32_t backend) {
  HostProblem p = small_problem(varlen);
  std::vector<uint16_t> out_cpp(p.out_elems(), 1), out_c(p.out_elems(), 2);
  std::vector<float> fin_cpp(p.state_elems(), 1.f), fin_c(p.state_elems(), 2.f);
  const flashkda::Status s = flashkda::forward(p.host_args(out_cpp.data(), fin_cpp.data()),
                                               static_cast<flashkda::Backend>(backend), nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  const flashkda_forward_args c = to_c(p.host_args(out_c.data(), fin_c.data()));
  ASSERT_EQ(flashkda_forward(&c, backend, nullptr, 0, nullptr), FLASHKDA_STATUS_OK) << flashkda_last_error();
  EXPECT_EQ(std::memcmp(out_cpp.data(), out_c.data(), out_c.size() * sizeof(out_c[0])), 0);
  EXPECT_EQ(std::memcmp(fin_cpp.data(), fin_c.data(), fin_c.size() * sizeof(fin_c[0])), 0);
}

TEST(CApi, ChunkedRunMatchesCppBitwise) { expect_same_as_cpp(false, FLASHKDA_BACKEND_CPU_CHUNKED); }
TEST(CApi, ChunkedVarlenRunMatchesCppBitwise) { expect_same_as_cpp(true, FLASHKDA_BACKEND_CPU_CHUNKED); }
TEST(CApi, ReferenceRunMatchesCppBitwise) { expect_same_as_cpp(true, FLASHKDA_BACKEND_CPU_REFERENCE); }

}  // namespace
