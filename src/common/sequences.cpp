#include "common/sequences.h"

namespace flashkda {

int64_t num_sequences(const ForwardArgs& args) {
  return args.cu_seqlens != nullptr || args.cu_seqlens_int32 != nullptr ? args.num_seqs : args.batch;
}

std::vector<SequenceSpan> sequence_spans(const ForwardArgs& args, const int64_t* cu_seqlens_host) {
  std::vector<SequenceSpan> spans;
  if (args.cu_seqlens != nullptr) {
    spans.reserve(static_cast<size_t>(args.num_seqs));
    for (int64_t n = 0; n < args.num_seqs; ++n)
      spans.push_back({cu_seqlens_host[n], cu_seqlens_host[n + 1] - cu_seqlens_host[n]});
  } else {
    spans.reserve(static_cast<size_t>(args.batch));
    for (int64_t b = 0; b < args.batch; ++b) spans.push_back({b * args.seqlen, args.seqlen});
  }
  return spans;
}

namespace {
template <class Args>
bool strided(const Args& a) {
  return a.q_token_stride || a.q_head_stride || a.k_token_stride || a.k_head_stride || a.v_token_stride ||
         a.v_head_stride || a.g_token_stride || a.g_head_stride || a.beta_token_stride || a.beta_head_stride;
}

// tokens x heads rows of `width` elements from a strided view into a dense array.
template <class E>
void densify(const void* src, int64_t token_stride, int64_t head_stride, int64_t tokens, int64_t heads,
             int64_t width, std::vector<E>& dst) {
  const auto* s = static_cast<const E*>(src);
  const int64_t ts = token_stride != 0 ? token_stride : heads * width, hs = head_stride != 0 ? head_stride : width;
  dst.resize(static_cast<size_t>(tokens * heads * width));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t e = 0; e < width; ++e)
        dst[static_cast<size_t>((t * heads + h) * width + e)] = s[t * ts + h * hs + e];
}

// The forward's and decode's token tensors, `tokens` of them, dense in `storage`.
template <class Args>
Args dense(const Args& args, int64_t tokens, DenseInputs& storage) {
  if (!strided(args)) return args;
  const int64_t H = args.num_heads, HV = args.num_v_heads > 0 ? args.num_v_heads : args.num_heads;
  const int64_t K = args.head_dim_k, V = args.head_dim_v;
  Args d = args;
  densify(args.q, args.q_token_stride, args.q_head_stride, tokens, H, K, storage.q);
  densify(args.k, args.k_token_stride, args.k_head_stride, tokens, H, K, storage.k);
  densify(args.v, args.v_token_stride, args.v_head_stride, tokens, HV, V, storage.v);
  d.q = storage.q.data();
  d.k = storage.k.data();
  d.v = storage.v.data();
  // g and beta in their own dtype (bf16 or fp32).
  if (args.g_dtype == DType::kFP32) {
    densify(args.g, args.g_token_stride, args.g_head_stride, tokens, HV, K, storage.g_fp32);
    d.g = storage.g_fp32.data();
  } else {
    densify(args.g, args.g_token_stride, args.g_head_stride, tokens, HV, K, storage.g);
    d.g = storage.g.data();
  }
  if (args.beta_dtype == DType::kFP32) {
    densify(args.beta, args.beta_token_stride, args.beta_head_stride, tokens, HV, 1, storage.beta_fp32);
    d.beta = storage.beta_fp32.data();
  } else {
    densify(args.beta, args.beta_token_stride, args.beta_head_stride, tokens, HV, 1, storage.beta);
    d.beta = storage.beta.data();
  }
  d.q_token_stride = d.q_head_stride = d.k_token_stride = d.k_head_stride = 0;
  d.v_token_stride = d.v_head_stride = d.g_token_stride = d.g_head_stride = 0;
  d.beta_token_stride = d.beta_head_stride = 0;
  return d;
}
}  // namespace

bool has_strided_inputs(const ForwardArgs& a) { return strided(a); }
bool has_strided_inputs(const DecodeArgs& a) { return strided(a); }
ForwardArgs with_dense_inputs(const ForwardArgs& args, DenseInputs& storage) {
  return dense(args, args.batch * args.seqlen, storage);
}
DecodeArgs with_dense_inputs(const DecodeArgs& args, DenseInputs& storage) {
  return dense(args, args.total_tokens, storage);
}

namespace {
template <class Args>
Args widen(const Args& args, std::vector<int64_t>& storage) {
  if (args.cu_seqlens_int32 == nullptr) return args;
  storage.assign(args.cu_seqlens_int32, args.cu_seqlens_int32 + args.num_seqs + 1);
  Args wide = args;
  wide.cu_seqlens = storage.data();
  wide.cu_seqlens_int32 = nullptr;
  return wide;
}
}  // namespace

ForwardArgs with_int64_cu_seqlens(const ForwardArgs& args, std::vector<int64_t>& storage) {
  return widen(args, storage);
}

ForwardArgs as_host_inputs(const ForwardArgs& args, HostInputs& storage) {
  return with_dense_inputs(with_int64_cu_seqlens(args, storage.cu_seqlens), storage.dense);
}

std::vector<int64_t> checkpoint_offsets(const std::vector<SequenceSpan>& spans, int64_t interval) {
  std::vector<int64_t> off(spans.size() + 1, 0);
  for (size_t n = 0; n < spans.size(); ++n) off[n + 1] = off[n] + checkpoints_of(spans[n].length, interval);
  return off;
}
DecodeArgs with_int64_cu_seqlens(const DecodeArgs& args, std::vector<int64_t>& storage) {
  return widen(args, storage);
}

}  // namespace flashkda
