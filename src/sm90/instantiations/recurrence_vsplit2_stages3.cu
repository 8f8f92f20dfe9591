// The recurrence kernel with V split over 2 CTAs, 3 chunks in flight (one more CTA per SM): 4 warps, 64 rows of V
// per CTA; records by bulk copy.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<4, 3, false, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int, cudaStream_t);
}
