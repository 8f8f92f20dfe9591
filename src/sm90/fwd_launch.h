// Declarations of the launch instantiations (defined in src/sm90/instantiations/).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "sm90/kernel/params.h"

namespace flashkda::sm90 {

template <int kStateWarps>
cudaError_t launch_fwd(const FwdParams& p, int64_t num_ctas, cudaStream_t stream);

extern template cudaError_t launch_fwd<8>(const FwdParams&, int64_t, cudaStream_t);  // V split 1
extern template cudaError_t launch_fwd<4>(const FwdParams&, int64_t, cudaStream_t);  // V split 2
extern template cudaError_t launch_fwd<2>(const FwdParams&, int64_t, cudaStream_t);  // V split 4

}  // namespace flashkda::sm90
