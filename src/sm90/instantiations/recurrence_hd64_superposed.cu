// The segment scan's pass 1 with outputs by superposition at K = V = 64 (records by cp.async).
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<4, 4, false, 64, kRecordsByCpAsync, true>(const FwdParams&, int64_t, int,
                                                                                  cudaStream_t);
}
