// flashkda::segment_summaries / compose_summaries: validation, then dispatch to a
// CPU backend, or for segment_summaries to kCuda (sm90/sm90_summaries.cu: its
// ranges and cu_seqlens are copied to the host and checked here, as the CPU
// backends' are), and for compose_summaries to kCuda (sm90/sm90_compose_summaries.cu).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "api/guarded.h"
#include "api/overlap.h"
#include "api/validation_util.h"
#include "common/sequences.h"
#include "cpu/cpu_backends.h"
#include "flashkda/flashkda.h"
#include "api/forward_internal.h"
#include "sm90/sm90_forward.h"

namespace flashkda {
using api::guarded;
using namespace validation;

namespace {

// The token inputs as validate() checks them: the summary reads no out and no
// states, so those are left out of the check (out pointed at v, states absent).
Status validate_inputs(const ForwardArgs& in, Backend backend) {
  ForwardArgs f = in;
  f.out = const_cast<void*>(in.v);
  f.initial_state = nullptr;
  f.initial_state_dtype = DType::kNone;
  f.final_state = nullptr;
  f.final_state_dtype = DType::kNone;
  f.states_key_major = false;
  f.state_pool = nullptr;
  f.state_pool_dtype = DType::kNone;
  f.state_indices = nullptr;
  f.has_initial_state = nullptr;
  f.checkpoints = nullptr;
  f.checkpoints_dtype = DType::kNone;
  f.checkpoint_interval = 0;
  f.checkpoints_capacity = 0;
  f.slot_checkpoint_offsets = nullptr;
  f.slot_checkpoint_slots = nullptr;
  f.summaries_M = nullptr;
  f.summaries_B = nullptr;
  f.resume_from_summaries = false;
  f.scale = 1.f;
  return api::validate_without_overlaps(f, backend);
}

// kCuda's device-resident ranges and cu_seqlens, copied to the host for the checks
// (and the ranges for the launches).
struct HostCopies {
  std::vector<int64_t> segments, cu_seqlens;
};

Status validate_segment_summaries(const SegmentSummaryArgs& a, Backend backend, HostCopies* host) {
  if (const Status s = check_backend(backend); !s.ok()) return s;
  const bool cuda = backend == Backend::kCuda;
  Status st = validate_inputs(a.inputs, backend);
  if (!st.ok()) return st;
  std::vector<int64_t> wide;
  ForwardArgs in = cuda ? a.inputs : with_int64_cu_seqlens(a.inputs, wide);
  const int64_t HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  const int64_t S = a.num_segments;
  if (S < 0) return Status::Invalid(cat("num_segments: expected a value >= 0, got ", S));
  int64_t n_seg = 0, n_m = 0, n_b = 0;
  if (!tensor_fits({S, 2}, 8, &n_seg) || !tensor_fits({S, HV, K, K}, 4, &n_m) || !tensor_fits({S, HV, V, K}, 4, &n_b))
    return Status::Invalid(cat("num_segments: ", S, " summaries of [", HV, ", ", K, ", ", K,
                               "] overflow int64 element counts"));
  if (S == 0) return Status::Ok();
  if (a.segments == nullptr) return Status::Invalid("segments: null pointer");
  if (a.M == nullptr) return Status::Invalid("M: null pointer");
  if (a.B == nullptr) return Status::Invalid("B: null pointer");
  if (!aligned(a.segments, 8)) return Status::Invalid("segments: expected an 8-byte aligned pointer");
  // kCuda writes each range's summaries as a forward's summaries_M / summaries_B.
  const uintptr_t out_align = cuda ? 16 : 4;
  if (!aligned(a.M, out_align)) return Status::Invalid(cat("M: expected a ", out_align, "-byte aligned pointer"));
  if (!aligned(a.B, out_align)) return Status::Invalid(cat("B: expected a ", out_align, "-byte aligned pointer"));
  // M and B against the token inputs, the ranges and each other (api/overlap.h).
  std::vector<ArgBytes> read = forward_input_bytes(a.inputs);
  read.push_back(dense_bytes("segments", a.segments, n_seg * 8));
  st = check_overlaps({dense_bytes("M", a.M, n_m * 4), dense_bytes("B", a.B, n_b * 4)}, read);
  if (!st.ok()) return st;

  // Every segment inside one sequence, each checked against the sequence its first
  // token is in. The CPU backends read host memory; kCuda's values are copied here.
  const int64_t* segments = a.segments;
  if (cuda) {
    host->segments.resize(static_cast<size_t>(2 * S));
    st = sm90::copy_to_host(host->segments.data(), a.segments, host->segments.size() * 8);
    if (!st.ok()) return st;
    segments = host->segments.data();
    const int64_t N = num_sequences(in);
    if (in.cu_seqlens != nullptr || in.cu_seqlens_int32 != nullptr) {
      host->cu_seqlens.resize(static_cast<size_t>(N + 1));
      if (in.cu_seqlens != nullptr) {
        st = sm90::copy_to_host(host->cu_seqlens.data(), in.cu_seqlens, host->cu_seqlens.size() * 8);
      } else {
        std::vector<int32_t> narrow(static_cast<size_t>(N + 1));
        st = sm90::copy_to_host(narrow.data(), in.cu_seqlens_int32, narrow.size() * 4);
        std::copy(narrow.begin(), narrow.end(), host->cu_seqlens.begin());
      }
      if (!st.ok()) return st;
      // As validate() checks a host copy: the spans below assume valid boundaries.
      st = check_host_boundaries("cu_seqlens", host->cu_seqlens.data(), N, in.batch * in.seqlen);
      if (!st.ok()) return st;
      in.cu_seqlens = host->cu_seqlens.data();
      in.cu_seqlens_int32 = nullptr;
    }
  }
  const std::vector<SequenceSpan> spans = sequence_spans(in, in.cu_seqlens);
  const int64_t total = in.batch * in.seqlen;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t b = segments[2 * s], e = segments[2 * s + 1];
    if (b < 0 || e < b || e > total)
      return Status::Invalid(cat("segments: segment ", s, " = [", b, ", ", e,
                                 "): expected 0 <= begin <= end <= B*T = ", total));
    if (b == e) continue;
    // The sequence holding token b: the last one starting at or before it (an
    // empty sequence starts where the next one does, so that one is last).
    const auto it = std::upper_bound(spans.begin(), spans.end(), b, [](int64_t t, const SequenceSpan& sp) {
      return t < sp.token_begin;
    });
    const int64_t n = static_cast<int64_t>(it - spans.begin()) - 1;  // >= 0: spans[0] starts at 0 <= b
    const SequenceSpan& sp = spans[static_cast<size_t>(n)];
    if (e > sp.token_begin + sp.length)
      return Status::Invalid(cat("segments: segment ", s, " = [", b, ", ", e, ") runs past the end of sequence ", n,
                                 " (tokens [", sp.token_begin, ", ", sp.token_begin + sp.length,
                                 ")); expected every segment inside one sequence"));
  }
  return Status::Ok();
}

Status validate_compose(const ComposeSummariesArgs& a, Backend backend) {
  if (const Status s = check_backend(backend); !s.ok()) return s;
  if (a.count < 0) return Status::Invalid(cat("count: expected a value >= 0, got ", a.count));
  const int64_t max_dim = backend == Backend::kCuda ? sm90::kCudaMaxComposeDim : kCpuMaxHeadDim;
  if (const Status s = check_head_dims(a.head_dim_k, a.head_dim_v, max_dim,
                                       [&] { return cat("the composition on backend ", to_string(backend)); });
      !s.ok())
    return s;
  int64_t n = 0;
  if (!tensor_fits({a.count, a.head_dim_k + a.head_dim_v, a.head_dim_k}, 4, &n))
    return Status::Invalid(cat("count: ", a.count, " summaries overflow int64 element counts"));
  if (a.count == 0) return Status::Ok();
  const struct {
    const char* name;
    const void* p;
  } ptrs[] = {{"M1", a.M1}, {"B1", a.B1}, {"M2", a.M2}, {"B2", a.B2}, {"M", a.M}, {"B", a.B}};
  for (const auto& x : ptrs) {
    if (x.p == nullptr) return Status::Invalid(cat(x.name, ": null pointer"));
    if (!aligned(x.p, 4)) return Status::Invalid(cat(x.name, ": expected a 4-byte aligned pointer"));
  }
  // An output is one of its own kind's inputs itself (in place) or shares no byte with
  // any input or the other output: a partial overlap would read what was just written.
  const int64_t m_bytes = a.count * a.head_dim_k * a.head_dim_k * 4, b_bytes = a.count * a.head_dim_v * a.head_dim_k * 4;
  struct Span {
    const char* name;
    uintptr_t p;
    uintptr_t bytes;
    bool is_m;  // an M (else a B)
  };
  auto span = [&](const char* name, const void* p, bool is_m) {
    return Span{name, reinterpret_cast<uintptr_t>(p), static_cast<uintptr_t>(is_m ? m_bytes : b_bytes), is_m};
  };
  auto overlap = [](const Span& x, const Span& y) { return x.p < y.p + y.bytes && y.p < x.p + x.bytes; };
  const Span inputs[] = {span("M1", a.M1, true), span("B1", a.B1, false), span("M2", a.M2, true),
                         span("B2", a.B2, false)};
  const Span outs[] = {span("M", a.M, true), span("B", a.B, false)};
  for (const Span& o : outs)
    for (const Span& in : inputs)
      if (!(in.is_m == o.is_m && in.p == o.p) && overlap(o, in))
        return Status::Invalid(cat(o.name, ": overlaps ", in.name, "; expected ", o.is_m ? "M1 or M2" : "B1 or B2",
                                   " itself (in place) or memory apart from the inputs"));
  if (overlap(outs[0], outs[1])) return Status::Invalid("M, B: the two outputs overlap");
  if (backend == Backend::kCuda) {
    std::string why;
    if (!sm90::device_supported(&why)) return Status::NotSupported(why);
  }
  return Status::Ok();
}

}  // namespace

Status segment_summaries(const SegmentSummaryArgs& args_in, Backend backend) {
  return guarded(backend, "segment_summaries", [&]() -> Status {
    HostCopies host;
    Status st = validate_segment_summaries(args_in, backend, &host);
    if (!st.ok() || args_in.num_segments == 0) return st;
    if (backend == Backend::kCuda) return sm90::segment_summaries(args_in, host.segments.data());
    HostInputs storage;
    SegmentSummaryArgs args = args_in;
    args.inputs = as_host_inputs(args_in.inputs, storage);
    return backend == Backend::kCpuReference ? cpu::segment_summaries_f64(args)
                                             : cpu::segment_summaries_chunked_f32(args);
  });
}

Status compose_summaries(const ComposeSummariesArgs& args, Backend backend) {
  return guarded(backend, "compose_summaries", [&]() -> Status {
    Status st = validate_compose(args, backend);
    if (!st.ok() || args.count == 0) return st;
    if (backend == Backend::kCuda) return sm90::compose_summaries(args);
    return cpu::compose_summaries_f64(args);
  });
}

}  // namespace flashkda
