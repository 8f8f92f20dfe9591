// The recurrence kernel for K = V = 64: one 4-warp CTA per (sequence, head) on the
// state's 64 rows, 4 chunks in flight.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<4, 4, false, 64>(const FwdParams&, int64_t, int, cudaStream_t);
}
