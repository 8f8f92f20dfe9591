// The fault record of one translation unit (device_faults.h): included only by
// the units whose kernels record faults (the prologue's and the decode's), each
// of which exports its take function (take_forward_faults, take_decode_faults).
#pragma once
#include <cuda_runtime.h>

#include "sm90/device_faults.h"

namespace flashkda::sm90 {

namespace {  // one record (and one take kernel) per translation unit that includes this

static_assert(kNumDeviceFaultKinds == 9, "every kind's first index starts at kNoFaultIndex below");
__device__ DeviceFaults g_faults = {0u, 0u, {kNoFaultIndex, kNoFaultIndex, kNoFaultIndex, kNoFaultIndex, kNoFaultIndex,
                                             kNoFaultIndex, kNoFaultIndex, kNoFaultIndex, kNoFaultIndex}};
__device__ DeviceFaults g_faults_taken;

// Called by one thread per faulty sequence (or by each thread that met a faulty gate).
__device__ __forceinline__ void record_fault(DeviceFaultKind kind, int64_t index) {
  atomicOr(&g_faults.kinds, 1u << kind);
  atomicMin(&g_faults.first_index[kind], static_cast<unsigned long long>(index));
}

// Read-and-clear, ordered in the stream after the kernels before it and atomic
// against kernels on other streams.
__global__ void take_faults_kernel() {
  g_faults_taken.kinds = atomicExch(&g_faults.kinds, 0u);
  for (int k = 0; k < kNumDeviceFaultKinds; ++k)
    g_faults_taken.first_index[k] = atomicExch(&g_faults.first_index[k], kNoFaultIndex);
}

// The body of a unit's take function.
inline cudaError_t take_this_unit_faults(cudaStream_t stream, DeviceFaults* taken) {
  take_faults_kernel<<<1, 1, 0, stream>>>();
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cudaMemcpyFromSymbolAsync(taken, g_faults_taken, sizeof(DeviceFaults), 0, cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  return err;
}

}  // namespace

}  // namespace flashkda::sm90
