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

#include "sm90/fwd_launch.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

constexpr int kComposeThreads = 128;
constexpr int kComposeWarps = kComposeThreads / 32;
// A grid-stride loop over the compositions past this many CTAs (a count may
// exceed the grid's x limit).
constexpr int64_t kComposeMaxCtas = int64_t{1} << 20;

// The kernel takes the public arguments as they are (pointers and sizes; the
// stream is not read on the device).
__global__ void __launch_bounds__(kComposeThreads)
    kda_compose_summaries_kernel(const __grid_constant__ ComposeSummariesArgs p) {
  extern __shared__ float smem[];
  const int K = static_cast<int>(p.head_dim_k), V = static_cast<int>(p.head_dim_v);
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

// Dynamic shared memory: M2 [K][K] and one input row a warp.
constexpr size_t compose_smem_bytes(int64_t K) { return static_cast<size_t>(K * K + kComposeWarps * K) * sizeof(float); }
// K <= kCudaMaxComposeDim (checked by the caller): the kernel's limit is raised to this once per device.
constexpr size_t kComposeMaxSmemBytes = compose_smem_bytes(kCudaMaxComposeDim);

Status cuda_error(cudaError_t err, const char* what) {
  return {StatusCode::kCudaError, std::string("backend kCuda: compose_summaries: ") + what + ": " +
                                      cudaGetErrorString(err)};
}

}  // namespace

Status compose_summaries(const ComposeSummariesArgs& a) {
  static SmemLimitSet limit;
  int device = -1;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_error(err, "querying the current device");
  const int64_t ctas = a.count < kComposeMaxCtas ? a.count : kComposeMaxCtas;
  err = launch_with_smem(reinterpret_cast<const void*>(&kda_compose_summaries_kernel), limit, device,
                         dim3(static_cast<unsigned>(ctas)), dim3(kComposeThreads), compose_smem_bytes(a.head_dim_k),
                         static_cast<cudaStream_t>(a.stream), a, kComposeMaxSmemBytes);
  return err == cudaSuccess ? Status::Ok() : cuda_error(err, "launching the kernel");
}

}  // namespace flashkda::sm90
