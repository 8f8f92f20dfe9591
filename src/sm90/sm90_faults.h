// Host side of the device fault record (device_faults.h).
#pragma once
#include "flashkda/flashkda.h"

namespace flashkda::sm90 {

// Waits for `stream`, reads and clears the current device's record; kInvalidArgument
// naming the argument when a fault was recorded since the last check.
Status check_device_faults(void* stream);

}  // namespace flashkda::sm90
