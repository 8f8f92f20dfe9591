// Segment summaries of given token ranges on kCuda (flashkda::segment_summaries).
// A range [b, e) of one sequence is summarised by a forward's summaries call over
// exactly those tokens (a one-sequence forward whose token pointers start at b):
// the kernels chunk it from b, as the CPU twins do (cpu/segment_summaries), and
// pass 1 plus the composition give its (M, B) in fp32. An empty range is (I, 0).
// The calls run one after the other on the legacy default stream, with one
// workspace sized for the longest range; the entry returns when they are done
// (it is not a hot-path call: its ranges came from device memory through a copy).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "common/sequences.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

Status cuda_error(cudaError_t err, const char* what) {
  return {StatusCode::kCudaError, std::string("backend kCuda: segment_summaries: ") + what + ": " +
                                      cudaGetErrorString(err)};
}

// The one-sequence summaries call over tokens [b, b + len) of `in`.
ForwardArgs range_call(const ForwardArgs& in, int64_t b, int64_t len, float* M, float* B) {
  const int64_t H = in.num_heads, HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  // Token b of each token tensor (strides resolved, in its own element size).
  const std::array<TokenView, 5> views = token_views(in, H, HV, K, V);
  auto at = [b](const void* p, const TokenView& x) -> const void* {
    return static_cast<const char*>(p) + b * x.token_stride * x.elem_bytes;
  };
  ForwardArgs f = in;
  f.q = at(in.q, views[0]);
  f.k = at(in.k, views[1]);
  f.v = at(in.v, views[2]);
  f.g = at(in.g, views[3]);
  f.beta = at(in.beta, views[4]);
  f.batch = 1;
  f.seqlen = len;
  f.num_seqs = 0;
  f.cu_seqlens = nullptr;
  f.cu_seqlens_int32 = nullptr;
  f.cu_seqlens_host = nullptr;
  f.out = nullptr;
  f.initial_state = f.final_state = nullptr;
  f.initial_state_dtype = f.final_state_dtype = DType::kNone;
  f.states_key_major = false;
  f.summaries_M = M;
  f.summaries_B = B;
  f.resume_from_summaries = false;
  f.scale = 1.f;  // unused by the summaries (the caller's may be any value)
  return f;
}

}  // namespace

Status copy_to_host(void* dst, const void* src, size_t bytes) {
  const cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  return err == cudaSuccess ? Status::Ok() : cuda_error(err, "copying device arguments to the host");
}

Status segment_summaries(const SegmentSummaryArgs& a, const int64_t* segs) {
  const ForwardArgs& in = a.inputs;
  const int64_t HV = value_heads(in), K = in.head_dim_k, V = in.head_dim_v;
  const int64_t S = a.num_segments;
  // One workspace for every call: the largest any range needs (a summaries call
  // plans from its shape alone, so its size grows with the range's length).
  size_t ws_bytes = 0;
  int64_t longest = 0;
  for (int64_t s = 0; s < S; ++s) longest = std::max(longest, segs[2 * s + 1] - segs[2 * s]);
  if (longest > 0) {
    Status st = flashkda::workspace_size(range_call(in, 0, longest, a.M, a.B), Backend::kCuda, &ws_bytes);
    if (!st.ok()) return st;
  }
  void* ws = nullptr;
  if (ws_bytes > 0) {
    const cudaError_t err = cudaMalloc(&ws, ws_bytes);
    if (err != cudaSuccess) return cuda_error(err, "allocating the workspace");
  }
  std::vector<float> identity;  // (I, 0) of an empty range, built on first use
  Status st = Status::Ok();
  for (int64_t s = 0; s < S && st.ok(); ++s) {
    const int64_t b = segs[2 * s], len = segs[2 * s + 1] - b;
    float* M = a.M + s * HV * K * K;
    float* B = a.B + s * HV * V * K;
    if (len == 0) {
      if (identity.empty()) {
        identity.assign(static_cast<size_t>(HV * K * K), 0.f);
        for (int64_t h = 0; h < HV; ++h)
          for (int64_t i = 0; i < K; ++i) identity[static_cast<size_t>((h * K + i) * K + i)] = 1.f;
      }
      cudaError_t err = cudaMemcpy(M, identity.data(), identity.size() * 4, cudaMemcpyHostToDevice);
      if (err == cudaSuccess) err = cudaMemset(B, 0, static_cast<size_t>(HV * V * K) * 4);
      if (err != cudaSuccess) st = cuda_error(err, "writing an empty range's (I, 0)");
      continue;
    }
    const ForwardArgs f = range_call(in, b, len, M, B);
    size_t need = 0;
    st = flashkda::workspace_size(f, Backend::kCuda, &need);
    if (st.ok() && need > ws_bytes) st = Status::Invalid("segment_summaries: a range needs more workspace than the longest");
    if (st.ok()) st = flashkda::forward(f, Backend::kCuda, ws, ws_bytes, nullptr);
  }
  const cudaError_t done = cudaDeviceSynchronize();
  if (ws != nullptr) cudaFree(ws);
  if (!st.ok()) return st;
  return done == cudaSuccess ? Status::Ok() : cuda_error(done, "running the summaries calls");
}

}  // namespace flashkda::sm90
