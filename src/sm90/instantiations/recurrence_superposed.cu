// The segment scan's pass 1 with outputs by superposition (segment_outputs.cuh):
// 4 warps, 4 chunks in flight; K = 128 records by bulk copy, K = 64 by cp.async.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<4, 4, false, 128, kRecordsByBulkCopy, true>(const FwdParams&, int64_t, int,
                                                                                    cudaStream_t);
}
