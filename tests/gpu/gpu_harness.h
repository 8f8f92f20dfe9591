// Runs a HostProblem on the CUDA backend and on the float64 oracle, and judges
// the GPU result. Shared by the GPU tests and the device sanity runs.
#pragma once
#include <string>

#include "flashkda/flashkda.h"
#include "tests/common/accuracy_bars.h"

// Skips the test, saying why, when the CUDA backend cannot run here. A macro, not
// a function: GTEST_SKIP returns from the function it is written in.
#define SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                   \
    std::string why_no_gpu;                                                              \
    if (!::flashkda::cuda_backend_available(&why_no_gpu)) GTEST_SKIP() << "no GPU run: " << why_no_gpu; \
  } while (0)

#ifdef FLASHKDA_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_backends.h"
#include "flashkda/flashkda.h"
#include "tests/common/kda_problem.h"

namespace flashkda::testing {

#define FKDA_CUDA_CHECK(expr)                                                                      \
  do {                                                                                             \
    cudaError_t _e = (expr);                                                                       \
    if (_e != cudaSuccess)                                                                         \
      throw std::runtime_error(std::string(#expr) + " failed: " + cudaGetErrorString(_e));         \
  } while (0)

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (count) FKDA_CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T)));
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (n) FKDA_CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    if (n) FKDA_CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// A device allocation with `guard` bytes of a sentinel on either side of the
// payload (which starts 256-byte aligned, as a workspace must), optionally
// initialised from the host. damaged() counts the sentinel bytes a kernel changed.
struct GuardedDeviceBuffer {
  static constexpr uint8_t kSentinel = 0xA5;
  static constexpr size_t kGuard = 1 << 16;  // a multiple of 256: the payload stays 256-byte aligned
  DeviceBuffer<uint8_t> raw;
  size_t bytes;
  explicit GuardedDeviceBuffer(size_t payload) : raw(payload + 2 * kGuard), bytes(payload) {
    FKDA_CUDA_CHECK(cudaMemset(raw.ptr, kSentinel, raw.n));
  }
  explicit GuardedDeviceBuffer(const std::vector<uint8_t>& payload) : GuardedDeviceBuffer(payload.size()) {
    if (bytes) FKDA_CUDA_CHECK(cudaMemcpy(data(), payload.data(), bytes, cudaMemcpyHostToDevice));
  }
  uint8_t* data() const { return raw.ptr + kGuard; }
  size_t damaged() const {
    const std::vector<uint8_t> h = raw.to_host();
    size_t bad = 0;
    for (size_t i = 0; i < kGuard; ++i) bad += (h[i] != kSentinel) + (h[kGuard + bytes + i] != kSentinel);
    return bad;
  }
};

// The final state as floats whatever its dtype (empty when absent).
struct RunResult {
  Status status;
  std::vector<float> out;
  std::vector<float> final_state;
  std::vector<uint16_t> out_bits;  // raw bf16, for bitwise comparisons
  std::vector<uint8_t> state_bytes;
};

inline size_t state_bytes(const HostProblem& p, DType t) {
  return t == DType::kNone ? 0 : p.state_elems() * (t == DType::kFP32 ? 4 : 2);
}

inline std::vector<float> state_to_float(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<float> f;
  if (t == DType::kFP32) {
    f.resize(bytes.size() / 4);
    std::memcpy(f.data(), bytes.data(), bytes.size());
  } else if (t == DType::kBF16) {
    f.resize(bytes.size() / 2);
    for (size_t i = 0; i < f.size(); ++i) {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      f[i] = bf16_to_float(b);
    }
  }
  return f;
}

template <class T>
std::vector<uint8_t> as_bytes(const std::vector<T>& x) {
  std::vector<uint8_t> b(x.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), x.data(), b.size());
  return b;
}

// forward(a) on kCuda with a fresh workspace of its size, synchronised.
inline Status run_forward(const ForwardArgs& a) {
  size_t ws_bytes = 0;
  Status s = workspace_size(a, Backend::kCuda, &ws_bytes);
  if (!s.ok()) return s;
  DeviceBuffer<uint8_t> ws(ws_bytes);
  s = forward(a, Backend::kCuda, ws.ptr, ws_bytes, nullptr);
  if (s.ok()) FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  return s;
}

