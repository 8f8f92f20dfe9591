// Shared by the benchmark tools: CUDA error checks, the bandwidth ceiling,
// device-side random fills (inputs are never zeros) and list options.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(expr)                                                                 \
  do {                                                                                   \
    cudaError_t _e = (expr);                                                             \
    if (_e != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(_e));            \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

namespace flashkda::bench {

// The copy bandwidth measured on the H200 (read + write), spec section 5.
constexpr double kCopyBandwidth = 4.25e12;

__device__ inline uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform [0, scale) fp32 values.
__global__ inline void fill_uniform_f32(float* x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = hash32(seed + i) * 2.3283064e-10f * scale;
}

// The SM clock the GPU runs at now, in MHz: one warp counts its SM's cycles
// (clock64) against the global nanosecond timer for kClockProbeNs. Run right after
// a row's timed launches, it shows the clock those launches ran at; under a
// sustained load the GPU's power management lowers it (reported by nvidia-smi as
// the software power cap), which a row's time follows.
constexpr uint64_t kClockProbeNs = 200000;  // long against the timer's resolution (~1 us)
__device__ inline uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__global__ inline void clock_probe(double* mhz) {
  const uint64_t t0 = global_ns();
  const long long c0 = clock64();
  uint64_t t1 = t0;
  while (t1 - t0 < kClockProbeNs) t1 = global_ns();
  const long long c1 = clock64();
  if (threadIdx.x == 0) *mhz = static_cast<double>(c1 - c0) * 1e3 / static_cast<double>(t1 - t0);
}
inline double sm_clock_mhz() {
  double* d = nullptr;
  double mhz = 0;
  CHECK_CUDA(cudaMalloc(&d, sizeof(double)));
  clock_probe<<<1, 32>>>(d);
  CHECK_CUDA(cudaMemcpy(&mhz, d, sizeof(double), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d));
  return mhz;
}

// A comma-separated option value, "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  size_t b = 0;
  while (b < s.size()) {
    size_t e = s.find(sep, b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// The same, as integers.
inline std::vector<int> split_ints(const std::string& s) {
  std::vector<int> out;
  for (const std::string& x : split_list(s)) out.push_back(std::atoi(x.c_str()));
  return out;
}

}  // namespace flashkda::bench
