// The token-parallel prologue kernel: one instantiation per head dim, and two
// more each that also do a varlen batch's set-up: its order, and after the
// chunk its checkpoints' first entries or its segment plan too (prologue_kernel.cuh).
// One unit: the kernels share its device-fault record (device_fault_record.cuh).
#include "sm90/fwd_launch.h"
#include "sm90/kernel/prologue_kernel.cuh"

namespace flashkda::sm90 {

namespace {
SmemLimitSet g_prologue_limit, g_prologue_limit_64, g_ordering_limit, g_ordering_limit_64, g_entries_limit,
    g_entries_limit_64;  // one per kernel

template <int kDim, bool kOrderSequences, bool kSetupLast>
cudaError_t launch_prologue_kernel(const FwdParams& p, SmemLimitSet& limit, int device, cudaStream_t stream) {
  // (slot, value head within its group, q/k head): value head = z·(HV/H) + y.
  const dim3 grid(static_cast<unsigned>(p.num_slots), static_cast<unsigned>(p.num_v_heads / p.num_heads),
                  static_cast<unsigned>(p.num_heads));
  const void* kernel = reinterpret_cast<const void*>(&kda_chunk_prologue_kernel<kDim, kOrderSequences, kSetupLast>);
  return launch_with_smem(kernel, limit, device, grid, dim3(kPrologueThreads), sizeof(PrologueSmem), stream, p);
}
}

cudaError_t take_forward_faults(cudaStream_t stream, DeviceFaults* taken) { return take_this_unit_faults(stream, taken); }

// kPrologueMinCtasPerSm CTAs must fit the 228 KB of an SM (1 KB reserved per CTA).
static_assert(kPrologueMinCtasPerSm * (sizeof(PrologueSmem) + 1024) <= 228 * 1024,
              "the prologue's shared memory no longer fits four CTAs per SM");

cudaError_t launch_prologue(const FwdParams& p, int device, cudaStream_t stream) {
  const bool ordered = p.seq_order != nullptr, entries = p.ck_first_entries != nullptr || p.seg_plan != nullptr;
  if (p.head_dim == 64)
    return entries   ? launch_prologue_kernel<64, true, true>(p, g_entries_limit_64, device, stream)
           : ordered ? launch_prologue_kernel<64, true, false>(p, g_ordering_limit_64, device, stream)
                     : launch_prologue_kernel<64, false, false>(p, g_prologue_limit_64, device, stream);
  return entries   ? launch_prologue_kernel<kHeadDim, true, true>(p, g_entries_limit, device, stream)
         : ordered ? launch_prologue_kernel<kHeadDim, true, false>(p, g_ordering_limit, device, stream)
                   : launch_prologue_kernel<kHeadDim, false, false>(p, g_prologue_limit, device, stream);
}

}  // namespace flashkda::sm90
