// The token-parallel prologue kernel (one instantiation per head dim).
#include "sm90/fwd_launch.h"
#include "sm90/kernel/prologue_kernel.cuh"

namespace flashkda::sm90 {

namespace {
SmemLimitSet g_prologue_limit, g_prologue_limit_64;  // one per kernel
}

cudaError_t take_forward_faults(cudaStream_t stream, DeviceFaults* taken) { return take_this_unit_faults(stream, taken); }

// kPrologueMinCtasPerSm CTAs must fit the 228 KB of an SM (1 KB reserved per CTA).
static_assert(kPrologueMinCtasPerSm * (sizeof(PrologueSmem) + 1024) <= 228 * 1024,
              "the prologue's shared memory no longer fits four CTAs per SM");

cudaError_t launch_prologue(const FwdParams& p, int device, cudaStream_t stream) {
  constexpr size_t kSmemBytes = sizeof(PrologueSmem);
  // (slot, value head within its group, q/k head): value head = z·(HV/H) + y.
  const dim3 grid(static_cast<unsigned>(p.num_slots), static_cast<unsigned>(p.num_v_heads / p.num_heads),
                  static_cast<unsigned>(p.num_heads));
  if (p.head_dim == 64)
    return launch_with_smem(reinterpret_cast<const void*>(&kda_chunk_prologue_kernel<64>), g_prologue_limit_64, device,
                            grid, dim3(kPrologueThreads), kSmemBytes, stream, p);
  return launch_with_smem(reinterpret_cast<const void*>(&kda_chunk_prologue_kernel<kHeadDim>), g_prologue_limit,
                          device, grid, dim3(kPrologueThreads), kSmemBytes, stream, p);
}

}  // namespace flashkda::sm90
