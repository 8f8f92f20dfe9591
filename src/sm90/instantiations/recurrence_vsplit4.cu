// The recurrence kernel with V split over 4 CTA(s), 4 chunks in flight: 2 warps, 32 rows of V per CTA.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<2, 4>(const FwdParams&, int64_t, int, cudaStream_t);
}
