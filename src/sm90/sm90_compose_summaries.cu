// flashkda::compose_summaries on kCuda: count compositions of segment summaries,
//   (M, B) = (M1, B1)∘(M2, B2) = (M1·M2, B1·M2 + B2),
// M* fp32 [K, K], B* fp32 [V, K], summed in float64 as on the CPU backends
// (cpu/segment_summaries.cpp), so both round the same float64 sums to fp32.
//
// One CTA per composition. It first copies M2 into shared memory; then each warp
// takes rows r of the stacked [M1; B1] (K + V rows), copies row r to its own
// shared row, and writes output row r = row(r)·M2 (+ B2[r] for a B row), lane l
// owning columns l, l + 32, ... The outputs may be the memory of either input
// (in place): output row r depends only on input row r, which the warp holds
// before it writes; B2[r][j] is read by the lane that writes B[r][j]; and M2 is
// read whole before the barrier that precedes every write.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

constexpr int kComposeThreads = 128;
constexpr int kComposeWarps = kComposeThreads / 32;
// A grid-stride loop over the compositions past this many CTAs (a count may
// exceed the grid's x limit).
constexpr int64_t kComposeMaxCtas = int64_t{1} << 20;

struct ComposeParams {
  const float *M1, *B1, *M2, *B2;
  float *M, *B;
  int64_t count;
  int K, V;
};

__global__ void __launch_bounds__(kComposeThreads) kda_compose_summaries_kernel(const __grid_constant__ ComposeParams p) {
  extern __shared__ float smem[];
  const int K = p.K, V = p.V;
  float* m2 = smem;                                           // [K][K]
  float* row = smem + K * K + (threadIdx.x / 32) * K;         // the warp's input row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t c = blockIdx.x; c < p.count; c += gridDim.x) {
    const int64_t mm = c * K * K, bb = c * V * K;  // this composition's first element
    __syncthreads();  // the previous composition's rows are written
    for (int i = threadIdx.x; i < K * K; i += kComposeThreads) m2[i] = p.M2[mm + i];
    __syncthreads();
    for (int r = warp; r < K + V; r += kComposeWarps) {
      const bool is_b = r >= K;
      const float* x = is_b ? p.B1 + bb + int64_t(r - K) * K : p.M1 + mm + int64_t(r) * K;
      for (int k = lane; k < K; k += 32) row[k] = x[k];
      __syncwarp();
      for (int j = lane; j < K; j += 32) {
        double acc = is_b ? double(p.B2[bb + int64_t(r - K) * K + j]) : 0.0;
        for (int k = 0; k < K; ++k) acc = fma(double(row[k]), double(m2[k * K + j]), acc);
        float* out = is_b ? p.B + bb + int64_t(r - K) * K : p.M + mm + int64_t(r) * K;
        out[j] = static_cast<float>(acc);
      }
      __syncwarp();  // row[] is reused for the warp's next row
    }
  }
}

Status cuda_error(cudaError_t err, const char* what) {
  return {StatusCode::kCudaError, std::string("backend kCuda: compose_summaries: ") + what + ": " +
                                      cudaGetErrorString(err)};
}

}  // namespace

Status compose_summaries(const ComposeSummariesArgs& a) {
  ComposeParams p{};
  p.M1 = a.M1;
  p.B1 = a.B1;
  p.M2 = a.M2;
  p.B2 = a.B2;
  p.M = a.M;
  p.B = a.B;
  p.count = a.count;
  p.K = static_cast<int>(a.head_dim_k);
  p.V = static_cast<int>(a.head_dim_v);
  const size_t smem = static_cast<size_t>(p.K * p.K + kComposeWarps * p.K) * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(kda_compose_summaries_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return cuda_error(err, "setting the kernel's shared memory");
  const int64_t ctas = a.count < kComposeMaxCtas ? a.count : kComposeMaxCtas;
  kda_compose_summaries_kernel<<<static_cast<unsigned>(ctas), kComposeThreads, smem,
                                 static_cast<cudaStream_t>(a.stream)>>>(p);
  err = cudaGetLastError();
  return err == cudaSuccess ? Status::Ok() : cuda_error(err, "launching the kernel");
}

}  // namespace flashkda::sm90
