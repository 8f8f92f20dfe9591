// The segment scan's outputs by superposition (kernel 4): p.output_chunks chunks
// of one (segment slot, value head) a CTA, a warp per 16 rows of V.
#include "sm90/fwd_launch.h"
#include "sm90/kernel/segment_output_kernel.cuh"

namespace flashkda::sm90 {

namespace {
template <int kDim>
cudaError_t launch_output(const FwdParams& p, int64_t num_ctas, int device, cudaStream_t stream) {
  static SmemLimitSet limit;
  // The device's plan: beside the composition (grid_dependency.cuh).
  return launch_with_smem(reinterpret_cast<const void*>(&kda_segment_output_kernel<kDim>), limit, device,
                          dim3(static_cast<unsigned>(num_ctas)), dim3(segment_output_threads<kDim>()),
                          segment_output_smem_bytes<kDim>(), stream, p, 0, p.seg_plan != nullptr);
}
}  // namespace

cudaError_t launch_segment_output(const FwdParams& p, int64_t num_ctas, int device, cudaStream_t stream) {
  return p.head_dim == 64 ? launch_output<64>(p, num_ctas, device, stream)
                          : launch_output<kHeadDim>(p, num_ctas, device, stream);
}

}  // namespace flashkda::sm90
