// The C ABI (include/flashkda/flashkda_c.h): codes and messages, and results
// bitwise equal to the C++ API's.
#include "flashkda/flashkda_c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "flashkda/flashkda.h"
#include "tests/common/decode_problem.h"
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
  c.states_key_major = a.states_key_major ? 1 : 0;
  c.cu_seqlens = a.cu_seqlens; c.cu_seqlens_host = a.cu_seqlens_host; c.num_seqs = a.num_seqs;
  c.batch = a.batch; c.seqlen = a.seqlen; c.num_heads = a.num_heads; c.num_v_heads = a.num_v_heads;
  c.head_dim_k = a.head_dim_k; c.head_dim_v = a.head_dim_v;
  c.scale = a.scale; c.lower_bound = a.lower_bound;
  c.state_pool = a.state_pool; c.state_pool_dtype = static_cast<int32_t>(a.state_pool_dtype);
  c.pool_size = a.pool_size; c.pool_stride = a.pool_stride;
  c.state_indices = a.state_indices; c.state_index_type = static_cast<int32_t>(a.state_index_type);
  c.has_initial_state = a.has_initial_state;
  c.checkpoints = a.checkpoints; c.checkpoints_dtype = static_cast<int32_t>(a.checkpoints_dtype);
  c.checkpoint_interval = a.checkpoint_interval; c.checkpoints_capacity = a.checkpoints_capacity;
  c.checkpoints_value_major = a.checkpoints_value_major ? 1 : 0;
  c.slot_checkpoint_offsets = a.slot_checkpoint_offsets; c.slot_checkpoint_slots = a.slot_checkpoint_slots;
  c.cu_seqlens_int32 = a.cu_seqlens_int32;
  c.q_token_stride = a.q_token_stride; c.q_head_stride = a.q_head_stride;
  c.k_token_stride = a.k_token_stride; c.k_head_stride = a.k_head_stride;
  c.v_token_stride = a.v_token_stride; c.v_head_stride = a.v_head_stride;
  c.g_token_stride = a.g_token_stride; c.g_head_stride = a.g_head_stride;
  c.beta_token_stride = a.beta_token_stride; c.beta_head_stride = a.beta_head_stride;
  c.summaries_M = a.summaries_M; c.summaries_B = a.summaries_B;
  c.resume_from_summaries = a.resume_from_summaries ? 1 : 0;
  c.gate_form = static_cast<int32_t>(a.gate_form);
  c.g_dtype = static_cast<int32_t>(a.g_dtype);
  c.beta_is_probability = a.beta_is_probability ? 1 : 0;
  c.beta_dtype = static_cast<int32_t>(a.beta_dtype);
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
  static_assert(sizeof(void*) != 8 || sizeof(flashkda_forward_args) == 392, "C struct layout changed");
  static_assert(sizeof(void*) != 8 || offsetof(flashkda_forward_args, lower_bound) == 164, "C struct layout changed");
  EXPECT_EQ(flashkda_abi_version(), FLASHKDA_C_ABI_VERSION);
  EXPECT_STREQ(flashkda_version(), "0.1.0");
  flashkda_forward_args a;
  std::memset(&a, 0xff, sizeof a);
  flashkda_forward_args_init(&a);
  EXPECT_EQ(a.q, nullptr);
  EXPECT_EQ(a.batch, 0);
  EXPECT_EQ(a.lower_bound, -5.f);
  EXPECT_EQ(a.summaries_M, nullptr);
  EXPECT_EQ(a.resume_from_summaries, 0);
  EXPECT_EQ(a.states_key_major, 0);
  EXPECT_EQ(a.gate_form, FLASHKDA_GATE_SAFE_GATE);
  EXPECT_EQ(a.g_dtype, 0);  // bf16
  EXPECT_EQ(a.beta_is_probability, 0);
  EXPECT_EQ(a.beta_dtype, 0);
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

  // The C struct's own fields: flags 0 or 1, on every entry that takes the struct.
  c.final_state_dtype = FLASHKDA_DTYPE_FP32;
  ASSERT_EQ(flashkda_validate(&c, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_OK) << flashkda_last_error();
  uint64_t bytes = 0;
  for (int field = 0; field < 3; ++field) {
    bytes = 77;  // an error leaves 0 there, as the C++ workspace_size does
    flashkda_forward_args b = c;
    (field == 0 ? b.checkpoints_value_major : field == 1 ? b.resume_from_summaries : b.states_key_major) = 2;
    const char* name = field == 0 ? "checkpoints_value_major: expected 0 or 1, got 2"
                       : field == 1 ? "resume_from_summaries: expected 0 or 1, got 2"
                                    : "states_key_major: expected 0 or 1, got 2";
    EXPECT_EQ(flashkda_validate(&b, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashkda_last_error(), name);
    EXPECT_EQ(flashkda_forward(&b, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashkda_last_error(), name);
    EXPECT_EQ(flashkda_workspace_size(&b, FLASHKDA_BACKEND_CPU_CHUNKED, &bytes), FLASHKDA_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashkda_last_error(), name);
    EXPECT_EQ(bytes, 0u);
  }
  // A dtype outside the enum is named with its value.
  flashkda_forward_args d = c;
  d.state_pool_dtype = 7;
  EXPECT_EQ(flashkda_validate(&d, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("state_pool_dtype is unknown value 7"), std::string::npos) << flashkda_last_error();
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

// No kernel of this process met a bad device-resident value (the CPU tests run
// none; without a usable device nothing can be recorded): the check reports OK,
// through the C ABI as through C++, and leaves no message.
TEST(CApi, CheckDeviceFaultsWithNothingRecorded) {
  EXPECT_TRUE(flashkda::check_device_faults(nullptr).ok());
  EXPECT_EQ(flashkda_check_device_faults(nullptr), FLASHKDA_STATUS_OK) << flashkda_last_error();
  EXPECT_STREQ(flashkda_last_error(), "");
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

// The summaries call of a split forward (summaries_M / summaries_B) through the C
// ABI writes the C++ call's bits and leaves out alone; the resume call runs; a
// bad combination is rejected by name.
TEST(CApi, SummariesCallMatchesCppBitwise) {
  const HostProblem p = small_problem(true);  // sequences of 19, 0 and 21 tokens
  const size_t m_elems = static_cast<size_t>(p.N * p.HV * p.K * p.K);
  const size_t b_elems = static_cast<size_t>(p.N * p.HV * p.V * p.K);
  std::vector<float> M_cpp(m_elems, 1.f), B_cpp(b_elems, 1.f), M_c(m_elems, 2.f), B_c(b_elems, 2.f);
  std::vector<uint16_t> out_c(p.out_elems(), 0x7fc1);
  flashkda::ForwardArgs a = p.host_args(nullptr, nullptr);
  a.initial_state = nullptr;
  a.initial_state_dtype = DType::kNone;
  a.final_state_dtype = DType::kNone;
  a.summaries_M = M_cpp.data();
  a.summaries_B = B_cpp.data();
  const flashkda::Status s = flashkda::forward(a, flashkda::Backend::kCpuChunked, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  flashkda_forward_args c = to_c(a);
  c.summaries_M = M_c.data();
  c.summaries_B = B_c.data();
  c.out = out_c.data();
  uint64_t bytes = 77;
  EXPECT_EQ(flashkda_workspace_size(&c, FLASHKDA_BACKEND_CPU_CHUNKED, &bytes), FLASHKDA_STATUS_OK)
      << flashkda_last_error();
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(flashkda_forward(&c, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_OK)
      << flashkda_last_error();
  EXPECT_EQ(std::memcmp(M_cpp.data(), M_c.data(), m_elems * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(B_cpp.data(), B_c.data(), b_elems * sizeof(float)), 0);
  EXPECT_EQ(std::count(out_c.begin(), out_c.end(), uint16_t{0x7fc1}), static_cast<std::ptrdiff_t>(out_c.size()));
  EXPECT_NE(M_c, std::vector<float>(m_elems, 2.f));  // the call did write

  // The resume call (the flag set, no summaries) is the ordinary forward on the CPU.
  std::vector<uint16_t> out_plain(p.out_elems()), out_resume(p.out_elems());
  std::vector<float> fin_plain(p.state_elems()), fin_resume(p.state_elems());
  const flashkda_forward_args plain = to_c(p.host_args(out_plain.data(), fin_plain.data()));
  flashkda_forward_args resume = to_c(p.host_args(out_resume.data(), fin_resume.data()));
  resume.resume_from_summaries = 1;
  ASSERT_EQ(flashkda_forward(&plain, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_OK);
  ASSERT_EQ(flashkda_forward(&resume, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_OK)
      << flashkda_last_error();
  EXPECT_EQ(out_plain, out_resume);
  EXPECT_EQ(fin_plain, fin_resume);

  // Both at once, and half a pair, are argument errors naming the field.
  c.resume_from_summaries = 1;
  EXPECT_EQ(flashkda_forward(&c, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr, 0, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("resume_from_summaries"), std::string::npos)
      << flashkda_last_error();
  c.resume_from_summaries = 0;
  c.summaries_B = nullptr;
  EXPECT_EQ(flashkda_validate(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("summaries_B"), std::string::npos) << flashkda_last_error();
}

// ---- decode ---------------------------------------------------------------------

flashkda_decode_args to_c(const flashkda::DecodeArgs& a) {
  flashkda_decode_args c;
  flashkda_decode_args_init(&c);
  c.q = a.q; c.k = a.k; c.v = a.v; c.g = a.g; c.beta = a.beta;
  c.A_log = a.A_log; c.dt_bias = a.dt_bias; c.out = a.out;
  c.cu_seqlens = a.cu_seqlens; c.cu_seqlens_host = a.cu_seqlens_host;
  c.state_pool = a.state_pool; c.state_out_pool = a.state_out_pool; c.state_indices = a.state_indices;
  c.per_token_states = a.per_token_states;
  c.num_seqs = a.num_seqs; c.tokens_per_seq = a.tokens_per_seq; c.total_tokens = a.total_tokens;
  c.pool_size = a.pool_size; c.pool_stride = a.pool_stride; c.state_out_stride = a.state_out_stride;
  c.num_heads = a.num_heads; c.num_v_heads = a.num_v_heads; c.head_dim_k = a.head_dim_k; c.head_dim_v = a.head_dim_v;
  c.state_dtype = static_cast<int32_t>(a.state_dtype);
  c.index_type = static_cast<int32_t>(a.index_type);
  c.programmatic_dependent_launch = static_cast<int32_t>(a.programmatic_dependent_launch);
  c.scale = a.scale; c.lower_bound = a.lower_bound;
  c.gate_form = static_cast<int32_t>(a.gate_form);
  c.g_dtype = static_cast<int32_t>(a.g_dtype);
  c.beta_is_probability = a.beta_is_probability ? 1 : 0;
  c.beta_dtype = static_cast<int32_t>(a.beta_dtype);
  c.q_token_stride = a.q_token_stride; c.q_head_stride = a.q_head_stride;
  c.k_token_stride = a.k_token_stride; c.k_head_stride = a.k_head_stride;
  c.v_token_stride = a.v_token_stride; c.v_head_stride = a.v_head_stride;
  c.g_token_stride = a.g_token_stride; c.g_head_stride = a.g_head_stride;
  c.beta_token_stride = a.beta_token_stride; c.beta_head_stride = a.beta_head_stride;
  return c;
}

TEST(CApi, DecodeLayoutAndInit) {
  static_assert(sizeof(void*) != 8 || sizeof(flashkda_decode_args) == 336, "C struct layout changed");
  static_assert(sizeof(void*) != 8 || offsetof(flashkda_decode_args, lower_bound) == 208, "C struct layout changed");
  flashkda_decode_args a;
  std::memset(&a, 0xff, sizeof a);
  flashkda_decode_args_init(&a);
  const flashkda::DecodeArgs defaults;
  EXPECT_EQ(a.q, nullptr);
  EXPECT_EQ(a.num_seqs, 0);
  EXPECT_EQ(a.tokens_per_seq, defaults.tokens_per_seq);
  EXPECT_EQ(a.state_dtype, FLASHKDA_DTYPE_FP32);
  EXPECT_EQ(a.index_type, FLASHKDA_INDEX_INT32);
  EXPECT_EQ(a.programmatic_dependent_launch, FLASHKDA_PDL_AUTO);
  EXPECT_EQ(a.programmatic_dependent_launch, 0);  // the value the C header documents as the default
  EXPECT_EQ(a.lower_bound, defaults.lower_bound);
  EXPECT_EQ(a.gate_form, FLASHKDA_GATE_SAFE_GATE);
  EXPECT_EQ(a.g_dtype, 0);  // bf16
  EXPECT_EQ(a.beta_is_probability, 0);
  EXPECT_EQ(a.beta_dtype, 0);
  EXPECT_EQ(a.reserved, 0);
}

// Varlen tokens, GVA, int64 indices with padding, per-token states: the C entry
// point gives the C++ one's bytes.
TEST(CApi, DecodeRunMatchesCppBitwise) {
  flashkda::testing::DecodeSpec spec;
  spec.num_seqs = 3;
  spec.seq_tokens = {2, 1, 3};
  spec.heads = 1;
  spec.v_heads = 2;
  spec.head_dim = 32;
  spec.padding_entries = 1;
  spec.int64_indices = true;
  spec.per_token_states = true;
  spec.state_dtype = DType::kBF16;
  const auto p = flashkda::testing::make_decode_problem(spec, 5);
  // Same poison on both sides: the padding entry's rows must stay as they were.
  std::vector<uint16_t> out_cpp(static_cast<size_t>(p.T * p.HV * p.V), 0x7fc1), out_c(out_cpp);
  std::vector<uint8_t> pool_cpp = p.pool_bytes(), pool_c = p.pool_bytes();
  std::vector<uint8_t> tok_cpp(static_cast<size_t>(p.T * p.per_slot) * 2, 0xA5), tok_c(tok_cpp);
  const flashkda::Status s = flashkda::decode(p.args(out_cpp.data(), pool_cpp.data(), tok_cpp.data()),
                                              flashkda::Backend::kCpuReference, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  const flashkda_decode_args c = to_c(p.args(out_c.data(), pool_c.data(), tok_c.data()));
  ASSERT_EQ(flashkda_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE, nullptr), FLASHKDA_STATUS_OK) << flashkda_last_error();
  EXPECT_EQ(out_cpp, out_c);
  EXPECT_EQ(pool_cpp, pool_c);
  EXPECT_EQ(tok_cpp, tok_c);
  // ... and the step did run: states and outputs of the real sequences changed.
  EXPECT_NE(pool_c, p.pool_bytes());
  EXPECT_NE(std::count(out_c.begin(), out_c.end(), uint16_t{0x7fc1}), static_cast<std::ptrdiff_t>(out_c.size()));
}

// A small valid decode step (K = V = 32) as C arguments, with its buffers.
struct SmallCDecode {
  flashkda::testing::DecodeProblem p;
  std::vector<uint16_t> out;
  std::vector<uint8_t> pool;
  flashkda_decode_args c;
  explicit SmallCDecode(uint64_t seed) : p(make(seed)), out(static_cast<size_t>(p.T * p.HV * p.V)), pool(p.pool_bytes()) {
    c = to_c(p.args(out.data(), pool.data(), nullptr));
  }
  static flashkda::testing::DecodeProblem make(uint64_t seed) {
    flashkda::testing::DecodeSpec spec;
    spec.head_dim = 32;
    return flashkda::testing::make_decode_problem(spec, seed);
  }
};

TEST(CApi, DecodeErrorCodeAndMessage) {
  SmallCDecode d(6);
  flashkda_decode_args& c = d.c;
  EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_OK) << flashkda_last_error();
  c.lower_bound = 0.5f;
  EXPECT_EQ(flashkda_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "lower_bound: expected a finite value in [-5, 0), got 0.5");
  c.lower_bound = -5.f;
  c.index_type = 9;  // unknown enum values are argument errors, not crashes
  EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("index_type"), std::string::npos);
  c.index_type = FLASHKDA_INDEX_INT32;
  c.state_dtype = FLASHKDA_DTYPE_NONE;
  EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashkda_last_error()).find("state_dtype"), std::string::npos);
  EXPECT_EQ(flashkda_decode(nullptr, FLASHKDA_BACKEND_CPU_REFERENCE, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "args: null pointer");
  c.state_dtype = FLASHKDA_DTYPE_FP32;
  c.reserved = 1;  // free for a later ABI
  EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "reserved: expected 0, got 1");
  EXPECT_EQ(flashkda_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
  c.reserved = 0;
  EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_OK) << flashkda_last_error();
}

// The field is a three-way mode now (it was a flag): any value but -1, 0, 1 is an
// argument error, also on the CPU backends that never launch anything.
TEST(CApi, DecodePdlModeValues) {
  SmallCDecode d(7);
  flashkda_decode_args& c = d.c;
  for (int32_t mode : {FLASHKDA_PDL_OFF, FLASHKDA_PDL_AUTO, FLASHKDA_PDL_ON}) {
    c.programmatic_dependent_launch = mode;
    EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_OK)
        << mode << ": " << flashkda_last_error();
    EXPECT_EQ(flashkda_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE, nullptr), FLASHKDA_STATUS_OK)
        << mode << ": " << flashkda_last_error();
  }
  c.programmatic_dependent_launch = 7;
  EXPECT_EQ(flashkda_validate_decode(&c, FLASHKDA_BACKEND_CPU_REFERENCE), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "programmatic_dependent_launch: expected -1 (off), 0 (auto) or 1 (on), got 7");
  c.programmatic_dependent_launch = -2;
  EXPECT_EQ(flashkda_decode(&c, FLASHKDA_BACKEND_CPU_CHUNKED, nullptr), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(flashkda_last_error(), "programmatic_dependent_launch: expected -1 (off), 0 (auto) or 1 (on), got -2");
}

}  // namespace

namespace {

// Segment summaries and their composition through the C ABI: the same bits as
// the C++ API, and errors with their message.
TEST(CApi, SegmentSummariesMatchCppBitwise) {
  static_assert(sizeof(void*) != 8 || sizeof(flashkda_segment_summary_args) == 424, "C struct layout changed");
  static_assert(sizeof(void*) != 8 || sizeof(flashkda_compose_summaries_args) == 80, "C struct layout changed");
  const HostProblem p = small_problem(true);  // sequences [0, 19), [19, 19), [19, 40)
  const std::vector<int64_t> segments = {0, 7, 7, 19, 19, 19, 25, 40};
  const int64_t S = 4, HV = p.HV, K = p.K, V = p.V;
  for (const int32_t backend : {FLASHKDA_BACKEND_CPU_REFERENCE, FLASHKDA_BACKEND_CPU_CHUNKED}) {
    std::vector<float> M_c(static_cast<size_t>(S * HV * K * K)), B_c(static_cast<size_t>(S * HV * V * K));
    std::vector<float> M_cpp(M_c.size()), B_cpp(B_c.size());
    flashkda_segment_summary_args c{};
    c.inputs = to_c(p.host_args(nullptr, nullptr));
    c.segments = segments.data();
    c.num_segments = S;
    c.M = M_c.data();
    c.B = B_c.data();
    ASSERT_EQ(flashkda_segment_summaries(&c, backend), FLASHKDA_STATUS_OK) << flashkda_last_error();
    flashkda::SegmentSummaryArgs a;
    a.inputs = p.host_args(nullptr, nullptr);
    a.segments = segments.data();
    a.num_segments = S;
    a.M = M_cpp.data();
    a.B = B_cpp.data();
    ASSERT_TRUE(flashkda::segment_summaries(a, static_cast<flashkda::Backend>(backend)).ok());
    EXPECT_EQ(M_c, M_cpp);
    EXPECT_EQ(B_c, B_cpp);

    // The first two segments composed (in place into the first), both ways.
    flashkda_compose_summaries_args k{};
    k.count = HV;
    k.head_dim_k = K;
    k.head_dim_v = V;
    k.M1 = M_c.data();
    k.B1 = B_c.data();
    k.M2 = M_c.data() + HV * K * K;
    k.B2 = B_c.data() + HV * V * K;
    k.M = M_c.data();
    k.B = B_c.data();
    ASSERT_EQ(flashkda_compose_summaries(&k, backend), FLASHKDA_STATUS_OK) << flashkda_last_error();
    flashkda::ComposeSummariesArgs kc;
    kc.count = HV;
    kc.head_dim_k = K;
    kc.head_dim_v = V;
    kc.M1 = M_cpp.data();
    kc.B1 = B_cpp.data();
    kc.M2 = M_cpp.data() + HV * K * K;
    kc.B2 = B_cpp.data() + HV * V * K;
    kc.M = M_cpp.data();
    kc.B = B_cpp.data();
    ASSERT_TRUE(flashkda::compose_summaries(kc, static_cast<flashkda::Backend>(backend)).ok());
    EXPECT_EQ(M_c, M_cpp);
    EXPECT_EQ(B_c, B_cpp);

    // Segment 3 reaching into sequence 2 from sequence 0 is rejected by name.
    const std::vector<int64_t> across = {10, 25};
    c.segments = across.data();
    c.num_segments = 1;
    EXPECT_EQ(flashkda_segment_summaries(&c, backend), FLASHKDA_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashkda_last_error()).find("past the end of sequence 0"), std::string::npos)
        << flashkda_last_error();
  }
  EXPECT_EQ(flashkda_segment_summaries(nullptr, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(flashkda_compose_summaries(nullptr, FLASHKDA_BACKEND_CPU_CHUNKED), FLASHKDA_STATUS_INVALID_ARGUMENT);
}

}  // namespace
