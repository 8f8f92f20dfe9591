// Host side of the device fault record (device_faults.h).
#pragma once
#include "flashkda/flashkda.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

namespace flashkda::sm90 {

struct DeviceFaults;

#ifdef __CUDACC__
// The record's address on `device` (the current device), for the kernels' parameters.
cudaError_t device_faults_address(int device, DeviceFaults** address);
#endif

// Waits for `stream`, reads and clears the current device's record; kInvalidArgument
// naming the argument when a fault was recorded since the last check.
Status check_device_faults(void* stream);

}  // namespace flashkda::sm90
