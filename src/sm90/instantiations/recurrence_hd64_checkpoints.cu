// The recurrence kernel that writes checkpoints, K = V = 64: one 4-warp CTA per
// (sequence, head), 4 chunks in flight.
#include "sm90/fwd_launch.cuh"

namespace flashkda::sm90 {
template cudaError_t launch_recurrence<4, 4, true, 64>(const FwdParams&, int64_t, int, cudaStream_t);
}
