// check_device_faults(): reads and clears the fault records of the recording
// units (device_faults.h) on the current device and names what they saw.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "sm90/device_faults.h"
#include "sm90/sm90_faults.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

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
      "state_indices (forward): device values past the pool (expected < pool_size, or negative for no slot), "
      "first at sequence ",
      "slot_checkpoint_offsets / slot_checkpoint_slots (forward): device values out of range (expected an offset "
      "that is a positive multiple of 16 at most the sequence's length and a slot < pool_size, or negative for "
      "none), first at sequence ",
      "num_accepted_tokens (decode): device values outside [1, verify_slots], first at sequence ",
      "cu_seqlens (decode, verify): a sequence with more tokens than verify_slots (its state_indices row has a "
      "slot per token), first at sequence ",
      "g (forward, gate_form kLogDecay): a log decay above 0 (expected <= 0; read as 0), first in the 16-token "
      "chunk from token ",
      "g (decode, gate_form kLogDecay): a log decay above 0 (expected <= 0; read as 0), first at token ",
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

Status check_device_faults(void* stream) {
  // Each unit's record has one take buffer per device: checks from several host
  // threads take turns.
  static std::mutex one_check_at_a_time;
  std::lock_guard<std::mutex> lock(one_check_at_a_time);
  // Without a usable sm_90 device no kernel of ours ran, so nothing was recorded.
  if (!device_supported(nullptr)) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  DeviceFaults all{};
  for (auto& i : all.first_index) i = kNoFaultIndex;
  for (auto take : {&take_forward_faults, &take_decode_faults}) {
    DeviceFaults f{};
    const cudaError_t err = take(s, &f);
    if (err != cudaSuccess) return cuda_status(err, "reading the fault record");
    all.kinds |= f.kinds;
    for (int k = 0; k < kNumDeviceFaultKinds; ++k)
      if (f.first_index[k] < all.first_index[k]) all.first_index[k] = f.first_index[k];
  }
  if (all.kinds == 0) return Status::Ok();
  return Status::Invalid(describe(all));
}

}  // namespace flashkda::sm90
