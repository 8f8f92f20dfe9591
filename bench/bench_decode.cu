// flashkda-bench-decode: one decode step (one token per sequence, state read and
// written in place in the pool) under a CUDA graph, for N ∈ {1, 8, 64, 256, 1024},
// H = 32, K = V = 128, fp32 and bf16 pools. Prints µs per step and the achieved
// state bandwidth 2·N·H·V·K·sizeof(state) / time.
//
//   flashkda-bench-decode [--heads 32] [--seqs 1,8,64,256,1024] [--iters 200] [--json FILE]
//
// Timing: kStepsPerGraph decode steps captured in one graph; the graph replayed
// --iters times with CUDA events around each replay; median / kStepsPerGraph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_common.cuh"
#include "flashkda/flashkda.h"

namespace {

using namespace flashkda::bench;


constexpr int kDim = 128;
constexpr int kStepsPerGraph = 20;  // amortises the graph launch itself

__global__ void fill_bf16(uint16_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float f = (hash32(seed + i) * 2.3283064e-10f - 0.5f) * 3.4641016f;  // uniform, unit variance
    x[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
  }
}
__global__ void fill_state(void* x, int64_t n, uint64_t seed, bool fp32) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float f = (hash32(seed + i) * 2.3283064e-10f - 0.5f) * 0.2f;
    if (fp32) static_cast<float*>(x)[i] = f;
    else static_cast<uint16_t*>(x)[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
  }
}
__global__ void iota_i32(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = static_cast<int32_t>(i);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t b = 0;
  while (b < s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    v.push_back(std::atoi(s.substr(b, e - b).c_str()));
    b = e + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int H = 32, iters = 200;
  std::vector<int> seqs = {1, 8, 64, 256, 1024};
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--heads") H = std::atoi(next().c_str());
    else if (a == "--seqs") seqs = parse_list(next());
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--json") json = next();
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  std::string why;
  if (!flashkda::cuda_backend_available(&why)) {
    std::fprintf(stderr, "flashkda-bench-decode: %s\n", why.c_str());
    return 1;
  }
  struct Row { int N; const char* dtype; double us, tbps; };
  std::vector<Row> rows;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  for (int N : seqs) {
    for (flashkda::DType dt : {flashkda::DType::kFP32, flashkda::DType::kBF16}) {
      const bool fp32 = dt == flashkda::DType::kFP32;
      const int64_t tok = int64_t{N} * H * kDim, state_elems = int64_t{N} * H * kDim * kDim;
      uint16_t *q, *k, *v, *g, *beta, *out;
      float *A_log, *dt_bias;
      void* pool;
      int32_t* idx;
      CHECK_CUDA(cudaMalloc(&q, tok * 2)); CHECK_CUDA(cudaMalloc(&k, tok * 2));
      CHECK_CUDA(cudaMalloc(&v, tok * 2)); CHECK_CUDA(cudaMalloc(&g, tok * 2));
      CHECK_CUDA(cudaMalloc(&out, tok * 2)); CHECK_CUDA(cudaMalloc(&beta, int64_t{N} * H * 2));
      CHECK_CUDA(cudaMalloc(&A_log, H * 4)); CHECK_CUDA(cudaMalloc(&dt_bias, H * kDim * 4));
      CHECK_CUDA(cudaMalloc(&pool, state_elems * (fp32 ? 4 : 2)));
      CHECK_CUDA(cudaMalloc(&idx, N * 4));
      fill_bf16<<<256, 256>>>(q, tok, 1); fill_bf16<<<256, 256>>>(k, tok, 2); fill_bf16<<<256, 256>>>(v, tok, 3);
      fill_bf16<<<256, 256>>>(g, tok, 4); fill_bf16<<<256, 256>>>(beta, int64_t{N} * H, 5);
      fill_uniform_f32<<<8, 256>>>(A_log, H, 6, 1.f); fill_uniform_f32<<<8, 256>>>(dt_bias, H * kDim, 7, 1.f);
      fill_state<<<1024, 256>>>(pool, state_elems, 8, fp32);
      iota_i32<<<8, 256>>>(idx, N);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaDeviceSynchronize());

      flashkda::DecodeArgs a;
      a.q = q; a.k = k; a.v = v; a.g = g; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias; a.out = out;
      a.num_seqs = N; a.tokens_per_seq = 1; a.total_tokens = N;
      a.state_pool = pool; a.state_dtype = dt; a.pool_size = N; a.state_indices = idx;
      a.num_heads = H; a.num_v_heads = H; a.head_dim_k = kDim; a.head_dim_v = kDim;
      a.scale = 1.f / std::sqrt(float(kDim)); a.lower_bound = -5.f;

      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int s = 0; s < kStepsPerGraph; ++s) {
        const flashkda::Status st = flashkda::decode(a, flashkda::Backend::kCuda, stream);
        if (!st.ok()) { std::fprintf(stderr, "decode failed: %s\n", st.message.c_str()); return 1; }
      }
      CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int w = 0; w < 5; ++w) CHECK_CUDA(cudaGraphLaunch(exec, stream));
      std::vector<float> ms(iters);
      for (int i = 0; i < iters; ++i) {
        CHECK_CUDA(cudaEventRecord(e0, stream));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&ms[i], e0, e1));
      }
      std::sort(ms.begin(), ms.end());
      const double us = ms[iters / 2] * 1e3 / kStepsPerGraph;
      const double bytes = 2.0 * state_elems * (fp32 ? 4 : 2);
      rows.push_back({N, fp32 ? "fp32" : "bf16", us, bytes / (us * 1e-6) / 1e12});
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(graph));
      cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(g); cudaFree(out); cudaFree(beta);
      cudaFree(A_log); cudaFree(dt_bias); cudaFree(pool); cudaFree(idx);
    }
  }
  std::printf("\n| N | H | pool | µs / step | state TB/s | %% of copy bandwidth (4.25 TB/s) |\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %d | %d | %s | %.2f | %.2f | %.0f%% |\n", r.N, H, r.dtype, r.us, r.tbps, 100 * r.tbps * 1e12 / kCopyBandwidth);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) { std::perror(json.c_str()); return 1; }
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < rows.size(); ++i)
      std::fprintf(f, "  {\"N\": %d, \"heads\": %d, \"pool\": \"%s\", \"us_per_step\": %.3f, \"state_tbps\": %.3f}%s\n",
                   rows[i].N, H, rows[i].dtype, rows[i].us, rows[i].tbps, i + 1 < rows.size() ? "," : "");
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
