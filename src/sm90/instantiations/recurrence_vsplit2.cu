// The recurrence kernel with V split over 2 CTA(s), 4 chunks in flight: 4 warps, 64 rows of V per CTA; records by
// cp.async.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<4, 4, false>(const FwdParams&, int64_t, int, cudaStream_t);
}
