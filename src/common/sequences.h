// The sequences of one call: which tokens each one owns. Shared by every backend
// so that "sequence n" means the same thing everywhere.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "flashkda/flashkda.h"

namespace flashkda {

struct SequenceSpan {
  int64_t token_begin = 0;  // index into the flattened [B*T] token axis
  int64_t length = 0;
};

// Whether a decode call is a speculative verify: state_indices [N, C] with C >= 2, or
// with C = 1 and num_accepted_tokens (fla's serving form with no draft tokens; then
// it is a plain decode step whose counts must be 1, checked as in any verify).
inline bool speculative_verify(const DecodeArgs& a) {
  return a.verify_slots >= 2 || (a.verify_slots == 1 && a.num_accepted_tokens != nullptr);
}

// Entry n of an int32 or int64 index array in host memory (slot indices,
// num_accepted_tokens).
inline int64_t index_at(const void* indices, IndexType type, int64_t n) {
  return type == IndexType::kInt64 ? static_cast<const int64_t*>(indices)[n] : static_cast<const int32_t*>(indices)[n];
}

// Number of sequences N (num_seqs with cu_seqlens, else B).
int64_t num_sequences(const ForwardArgs& args);

// The spans of all N sequences. `cu_seqlens_host` must be a host copy of the
// boundaries when args.cu_seqlens is set (validated beforehand), else ignored.
std::vector<SequenceSpan> sequence_spans(const ForwardArgs& args, const int64_t* cu_seqlens_host);

// `args` with int32 boundaries (cu_seqlens_int32) widened into `storage` and
// given as cu_seqlens; `args` unchanged without them. Host memory only (the CPU
// backends); num_seqs must be >= 1.
ForwardArgs with_int64_cu_seqlens(const ForwardArgs& args, std::vector<int64_t>& storage);
DecodeArgs with_int64_cu_seqlens(const DecodeArgs& args, std::vector<int64_t>& storage);

// Bytes of one element of a tensor of dtype `d` (kBF16 or kFP32).
inline int64_t dtype_bytes(DType d) { return d == DType::kFP32 ? 4 : 2; }

// `args` with strided token tensors (q, k, v, g, beta) copied densely into
// `storage` (one buffer per tensor; g and beta in their own dtype); `args`
// unchanged when all five are dense. Host memory only (the CPU backends).
struct DenseInputs {
  std::vector<uint16_t> q, k, v, g, beta;
  std::vector<float> g_fp32, beta_fp32;
};
ForwardArgs with_dense_inputs(const ForwardArgs& args, DenseInputs& storage);
DecodeArgs with_dense_inputs(const DecodeArgs& args, DenseInputs& storage);
bool has_strided_inputs(const ForwardArgs& args);
bool has_strided_inputs(const DecodeArgs& args);

// One token tensor as ForwardArgs / DecodeArgs give it: its strides as given (0:
// dense), the same with "0 means dense" resolved (both in elements), its heads,
// row width and bytes an element (2 for bf16; g and beta may be fp32).
struct TokenView {
  const char* name;  // "q", "k", "v", "g", "beta"
  int64_t given_token_stride, given_head_stride;
  int64_t token_stride, head_stride;
  int64_t heads, width;
  int64_t elem_bytes;
};
// q, k, v, g, beta of `a` (H q/k heads, HV value heads, head dims K, V).
template <class Args>
std::array<TokenView, 5> token_views(const Args& a, int64_t H, int64_t HV, int64_t K, int64_t V) {
  auto view = [](const char* name, int64_t ts, int64_t hs, int64_t heads, int64_t width, int64_t elem_bytes) {
    return TokenView{name, ts, hs, ts != 0 ? ts : heads * width, hs != 0 ? hs : width, heads, width, elem_bytes};
  };
  return {view("q", a.q_token_stride, a.q_head_stride, H, K, 2), view("k", a.k_token_stride, a.k_head_stride, H, K, 2),
          view("v", a.v_token_stride, a.v_head_stride, HV, V, 2),
          view("g", a.g_token_stride, a.g_head_stride, HV, K, dtype_bytes(a.g_dtype)),
          view("beta", a.beta_token_stride, a.beta_head_stride, HV, 1, dtype_bytes(a.beta_dtype))};
}

// The views' resolved strides into the CUDA kernels' 32-bit parameters, {token,
// head} for q, k, v, g, beta in turn; the callers check them below 2^31 first.
inline void store_strides32(const std::array<TokenView, 5>& views, int32_t* const (&fields)[5][2]) {
  for (int i = 0; i < 5; ++i) {
    *fields[i][0] = static_cast<int32_t>(views[i].token_stride);
    *fields[i][1] = static_cast<int32_t>(views[i].head_stride);
  }
}

// Both of the above: the arguments as the CPU backends read them (int64
// boundaries, dense token tensors), backed by `storage`.
struct HostInputs {
  std::vector<int64_t> cu_seqlens;
  DenseInputs dense;
};
ForwardArgs as_host_inputs(const ForwardArgs& args, HostInputs& storage);

// Checkpoints (ForwardArgs::checkpoints): ceil(length / interval) per sequence,
// and where each sequence's entries start (Σ over the sequences before it; the
// total at [N]).
// ceil(length / interval) for length >= 0, interval >= 1, without forming length + interval - 1
// (which overflows int64 for an interval near 2^63).
inline int64_t checkpoints_of(int64_t length, int64_t interval) {
  return length <= 0 ? 0 : (length - 1) / interval + 1;
}
std::vector<int64_t> checkpoint_offsets(const std::vector<SequenceSpan>& spans, int64_t interval);

// HV, resolving the "0 means H" convention.
inline int64_t value_heads(const ForwardArgs& args) {
  return args.num_v_heads > 0 ? args.num_v_heads : args.num_heads;
}

}  // namespace flashkda
