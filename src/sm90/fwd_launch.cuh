// Launch template of the recurrence kernel, instantiated per (V split, stages) in
// src/sm90/instantiations/ (one translation unit each, so the build parallelises).
#pragma once
#include <cuda_runtime.h>

#include "sm90/fwd_launch.h"
#include "sm90/kernel/recurrence_kernel.cuh"

namespace flashkda::sm90 {

template <int kStateWarps, int kStages, bool kCheckpoints, int kDim, bool kBulkRecords, bool kSuperposed,
          bool kEntryStorer>
cudaError_t launch_recurrence(const FwdParams& p, int64_t num_ctas, int device, cudaStream_t stream) {
  using Cfg = RecurrenceConfig<kStateWarps, kStages, kEntryStorer>;
  constexpr size_t kSmemBytes = Cfg::kSmemBytes;
  static SmemLimitSet limit;  // one per instantiation: each is its own kernel
  const void* kernel = reinterpret_cast<const void*>(
      &kda_recurrence_kernel<kStateWarps, kStages, kCheckpoints, kDim, kBulkRecords, kSuperposed, kEntryStorer>);
  // A listed plan: pass 1's second launch starts beside its first
  // (RecurrencePass), pass 3 beside the composition (grid_dependency.cuh).
  return launch_with_smem(kernel, limit, device, dim3(static_cast<unsigned>(num_ctas)), dim3(Cfg::kCtaThreads), kSmemBytes,
                          stream, p, 0, recurrence_beside(p));
}

}  // namespace flashkda::sm90
