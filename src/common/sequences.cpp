#include "common/sequences.h"

namespace flashkda {

int64_t num_sequences(const ForwardArgs& args) {
  return args.cu_seqlens != nullptr ? args.num_seqs : args.batch;
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

ForwardArgs with_int64_cu_seqlens(const ForwardArgs& args, std::vector<int64_t>& storage) {
  if (args.cu_seqlens_int32 == nullptr) return args;
  storage.assign(args.cu_seqlens_int32, args.cu_seqlens_int32 + args.num_seqs + 1);
  ForwardArgs wide = args;
  wide.cu_seqlens = storage.data();
  wide.cu_seqlens_int32 = nullptr;
  return wide;
}

}  // namespace flashkda
