// The recurrence kernel with V split over 1 CTA, 4 chunks in flight: 8 warps, 128 rows of V per CTA; records by
// bulk copy.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<8, 4, false, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int, cudaStream_t);
}
