// The launches of the forward, defined in src/sm90/instantiations/.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "sm90/kernel/params.h"

namespace flashkda::sm90 {

// Kernel 1: the token-parallel prologue, grid (chunk slots, value heads).
cudaError_t launch_prologue(const FwdParams& p, cudaStream_t stream);

// Kernel 2: the recurrence, one CTA per (sequence, value head, V-slice);
// kStateWarps = 8 / v_split warps, 16 rows of V each; kStages chunks in flight.
template <int kStateWarps, int kStages>
cudaError_t launch_recurrence(const FwdParams& p, int64_t num_ctas, cudaStream_t stream);

extern template cudaError_t launch_recurrence<8, 4>(const FwdParams&, int64_t, cudaStream_t);  // V split 1
extern template cudaError_t launch_recurrence<4, 4>(const FwdParams&, int64_t, cudaStream_t);  // V split 2
extern template cudaError_t launch_recurrence<4, 3>(const FwdParams&, int64_t, cudaStream_t);  // V split 2, 3 stages
extern template cudaError_t launch_recurrence<2, 4>(const FwdParams&, int64_t, cudaStream_t);  // V split 4

}  // namespace flashkda::sm90