// Runs the problem on the GPU. Outputs are poisoned with NaN first (0xFF bytes),
// so an element the kernel never wrote stays NaN and fails every error bar.
// graph_replays > 0: the forward is captured into a CUDA graph on a new stream
// and the graph replayed that many times, the outputs poisoned before each
// replay (so the result is the last replay's, on a reused workspace).
// split: the forward as the two calls of a context-parallel one (ForwardArgs::
// summaries_M, then resume_from_summaries on the same workspace); the summaries
// call's (M, B) come back in *split. states_key_major: p's states are [N, HV, K, V]
// (ForwardArgs::states_key_major), and so is the result's. state_in_place: the final
// state goes over the initial state's buffer (final_state == initial_state, an
// engine's in-place update; the two dtypes must match; not with graph replays,
// each of which would advance the state again), read back from there.
struct SplitSummaries {
  std::vector<float> M, B;  // [N, HV, K, K], [N, HV, V, K]
};
inline RunResult run_cuda(const HostProblem& p, void* stream = nullptr, int graph_replays = 0,
                          SplitSummaries* split = nullptr, bool states_key_major = false,
                          bool state_in_place = false) {
  DeviceBuffer<uint16_t> q(p.q), k(p.k), v(p.v), g(p.g), beta(p.beta);
  DeviceBuffer<float> A_log(p.A_log), dt_bias(p.dt_bias), g_f32(p.g_f32), beta_f32(p.beta_f32);
  DeviceBuffer<int64_t> cu(p.cu_seqlens);
  DeviceBuffer<uint16_t> init_bf16(p.init_bf16);
  DeviceBuffer<float> init_f32(p.init_f32);
  DeviceBuffer<uint16_t> out(p.out_elems());
  const size_t fs_bytes = state_bytes(p, p.spec.final_state);
  DeviceBuffer<uint8_t> final_state(fs_bytes);
  if (out.n) FKDA_CUDA_CHECK(cudaMemset(out.ptr, 0xFF, out.n * 2));
  if (fs_bytes) FKDA_CUDA_CHECK(cudaMemset(final_state.ptr, 0xFF, fs_bytes));
  // The poison is set on the legacy stream, which a non-blocking `stream` does
  // not wait for: without this the kernels' results could be overwritten by it.
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());

  ForwardArgs a = p.host_args(out.ptr, final_state.ptr);
  a.states_key_major = states_key_major;
  a.q = q.ptr; a.k = k.ptr; a.v = v.ptr; a.g = g.ptr; a.beta = beta.ptr;
  if (p.g_dtype == DType::kFP32) a.g = g_f32.ptr;
  if (p.beta_dtype == DType::kFP32) a.beta = beta_f32.ptr;
  if (p.gate_form == GateForm::kSafeGate) {  // the log decay reads neither: host_args left them null
    a.A_log = A_log.ptr;
    a.dt_bias = dt_bias.ptr;
  }
  if (p.spec.initial_state == DType::kBF16) a.initial_state = init_bf16.ptr;
  if (p.spec.initial_state == DType::kFP32) a.initial_state = init_f32.ptr;
  RunResult r;
  if (state_in_place) {
    if (p.spec.initial_state == DType::kNone || p.spec.initial_state != p.spec.final_state) {
      r.status = Status::Invalid("run_cuda: state_in_place needs initial and final states of one dtype");
      return r;
    }
    if (graph_replays > 0) {  // each replay would advance the state again: not one call's result
      r.status = Status::Invalid("run_cuda: state_in_place with graph_replays");
      return r;
    }
    a.final_state = const_cast<void*>(a.initial_state);
  }
  if (!p.cu_seqlens.empty()) {
    a.cu_seqlens = cu.ptr;
    a.cu_seqlens_host = p.cu_seqlens.data();
  }
  size_t ws_bytes = 0;
  a.resume_from_summaries = split != nullptr;  // the split calls plan (and size) their own workspace
  r.status = workspace_size(a, Backend::kCuda, &ws_bytes);
  if (!r.status.ok()) return r;
  DeviceBuffer<uint8_t> ws(ws_bytes);
  if (graph_replays > 0) {
    cudaStream_t s = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    FKDA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    FKDA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    r.status = forward(a, Backend::kCuda, ws.ptr, ws_bytes, s);
    FKDA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    if (r.status.ok()) {
      FKDA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < graph_replays; ++i) {
        if (out.n) FKDA_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0xFF, out.n * 2, s));
        if (fs_bytes) FKDA_CUDA_CHECK(cudaMemsetAsync(final_state.ptr, 0xFF, fs_bytes, s));
        FKDA_CUDA_CHECK(cudaGraphLaunch(exec, s));
      }
      FKDA_CUDA_CHECK(cudaStreamSynchronize(s));
      FKDA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    }
    FKDA_CUDA_CHECK(cudaGraphDestroy(graph));
    FKDA_CUDA_CHECK(cudaStreamDestroy(s));
  } else if (split != nullptr) {
    DeviceBuffer<float> M(static_cast<size_t>(p.N * p.HV * p.K * p.K)), B(p.state_elems());
    FKDA_CUDA_CHECK(cudaMemset(M.ptr, 0xFF, M.n * 4));
    FKDA_CUDA_CHECK(cudaMemset(B.ptr, 0xFF, B.n * 4));
    FKDA_CUDA_CHECK(cudaDeviceSynchronize());  // before the calls on `stream` (above)
    ForwardArgs sa = a;
    sa.resume_from_summaries = false;
    sa.out = nullptr;
    sa.initial_state = sa.final_state = nullptr;
    sa.initial_state_dtype = sa.final_state_dtype = DType::kNone;
    sa.summaries_M = M.ptr;
    sa.summaries_B = B.ptr;
    size_t sa_bytes = 0;
    r.status = workspace_size(sa, Backend::kCuda, &sa_bytes);
    if (r.status.ok() && sa_bytes != ws_bytes)
      r.status = Status::Invalid("workspace_size: the summaries call needs " + std::to_string(sa_bytes) +
                                 " bytes, the resume call " + std::to_string(ws_bytes));
    if (r.status.ok()) r.status = forward(sa, Backend::kCuda, ws.ptr, ws_bytes, stream);
    if (r.status.ok()) r.status = forward(a, Backend::kCuda, ws.ptr, ws_bytes, stream);
    if (!r.status.ok()) return r;
    split->M = M.to_host();
    split->B = B.to_host();
  } else {
    r.status = forward(a, Backend::kCuda, ws.ptr, ws_bytes, stream);
  }
  if (!r.status.ok()) return r;
  FKDA_CUDA_CHECK(cudaDeviceSynchronize());
  r.out_bits = out.to_host();
  r.out.resize(r.out_bits.size());
  for (size_t i = 0; i < r.out.size(); ++i) r.out[i] = bf16_to_float(r.out_bits[i]);
  if (!state_in_place) r.state_bytes = final_state.to_host();
  else if (p.spec.final_state == DType::kFP32) r.state_bytes = as_bytes(init_f32.to_host());
  else r.state_bytes = as_bytes(init_bf16.to_host());
  r.final_state = state_to_float(r.state_bytes, p.spec.final_state);
  return r;
}

