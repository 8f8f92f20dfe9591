// Segment summaries and their composition on the CPU backends (flashkda.h,
// "Segment summaries"). Arguments reaching here passed validate_segment_summaries.
//   kCpuReference: segment_summary_f64 (the oracle's token steps), rounded to fp32.
//   kCpuChunked:   two runs of the chunked fp32 forward over the segment's tokens:
//                  B = the final state from a zero state with the real v; M = the
//                  final state of K rows started from the identity with v = 0 (the
//                  chunked forward takes any head_dim_v, here K).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/sequences.h"
#include "cpu/cpu_backends.h"
#include "cpu/parallel.h"

namespace flashkda::cpu {

namespace {

int64_t segment_begin(const SegmentSummaryArgs& a, int64_t s) { return a.segments[2 * s]; }
int64_t segment_end(const SegmentSummaryArgs& a, int64_t s) { return a.segments[2 * s + 1]; }

// (I, 0) for every head of summary s: what an empty run does.
void identity_summary(const SegmentSummaryArgs& a, int64_t s) {
  const ForwardArgs& in = a.inputs;
  const int64_t HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  float* M = a.M + s * HV * K * K;
  std::memset(M, 0, static_cast<size_t>(HV * K * K) * sizeof(float));
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t r = 0; r < K; ++r) M[(h * K + r) * K + r] = 1.f;
  std::memset(a.B + s * HV * V * K, 0, static_cast<size_t>(HV * V * K) * sizeof(float));
}

// The forward arguments of the tokens [begin, end) alone, as one sequence.
ForwardArgs segment_forward_args(const ForwardArgs& in, int64_t begin, int64_t end) {
  const int64_t H = in.num_heads, HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  ForwardArgs f;
  f.q = static_cast<const uint16_t*>(in.q) + begin * H * K;
  f.k = static_cast<const uint16_t*>(in.k) + begin * H * K;
  f.v = static_cast<const uint16_t*>(in.v) + begin * HV * V;
  // g and beta in their own dtypes (2 or 4 bytes an element).
  f.g = static_cast<const char*>(in.g) + begin * HV * K * dtype_bytes(in.g_dtype);
  f.beta = static_cast<const char*>(in.beta) + begin * HV * dtype_bytes(in.beta_dtype);
  f.A_log = in.A_log;
  f.dt_bias = in.dt_bias;
  f.gate_form = in.gate_form;
  f.g_dtype = in.g_dtype;
  f.beta_is_probability = in.beta_is_probability;
  f.beta_dtype = in.beta_dtype;
  f.batch = 1;
  f.seqlen = end - begin;
  f.num_heads = H;
  f.num_v_heads = HV;
  f.head_dim_k = K;
  f.head_dim_v = V;
  f.scale = 1.f;  // out is scratch; the state does not depend on scale
  f.lower_bound = in.lower_bound;
  return f;
}

}  // namespace

