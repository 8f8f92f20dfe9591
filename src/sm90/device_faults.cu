// The per-device fault record (device_faults.h) and check_device_faults().
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <string>

#include "sm90/device_faults.h"
#include "sm90/fwd_launch.h"
#include "sm90/sm90_faults.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

constexpr unsigned long long kNoIndex = ~0ull;

// One record per device (a module global exists once per device context), and
// the copy that take_faults_kernel hands to the host.
__device__ DeviceFaults g_faults = {0u, 0u, {kNoIndex, kNoIndex, kNoIndex}};
__device__ DeviceFaults g_taken;

// Read-and-clear, ordered in the stream after the kernels before it and atomic
// against kernels on other streams.
__global__ void take_faults_kernel() {
  g_taken.kinds = atomicExch(&g_faults.kinds, 0u);
  for (int k = 0; k < kNumDeviceFaultKinds; ++k) g_taken.first_index[k] = atomicExch(&g_faults.first_index[k], kNoIndex);
}

// The record's device address, looked up once per device (+1: 0 means not yet).
std::atomic<uintptr_t> g_address[kMaxCachedDevices];

Status cuda_status(cudaError_t err, const char* what) {
  cudaGetLastError();
  return {StatusCode::kCudaError, std::string("check_device_faults: ") + what + ": " + cudaGetErrorString(err)};
}

std::string describe(const DeviceFaults& f) {
  static const char* const kWhat[kNumDeviceFaultKinds] = {
      "cu_seqlens (forward): device values break 0 = cu_seqlens[0] <= cu_seqlens[1] <= ... <= cu_seqlens[N] = T "
      "(the total tokens), first at sequence ",
      "cu_seqlens (decode): device values break 0 = cu_seqlens[0] <= cu_seqlens[1] <= ... <= cu_seqlens[N] = T "
      "(the total tokens), first at sequence ",
      "state_indices (decode): device values past the pool (expected < pool_size, or negative for padding), "
      "first at sequence ",
  };
  std::string msg;
  for (int k = 0; k < kNumDeviceFaultKinds; ++k) {
    if (!(f.kinds & (1u << k))) continue;
    if (!msg.empty()) msg += "; ";
    msg += kWhat[k] + std::to_string(f.first_index[k]);
  }
  return msg + ". The kernels clamped or skipped those values (no access outside the given tensors); the "
               "outputs of the calls that read them are unspecified";
}

}  // namespace

cudaError_t device_faults_address(int device, DeviceFaults** address) {
  std::atomic<uintptr_t>* cache = device >= 0 && device < kMaxCachedDevices ? &g_address[device] : nullptr;
  const uintptr_t cached = cache != nullptr ? cache->load(std::memory_order_relaxed) : 0;
  if (cached != 0) {
    *address = reinterpret_cast<DeviceFaults*>(cached - 1);
    return cudaSuccess;
  }
  void* p = nullptr;
  const cudaError_t err = cudaGetSymbolAddress(&p, g_faults);
  if (err != cudaSuccess) return err;
  if (cache != nullptr) cache->store(reinterpret_cast<uintptr_t>(p) + 1, std::memory_order_relaxed);
  *address = static_cast<DeviceFaults*>(p);
  return cudaSuccess;
}

Status check_device_faults(void* stream) {
  // g_taken is one buffer per device: checks from several host threads take turns.
  static std::mutex one_check_at_a_time;
  std::lock_guard<std::mutex> lock(one_check_at_a_time);
  // Without a usable sm_90 device no kernel of ours ran, so nothing was recorded.
  if (!device_supported(nullptr)) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  take_faults_kernel<<<1, 1, 0, s>>>();
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_status(err, "launching the read of the fault record");
  DeviceFaults taken{};
  err = cudaMemcpyFromSymbolAsync(&taken, g_taken, sizeof taken, 0, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return cuda_status(err, "reading the fault record");
  if (taken.kinds == 0) return Status::Ok();
  return Status::Invalid(describe(taken));
}

}  // namespace flashkda::sm90
