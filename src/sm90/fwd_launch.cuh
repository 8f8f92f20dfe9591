// Launch template of the forward kernel; instantiated once per V-split in
// src/sm90/instantiations/ so that the build compiles them in parallel.
#pragma once
#include <cuda_runtime.h>

#include "sm90/kernel/fwd_kernel.cuh"

namespace flashkda::sm90 {

template <int kStateWarps>
cudaError_t launch_fwd(const FwdParams& p, int64_t num_ctas, cudaStream_t stream) {
  constexpr size_t kSmemBytes = sizeof(SharedStorage<16 * kStateWarps>);
  auto kernel = kda_fwd_kernel<kStateWarps>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(static_cast<unsigned>(num_ctas)), dim3(kThreads), kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashkda::sm90
