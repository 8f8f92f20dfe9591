// The extern "C" ABI of include/flashkda/flashkda_c.h over the C++ API.
#include "flashkda/flashkda_c.h"

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <string>
#include <type_traits>

#include "flashkda/flashkda.h"

namespace {

using flashkda::Backend;
using flashkda::DecodeArgs;
using flashkda::DType;
using flashkda::GateForm;
using flashkda::IndexType;
using flashkda::ForwardArgs;
using flashkda::PdlMode;
using flashkda::Status;
using flashkda::StatusCode;

// ---- the C constants are the C++ enum values --------------------------------
static_assert(FLASHKDA_STATUS_OK == static_cast<int32_t>(StatusCode::kOk), "");
static_assert(FLASHKDA_STATUS_INVALID_ARGUMENT == static_cast<int32_t>(StatusCode::kInvalidArgument), "");
static_assert(FLASHKDA_STATUS_NOT_SUPPORTED == static_cast<int32_t>(StatusCode::kNotSupported), "");
static_assert(FLASHKDA_STATUS_CUDA_ERROR == static_cast<int32_t>(StatusCode::kCudaError), "");
static_assert(FLASHKDA_STATUS_INTERNAL == static_cast<int32_t>(StatusCode::kInternal), "");
static_assert(FLASHKDA_BACKEND_CPU_REFERENCE == static_cast<int32_t>(Backend::kCpuReference), "");
static_assert(FLASHKDA_BACKEND_CPU_CHUNKED == static_cast<int32_t>(Backend::kCpuChunked), "");
static_assert(FLASHKDA_BACKEND_CUDA == static_cast<int32_t>(Backend::kCuda), "");
static_assert(FLASHKDA_DTYPE_NONE == static_cast<int32_t>(DType::kNone), "");
static_assert(FLASHKDA_DTYPE_BF16 == static_cast<int32_t>(DType::kBF16), "");
static_assert(FLASHKDA_DTYPE_FP32 == static_cast<int32_t>(DType::kFP32), "");
static_assert(FLASHKDA_GATE_SAFE_GATE == static_cast<int32_t>(GateForm::kSafeGate), "");
static_assert(FLASHKDA_GATE_LOG_DECAY == static_cast<int32_t>(GateForm::kLogDecay), "");
static_assert(std::is_same<std::underlying_type<GateForm>::type, int32_t>::value, "");
static_assert(FLASHKDA_INDEX_INT32 == static_cast<int32_t>(IndexType::kInt32), "");
static_assert(FLASHKDA_INDEX_INT64 == static_cast<int32_t>(IndexType::kInt64), "");
static_assert(FLASHKDA_PDL_OFF == static_cast<int32_t>(PdlMode::kOff), "");
static_assert(FLASHKDA_PDL_AUTO == static_cast<int32_t>(PdlMode::kAuto), "");
static_assert(FLASHKDA_PDL_ON == static_cast<int32_t>(PdlMode::kOn), "");
static_assert(std::is_same<std::underlying_type<Backend>::type, int32_t>::value, "");
static_assert(std::is_same<std::underlying_type<DType>::type, int32_t>::value, "");
// Every int32 the C field can hold is then a PdlMode value the cast keeps, for validate_decode to judge.
static_assert(std::is_same<std::underlying_type<PdlMode>::type, int32_t>::value, "");

// ---- the layouts documented in flashkda_c.h (64-bit ABI)
static_assert(std::is_standard_layout<flashkda_forward_args>::value, "");
static_assert(std::is_trivial<flashkda_forward_args>::value, "");
#if UINTPTR_MAX == 0xffffffffffffffffu
static_assert(offsetof(flashkda_forward_args, q) == 0, "");
static_assert(offsetof(flashkda_forward_args, out) == 56, "");
static_assert(offsetof(flashkda_forward_args, cu_seqlens_host) == 88, "");
static_assert(offsetof(flashkda_forward_args, num_seqs) == 96, "");
static_assert(offsetof(flashkda_forward_args, head_dim_v) == 144, "");
static_assert(offsetof(flashkda_forward_args, initial_state_dtype) == 152, "");
static_assert(offsetof(flashkda_forward_args, final_state_dtype) == 156, "");
static_assert(offsetof(flashkda_forward_args, scale) == 160, "");
static_assert(offsetof(flashkda_forward_args, lower_bound) == 164, "");
static_assert(offsetof(flashkda_forward_args, state_pool) == 168, "");
static_assert(offsetof(flashkda_forward_args, pool_size) == 192, "");
static_assert(offsetof(flashkda_forward_args, state_pool_dtype) == 208, "");
static_assert(offsetof(flashkda_forward_args, state_index_type) == 212, "");
static_assert(offsetof(flashkda_forward_args, checkpoints) == 216, "");
static_assert(offsetof(flashkda_forward_args, checkpoints_dtype) == 240, "");
static_assert(offsetof(flashkda_forward_args, slot_checkpoint_offsets) == 248, "");
static_assert(offsetof(flashkda_forward_args, cu_seqlens_int32) == 264, "");
static_assert(offsetof(flashkda_forward_args, q_token_stride) == 272, "");
static_assert(offsetof(flashkda_forward_args, beta_head_stride) == 344, "");
static_assert(offsetof(flashkda_forward_args, summaries_M) == 352, "");
static_assert(offsetof(flashkda_forward_args, summaries_B) == 360, "");
static_assert(offsetof(flashkda_forward_args, resume_from_summaries) == 368, "");
static_assert(offsetof(flashkda_forward_args, states_key_major) == 372, "");
static_assert(offsetof(flashkda_forward_args, gate_form) == 376, "");
static_assert(offsetof(flashkda_forward_args, g_dtype) == 380, "");
static_assert(offsetof(flashkda_forward_args, beta_is_probability) == 384, "");
static_assert(offsetof(flashkda_forward_args, beta_dtype) == 388, "");
static_assert(sizeof(flashkda_forward_args) == 392, "");
static_assert(offsetof(flashkda_decode_args, per_token_states) == 104, "");
static_assert(offsetof(flashkda_decode_args, num_seqs) == 112, "");
static_assert(offsetof(flashkda_decode_args, head_dim_v) == 184, "");
static_assert(offsetof(flashkda_decode_args, state_dtype) == 192, "");
static_assert(offsetof(flashkda_decode_args, lower_bound) == 208, "");
static_assert(offsetof(flashkda_decode_args, gate_form) == 212, "");
static_assert(offsetof(flashkda_decode_args, cu_seqlens_int32) == 216, "");
static_assert(offsetof(flashkda_decode_args, verify_slots) == 224, "");
static_assert(offsetof(flashkda_decode_args, q_token_stride) == 240, "");
static_assert(offsetof(flashkda_decode_args, beta_head_stride) == 312, "");
static_assert(offsetof(flashkda_decode_args, g_dtype) == 320, "");
static_assert(offsetof(flashkda_decode_args, beta_is_probability) == 324, "");
static_assert(offsetof(flashkda_decode_args, beta_dtype) == 328, "");
static_assert(offsetof(flashkda_decode_args, reserved) == 332, "");
static_assert(sizeof(flashkda_decode_args) == 336, "");
static_assert(offsetof(flashkda_segment_summary_args, segments) == 392, "");
static_assert(offsetof(flashkda_segment_summary_args, B) == 416, "");
static_assert(sizeof(flashkda_segment_summary_args) == 424, "");
static_assert(offsetof(flashkda_compose_summaries_args, M1) == 24, "");
static_assert(offsetof(flashkda_compose_summaries_args, stream) == 72, "");
static_assert(sizeof(flashkda_compose_summaries_args) == 80, "");
#endif
static_assert(std::is_standard_layout<flashkda_segment_summary_args>::value, "");
static_assert(std::is_standard_layout<flashkda_compose_summaries_args>::value, "");
static_assert(std::is_standard_layout<flashkda_decode_args>::value, "");
static_assert(std::is_trivial<flashkda_decode_args>::value, "");

thread_local std::string t_last_error;

int32_t record(const Status& s) {
  t_last_error = s.ok() ? std::string() : s.message;
  return static_cast<int32_t>(s.code);
}

int32_t null_args() {
  t_last_error = "args: null pointer";
  return FLASHKDA_STATUS_INVALID_ARGUMENT;
}

// A g or beta dtype of the C structs: 0 (a zero-initialised struct of an older
// ABI) is bf16, as FLASHKDA_DTYPE_BF16 is; any other value is the DType it names
// (validate() refuses the unknown ones and kNone).
DType token_dtype(int32_t c) { return c == 0 ? DType::kBF16 : static_cast<DType>(c); }

// The fields both argument structs share, under the same names: the token
// tensors, the output, the sequence boundaries, head counts and dims, scalars,
// what g and beta hold.
template <class CArgs, class CppArgs>
void copy_shared_fields(const CArgs& c, CppArgs& a) {
  a.q = c.q;
  a.k = c.k;
  a.v = c.v;
  a.g = c.g;
  a.beta = c.beta;
  a.A_log = c.A_log;
  a.dt_bias = c.dt_bias;
  a.out = c.out;
  a.cu_seqlens = c.cu_seqlens;
  a.cu_seqlens_host = c.cu_seqlens_host;
  a.num_seqs = c.num_seqs;
  a.num_heads = c.num_heads;
  a.num_v_heads = c.num_v_heads;
  a.head_dim_k = c.head_dim_k;
  a.head_dim_v = c.head_dim_v;
  a.scale = c.scale;
  a.lower_bound = c.lower_bound;
  a.gate_form = static_cast<GateForm>(c.gate_form);  // unknown values: validate() rejects
  a.g_dtype = token_dtype(c.g_dtype);
  a.beta_is_probability = c.beta_is_probability != 0;
  a.beta_dtype = token_dtype(c.beta_dtype);
}

// The token tensors' strides, under the same names in both argument structs.
template <class CArgs, class CppArgs>
void copy_token_strides(const CArgs& c, CppArgs& a) {
  a.q_token_stride = c.q_token_stride;
  a.q_head_stride = c.q_head_stride;
  a.k_token_stride = c.k_token_stride;
  a.k_head_stride = c.k_head_stride;
  a.v_token_stride = c.v_token_stride;
  a.v_head_stride = c.v_head_stride;
  a.g_token_stride = c.g_token_stride;
  a.g_head_stride = c.g_head_stride;
  a.beta_token_stride = c.beta_token_stride;
  a.beta_head_stride = c.beta_head_stride;
}

ForwardArgs to_cpp(const flashkda_forward_args& c) {
  ForwardArgs a;
  copy_shared_fields(c, a);
  a.initial_state = c.initial_state;
  a.initial_state_dtype = static_cast<DType>(c.initial_state_dtype);  // unknown values: validate() rejects
  a.final_state = c.final_state;
  a.final_state_dtype = static_cast<DType>(c.final_state_dtype);
  a.states_key_major = c.states_key_major != 0;
  a.batch = c.batch;
  a.seqlen = c.seqlen;
  a.state_pool = c.state_pool;
  a.state_pool_dtype = static_cast<DType>(c.state_pool_dtype);
  a.pool_size = c.pool_size;
  a.pool_stride = c.pool_stride;
  a.state_indices = c.state_indices;
  a.state_index_type = static_cast<IndexType>(c.state_index_type);
  a.has_initial_state = c.has_initial_state;
  a.checkpoints = c.checkpoints;
  a.checkpoints_dtype = static_cast<DType>(c.checkpoints_dtype);
  a.checkpoint_interval = c.checkpoint_interval;
  a.checkpoints_capacity = c.checkpoints_capacity;
  a.checkpoints_value_major = c.checkpoints_value_major != 0;
  a.slot_checkpoint_offsets = c.slot_checkpoint_offsets;
  a.slot_checkpoint_slots = c.slot_checkpoint_slots;
  a.cu_seqlens_int32 = c.cu_seqlens_int32;
  copy_token_strides(c, a);
  a.summaries_M = c.summaries_M;
  a.summaries_B = c.summaries_B;
  a.resume_from_summaries = c.resume_from_summaries != 0;
  return a;
}

DecodeArgs to_cpp(const flashkda_decode_args& c) {
  DecodeArgs a;
  copy_shared_fields(c, a);
  a.tokens_per_seq = c.tokens_per_seq;
  a.total_tokens = c.total_tokens;
  a.state_pool = c.state_pool;
  a.state_dtype = static_cast<DType>(c.state_dtype);  // unknown values: validate_decode() rejects
  a.pool_size = c.pool_size;
  a.pool_stride = c.pool_stride;
  a.state_out_pool = c.state_out_pool;
  a.state_out_stride = c.state_out_stride;
  a.state_indices = c.state_indices;
  a.index_type = static_cast<IndexType>(c.index_type);
  a.per_token_states = c.per_token_states;
  // Unknown values: validate_decode() rejects (so an old caller's "nonzero = on" other than 1 is an error, not "on").
  a.programmatic_dependent_launch = static_cast<PdlMode>(c.programmatic_dependent_launch);
  a.cu_seqlens_int32 = c.cu_seqlens_int32;
  a.verify_slots = c.verify_slots;
  a.num_accepted_tokens = c.num_accepted_tokens;
  copy_token_strides(c, a);
  return a;
}

// The C structs' fields that have no C++ counterpart to be checked by: the flags
// are 0 or 1, and the decode struct's `reserved` is 0, so that a later ABI can give
// it a meaning without a caller's leftover value taking it.
Status check_flags(std::initializer_list<std::pair<const char*, int32_t>> flags) {
  for (const auto& [name, flag] : flags)
    if (flag != 0 && flag != 1)
      return Status::Invalid(std::string(name) + ": expected 0 or 1, got " + std::to_string(flag));
  return Status::Ok();
}
Status check_c_fields(const flashkda_forward_args& c) {
  return check_flags({{"checkpoints_value_major", c.checkpoints_value_major},
                      {"resume_from_summaries", c.resume_from_summaries},
                      {"states_key_major", c.states_key_major},
                      {"beta_is_probability", c.beta_is_probability}});
}
Status check_c_fields(const flashkda_decode_args& c) {
  if (c.reserved != 0) return Status::Invalid("reserved: expected 0, got " + std::to_string(c.reserved));
  return check_flags({{"beta_is_probability", c.beta_is_probability}});
}

template <typename Fn>
int32_t guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    t_last_error = std::string("internal error: ") + e.what();
  } catch (...) {
    t_last_error = "internal error: unknown exception";
  }
  return FLASHKDA_STATUS_INTERNAL;
}

}  // namespace

