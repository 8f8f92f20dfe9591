// The forward kernel with V split over 2 CTA(s): 4 state warps, 64 rows of V per CTA.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_fwd<4>(const FwdParams&, int64_t, cudaStream_t);
}
