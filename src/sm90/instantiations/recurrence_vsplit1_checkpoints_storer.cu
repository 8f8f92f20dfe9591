// The recurrence kernel that writes checkpoints through the entry storer, V split over 1 CTA, 4 chunks in flight:
// 8 state warps, 128 rows of V per CTA, and the storer warpgroup; records by bulk copy.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<8, 4, true, 128, kRecordsByBulkCopy, false, kWithEntryStorer>(const FwdParams&,
                                                                                                   int64_t, int,
                                                                                                   cudaStream_t);
}