extern "C" {

void flashkda_forward_args_init(flashkda_forward_args* args) {
  if (args == nullptr) return;
  *args = flashkda_forward_args{};
  args->lower_bound = -5.f;
}

int32_t flashkda_validate(const flashkda_forward_args* args, int32_t backend) {
  if (args == nullptr) return null_args();
  if (const Status s = check_c_fields(*args); !s.ok()) return record(s);
  return guarded([&] { return record(flashkda::validate(to_cpp(*args), static_cast<Backend>(backend))); });
}

int32_t flashkda_workspace_size(const flashkda_forward_args* args, int32_t backend, uint64_t* bytes) {
  if (args == nullptr) return null_args();
  if (bytes == nullptr) {
    t_last_error = "bytes: null pointer";
    return FLASHKDA_STATUS_INVALID_ARGUMENT;
  }
  *bytes = 0;  // on every error, as flashkda::workspace_size
  if (const Status s = check_c_fields(*args); !s.ok()) return record(s);
  return guarded([&] {
    size_t n = 0;
    const int32_t code = record(flashkda::workspace_size(to_cpp(*args), static_cast<Backend>(backend), &n));
    *bytes = static_cast<uint64_t>(n);
    return code;
  });
}

int32_t flashkda_forward(const flashkda_forward_args* args, int32_t backend, void* workspace,
                         uint64_t workspace_bytes, void* stream) {
  if (args == nullptr) return null_args();
  if (const Status s = check_c_fields(*args); !s.ok()) return record(s);
  return guarded([&] {
    const size_t ws = workspace_bytes > static_cast<uint64_t>(SIZE_MAX) ? SIZE_MAX
                                                                         : static_cast<size_t>(workspace_bytes);
    return record(flashkda::forward(to_cpp(*args), static_cast<Backend>(backend), workspace, ws, stream));
  });
}

void flashkda_decode_args_init(flashkda_decode_args* args) {
  if (args == nullptr) return;
  *args = flashkda_decode_args{};
  const DecodeArgs defaults;
  args->tokens_per_seq = defaults.tokens_per_seq;
  args->state_dtype = static_cast<int32_t>(defaults.state_dtype);
  args->index_type = static_cast<int32_t>(defaults.index_type);
  args->lower_bound = defaults.lower_bound;
  args->programmatic_dependent_launch = static_cast<int32_t>(defaults.programmatic_dependent_launch);
}

int32_t flashkda_validate_decode(const flashkda_decode_args* args, int32_t backend) {
  if (args == nullptr) return null_args();
  if (const Status s = check_c_fields(*args); !s.ok()) return record(s);
  return guarded([&] { return record(flashkda::validate_decode(to_cpp(*args), static_cast<Backend>(backend))); });
}

int32_t flashkda_decode(const flashkda_decode_args* args, int32_t backend, void* stream) {
  if (args == nullptr) return null_args();
  if (const Status s = check_c_fields(*args); !s.ok()) return record(s);
  return guarded([&] { return record(flashkda::decode(to_cpp(*args), static_cast<Backend>(backend), stream)); });
}

int32_t flashkda_segment_summaries(const flashkda_segment_summary_args* args, int32_t backend) {
  if (args == nullptr) return null_args();
  if (const Status s = check_c_fields(args->inputs); !s.ok()) return record(s);
  return guarded([&] {
    flashkda::SegmentSummaryArgs a;
    a.inputs = to_cpp(args->inputs);
    a.segments = args->segments;
    a.num_segments = args->num_segments;
    a.M = args->M;
    a.B = args->B;
    return record(flashkda::segment_summaries(a, static_cast<Backend>(backend)));
  });
}

int32_t flashkda_compose_summaries(const flashkda_compose_summaries_args* args, int32_t backend) {
  if (args == nullptr) return null_args();
  return guarded([&] {
    flashkda::ComposeSummariesArgs a;
    a.count = args->count;
    a.head_dim_k = args->head_dim_k;
    a.head_dim_v = args->head_dim_v;
    a.M1 = args->M1;
    a.B1 = args->B1;
    a.M2 = args->M2;
    a.B2 = args->B2;
    a.M = args->M;
    a.B = args->B;
    a.stream = args->stream;
    return record(flashkda::compose_summaries(a, static_cast<Backend>(backend)));
  });
}

int32_t flashkda_check_device_faults(void* stream) {
  return guarded([&] { return record(flashkda::check_device_faults(stream)); });
}

int32_t flashkda_cuda_available(void) {
  const int32_t answer = guarded([&] {
    std::string why;
    const bool ok = flashkda::cuda_backend_available(&why);
    t_last_error = ok ? std::string() : why;
    return static_cast<int32_t>(ok ? 1 : 0);
  });
  // The header promises 0 or 1: an internal error is a "no" whose reason guarded() left.
  return answer == 1 ? 1 : 0;
}

const char* flashkda_last_error(void) { return t_last_error.c_str(); }

const char* flashkda_status_string(int32_t code) {
  if (code < FLASHKDA_STATUS_OK || code > FLASHKDA_STATUS_INTERNAL) return "unknown status";
  return flashkda::to_string(static_cast<StatusCode>(code));
}

const char* flashkda_version(void) {
#define FLASHKDA_STR2(x) #x
#define FLASHKDA_STR(x) FLASHKDA_STR2(x)
  return FLASHKDA_STR(FLASHKDA_VERSION_MAJOR) "." FLASHKDA_STR(FLASHKDA_VERSION_MINOR) "." FLASHKDA_STR(
      FLASHKDA_VERSION_PATCH);
#undef FLASHKDA_STR
#undef FLASHKDA_STR2
}

int32_t flashkda_abi_version(void) { return FLASHKDA_C_ABI_VERSION; }

}  // extern "C"
