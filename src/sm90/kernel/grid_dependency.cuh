// A listed segment plan (FwdParams::seg_plan) launches pass 1's later segments,
// the composition, and then the output kernel or pass 3, each beside the launch
// before it (programmatic dependent launch): where the device cut nothing, every
// CTA of those launches finds nothing to do, and launched one after the other
// they cost whole batches their launch gaps (docs/perf-log.md).
// A CTA with nothing to do lets the next launch start and leaves. An active one
// waits for the launch before it ahead of reading what that launch wrote (pass
// 1's later segments read nothing of the segment 0s: there CTA 0 waits at its
// end). CTA 0 waits either way, so each launch completes only after the one
// before it: what follows the forward in the stream sees every launch's results.
#pragma once
#include "sm90/kernel/params.h"

namespace flashkda::sm90 {

// Whether a recurrence launch starts beside the one before it: pass 1's later
// segments (beside the segment 0s) and pass 3 (beside the composition) of a
// listed plan (`listed`: FwdParams::seg_plan set). The host's launch attribute
// and the kernel's waits follow this one predicate. (Of the two fields, not of
// FwdParams: so written, every recurrence build's SASS is what the inline
// expression gave; taking FwdParams, the set-up's branches moved.)
__host__ __device__ __forceinline__ bool recurrence_beside(bool listed, int32_t pass) {
  return listed && (pass == kPassSummaries || pass == kPassFromStates);
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