Status segment_summaries_f64(const SegmentSummaryArgs& a, int num_threads) {
  const ForwardArgs& in = a.inputs;
  const int64_t HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  parallel_for(a.num_segments * HV, num_threads, [&](int64_t task) {
    const int64_t s = task / HV, hv = task % HV;
    const SegmentSummary sum = segment_summary_f64(in, segment_begin(a, s), segment_end(a, s), hv);
    float* M = a.M + (s * HV + hv) * K * K;
    float* B = a.B + (s * HV + hv) * V * K;
    for (int64_t i = 0; i < K * K; ++i) M[i] = static_cast<float>(sum.M[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < V * K; ++i) B[i] = static_cast<float>(sum.B[static_cast<size_t>(i)]);
  });
  return Status::Ok();
}

Status segment_summaries_chunked_f32(const SegmentSummaryArgs& a, int num_threads) {
  const ForwardArgs& in = a.inputs;
  const int64_t HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  // The identity initial state of the M run, shared by every segment.
  std::vector<float> identity(static_cast<size_t>(HV * K * K), 0.f);
  for (int64_t h = 0; h < HV; ++h)
    for (int64_t r = 0; r < K; ++r) identity[static_cast<size_t>((h * K + r) * K + r)] = 1.f;
  // One segment's two forwards, their heads spread over `threads`.
  auto summarise = [&](int64_t s, int threads) -> Status {
    const int64_t begin = segment_begin(a, s), end = segment_end(a, s), len = end - begin;
    if (len == 0) {
      identity_summary(a, s);
      return Status::Ok();
    }
    // B: the segment's own v from a zero state.
    std::vector<uint16_t> out(static_cast<size_t>(len * HV * std::max(K, V)));
    ForwardArgs fb = segment_forward_args(in, begin, end);
    fb.out = out.data();
    fb.final_state = a.B + s * HV * V * K;
    fb.final_state_dtype = DType::kFP32;
    Status st = chunked_forward_f32(fb, threads);
    if (!st.ok()) return st;
    // M: K rows from the identity, v = 0.
    std::vector<uint16_t> zeros(static_cast<size_t>(len * HV * K), 0);
    ForwardArgs fm = segment_forward_args(in, begin, end);
    fm.v = zeros.data();
    fm.head_dim_v = K;
    fm.out = out.data();
    fm.initial_state = identity.data();
    fm.initial_state_dtype = DType::kFP32;
    fm.final_state = a.M + s * HV * K * K;
    fm.final_state_dtype = DType::kFP32;
    return chunked_forward_f32(fm, threads);
  };
  // At least a segment a worker: the segments are the tasks, each forward on one
  // thread (a forward of a few chunks spread over the threads was mostly their
  // set-up: 4096 one-token ranges took 5x the float64 steps' time). Fewer: one
  // segment after another, each spreading its heads.
  const int64_t workers = worker_threads(num_threads);
  if (a.num_segments < workers) {
    for (int64_t s = 0; s < a.num_segments; ++s)
      if (const Status st = summarise(s, num_threads); !st.ok()) return st;
    return Status::Ok();
  }
  std::vector<Status> results(static_cast<size_t>(a.num_segments));
  parallel_for(a.num_segments, num_threads, [&](int64_t s) { results[static_cast<size_t>(s)] = summarise(s, 1); });
  for (const Status& st : results)
    if (!st.ok()) return st;
  return Status::Ok();
}

Status compose_summaries_f64(const ComposeSummariesArgs& a, int num_threads) {
  const int64_t K = a.head_dim_k, V = a.head_dim_v;
  // Each composition reads all of its inputs before writing its outputs, so the
  // outputs may be either input's memory.
  parallel_for(
      a.count, num_threads, [&] { return std::vector<double>(static_cast<size_t>((K + V) * K)); },
      [&](std::vector<double>& acc, int64_t i) {
        const float* M1 = a.M1 + i * K * K;
        const float* B1 = a.B1 + i * V * K;
        const float* M2 = a.M2 + i * K * K;
        const float* B2 = a.B2 + i * V * K;
        // Rows 0..K-1 of acc: M1·M2; rows K..K+V-1: B1·M2 + B2.
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t r = 0; r < K + V; ++r) {
          const float* x = r < K ? M1 + r * K : B1 + (r - K) * K;
          double* y = acc.data() + r * K;
          if (r >= K)
            for (int64_t j = 0; j < K; ++j) y[j] = B2[(r - K) * K + j];
          for (int64_t p = 0; p < K; ++p) {
            const double xp = x[p];
            const float* m2 = M2 + p * K;
            for (int64_t j = 0; j < K; ++j) y[j] += xp * m2[j];
          }
        }
        float* M = a.M + i * K * K;
        float* B = a.B + i * V * K;
        for (int64_t j = 0; j < K * K; ++j) M[j] = static_cast<float>(acc[static_cast<size_t>(j)]);
        for (int64_t j = 0; j < V * K; ++j) B[j] = static_cast<float>(acc[static_cast<size_t>(K * K + j)]);
      });
  return Status::Ok();
}

}  // namespace flashkda::cpu