// The float64 oracle's result for the same problem, before any rounding to bf16
// (fp32 holds it to 6e-8, far below every bar): spec section 2 judges a backend
// against the oracle itself.
struct OracleResult {
  std::vector<float> out;
  std::vector<float> final_state;
};

inline OracleResult run_oracle(const HostProblem& p) {
  HostProblem q = p;
  q.spec.final_state = DType::kFP32;
  std::vector<uint16_t> out_bf16(q.out_elems());
  OracleResult r;
  r.out.resize(q.out_elems());
  r.final_state.resize(q.state_elems());
  ForwardArgs a = q.host_args(out_bf16.data(), r.final_state.data());
  // Called directly: the public API rejects a bf16 initial state with an fp32
  // final one, which is exactly the comparison wanted here.
  Status s = cpu::reference_forward_f64(a, r.out.data());
  if (!s.ok()) throw std::runtime_error("oracle failed: " + s.message);
  return r;
}

// A problem restricted to some value heads (HV == H problems only), so that the
// oracle of a 96-head problem can be checked on a sample of heads.
inline HostProblem slice_heads(const HostProblem& p, const std::vector<int64_t>& heads) {
  if (p.HV != p.H) throw std::invalid_argument("slice_heads: needs HV == H");
  HostProblem s = p;
  const int64_t Hn = static_cast<int64_t>(heads.size());
  s.H = s.HV = Hn;
  s.spec.heads = Hn;
  s.spec.v_heads = 0;
  const int64_t BT = p.B * p.T;
  auto slice = [&](const auto& src, auto& dst, int64_t outer, int64_t inner) {
    dst.assign(static_cast<size_t>(outer * Hn * inner), {});
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < Hn; ++j)
        std::copy_n(src.begin() + (o * p.H + heads[j]) * inner, inner, dst.begin() + (o * Hn + j) * inner);
  };
  slice(p.q, s.q, BT, p.K);
  slice(p.k, s.k, BT, p.K);
  slice(p.v, s.v, BT, p.V);
  slice(p.g, s.g, BT, p.K);
  slice(p.beta, s.beta, BT, 1);
  if (!p.g_f32.empty()) slice(p.g_f32, s.g_f32, BT, p.K);
  if (!p.beta_f32.empty()) slice(p.beta_f32, s.beta_f32, BT, 1);
  slice(p.A_log, s.A_log, 1, 1);
  slice(p.dt_bias, s.dt_bias, 1, p.K);
  if (!p.init_f32.empty()) slice(p.init_f32, s.init_f32, p.N, p.V * p.K);
  if (!p.init_bf16.empty()) slice(p.init_bf16, s.init_bf16, p.N, p.V * p.K);
  return s;
}

// The slice of a full-problem GPU result ([outer, H, inner] tensors) at `heads`.
inline std::vector<float> slice_result(const std::vector<float>& x, int64_t outer, int64_t H,
                                       const std::vector<int64_t>& heads, int64_t inner) {
  std::vector<float> y;
  y.reserve(static_cast<size_t>(outer * heads.size() * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t h : heads) y.insert(y.end(), x.begin() + (o * H + h) * inner, x.begin() + (o * H + h + 1) * inner);
  return y;
}

}  // namespace flashkda::testing
#endif  // FLASHKDA_WITH_CUDA
