// Pass 2 of the segment scan: one CTA per (sequence, value head, 4 rows of S),
// twice that in a summaries call (rows of B, then rows of M).
#include "sm90/fwd_launch.h"
#include "sm90/kernel/segment_compose_kernel.cuh"

namespace flashkda::sm90 {

cudaError_t launch_segment_compose(const FwdParams& p, cudaStream_t stream) {
  const int64_t kinds = p.split_mode == kSplitSummaries ? 2 : 1;
  const int64_t ctas = static_cast<int64_t>(p.num_seqs) * p.num_v_heads * kComposeCtasPerHead * kinds;
  kda_segment_compose_kernel<<<dim3(static_cast<unsigned>(ctas)), dim3(kComposeThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashkda::sm90
