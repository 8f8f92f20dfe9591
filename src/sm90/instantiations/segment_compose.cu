// Pass 2 of the segment scan: one CTA per (sequence, value head, 4 rows of S),
// twice that in a summaries call (rows of B, then rows of M).
#include "sm90/fwd_launch.h"
#include "sm90/kernel/segment_compose_kernel.cuh"

namespace flashkda::sm90 {

namespace {
template <int kDim>
cudaError_t launch_compose(const FwdParams& p, cudaStream_t stream) {
  const int64_t kinds = p.split_mode == kSplitSummaries ? 2 : 1;
  const int64_t ctas = static_cast<int64_t>(p.num_seqs) * p.num_v_heads * compose_ctas_per_head<kDim>() * kinds;
  kda_segment_compose_kernel<kDim><<<dim3(static_cast<unsigned>(ctas)), dim3(kDim), 0, stream>>>(p);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_segment_compose(const FwdParams& p, cudaStream_t stream) {
  return p.head_dim == 64 ? launch_compose<64>(p, stream) : launch_compose<kHeadDim>(p, stream);
}

}  // namespace flashkda::sm90
