// Pass 2 of the segment scan: the register form (one CTA per (sequence, value
// head, 4 rows of S), twice that in a summaries call: rows of B, then rows of M)
// or the staged form (4, 8, 16 or 32 rows a CTA, one CTA an SM), segment_compose_kernel.cuh.
#include "sm90/fwd_launch.h"
#include "sm90/kernel/segment_compose_kernel.cuh"

namespace flashkda::sm90 {

namespace {
template <int kDim, int kRows>
cudaError_t launch_staged(const FwdParams& p, int64_t chains, int device, cudaStream_t stream) {
  static SmemLimitSet limit;  // one per instantiation
  const int64_t ctas = chains * compose_ctas_per_head<kDim, kRows>();
  return launch_with_smem(reinterpret_cast<const void*>(&kda_segment_compose_staged_kernel<kDim, kRows>), limit,
                          device, dim3(static_cast<unsigned>(ctas)), dim3(ComposeTiling<kDim, kRows>::kThreads),
                          sizeof(ComposeStages<kDim, kRows>), stream, p, 0, p.seg_plan != nullptr);
}

// The device's plan launches either form beside pass 1's later segments (grid_dependency.cuh).
template <int kDim>
cudaError_t launch_compose(const FwdParams& p, int device, int staged_rows, cudaStream_t stream) {
  const int64_t kinds = p.split_mode == kSplitSummaries ? 2 : 1;
  const int64_t seqs = p.seg_plan != nullptr ? p.max_cut : p.num_seqs;  // the device's plan lists the cut ones
  const int64_t chains = seqs * p.num_v_heads * kinds;
  switch (staged_rows) {
    case 4: return launch_staged<kDim, 4>(p, chains, device, stream);
    case 8: return launch_staged<kDim, 8>(p, chains, device, stream);
    case 16: return launch_staged<kDim, 16>(p, chains, device, stream);
    case 32: return launch_staged<kDim, 32>(p, chains, device, stream);
    default: break;
  }
  const int64_t ctas = chains * compose_ctas_per_head<kDim>();
  static SmemLimitSet limit;  // static shared memory only: the limit stays at 0 dynamic bytes
  return launch_with_smem(reinterpret_cast<const void*>(&kda_segment_compose_kernel<kDim>), limit, device,
                          dim3(static_cast<unsigned>(ctas)), dim3(kDim), 0, stream, p, 0, p.seg_plan != nullptr);
}
}  // namespace

cudaError_t launch_segment_compose(const FwdParams& p, int device, int staged_rows, cudaStream_t stream) {
  return p.head_dim == 64 ? launch_compose<64>(p, device, staged_rows, stream)
                          : launch_compose<kHeadDim>(p, device, staged_rows, stream);
}

}  // namespace flashkda::sm90
