// A listed segment plan (FwdParams::seg_plan) launches the second of pass 1's
// two launches (the segment 0s and the later segments, in the order
// FwdParams::later_first says), the composition, and then the output kernel or
// pass 3, each beside the launch before it (programmatic dependent launch):
// where the device cut nothing, every CTA of the later launches finds nothing to
// do, and launched one after the other they cost whole batches their launch
// gaps (docs/perf-log.md).
// A CTA with nothing to do lets the next launch start and leaves. An active one
// waits for the launch before it ahead of reading what that launch wrote (pass
// 1's two launches read nothing of each other: there the second's CTA 0 waits
// at its end). CTA 0 waits either way, so each launch completes only after the
// one before it: what follows the forward in the stream sees every launch's
// results.
#pragma once
#include "sm90/kernel/params.h"

namespace flashkda::sm90 {

// Which of a listed plan's pass-1 launches a recurrence launch is.
__host__ __device__ inline bool first_of_pass1(const FwdParams& p) {
  return p.seg_plan != nullptr && (p.pass == (p.later_first != 0 ? kPassSummaries : kPassFirstSegments));
}
__host__ __device__ inline bool second_of_pass1(const FwdParams& p) {
  return p.seg_plan != nullptr && (p.pass == (p.later_first != 0 ? kPassFirstSegments : kPassSummaries));
}
// Whether a recurrence launch starts beside the one before it: pass 1's second,
// and pass 3 (beside the composition).
__host__ __device__ inline bool recurrence_beside(const FwdParams& p) {
  return second_of_pass1(p) || (p.seg_plan != nullptr && p.pass == kPassFromStates);
}

// A CTA with nothing to do, in a launch beside the one before (`beside`).
__device__ __forceinline__ void leave_early(bool beside) {
  if (!beside) return;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (blockIdx.x == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
}

// An active CTA, before it reads what the launch before wrote.
__device__ __forceinline__ void wait_for_launch_before(bool beside) {
  if (beside) asm volatile("griddepcontrol.wait;" ::: "memory");
}

}  // namespace flashkda::sm90
