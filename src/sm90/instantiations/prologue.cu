// The token-parallel prologue kernel: one instantiation per head dim, and two
// more each that also do a varlen batch's set-up: its order, and after the
// chunk its checkpoints' first entries or its segment plan too (prologue_kernel.cuh);
// all six again for the general inputs (a log-decay gate, fp32 g or beta, b as
// given). One unit: the kernels share its device-fault record (device_fault_record.cuh).
#include "sm90/fwd_launch.h"
#include "sm90/kernel/prologue_kernel.cuh"

namespace flashkda::sm90 {

namespace {
// One per kernel: [general inputs][head dim 64][set-up: none, order, after the chunk].
SmemLimitSet g_limits[2][2][3];

template <int kDim, bool kOrderSequences, bool kSetupLast, bool kGeneralInputs>
cudaError_t launch_prologue_kernel(const FwdParams& p, int device, cudaStream_t stream) {
  // (slot, value head within its group, q/k head): value head = z·(HV/H) + y.
  const dim3 grid(static_cast<unsigned>(p.num_slots), static_cast<unsigned>(p.num_v_heads / p.num_heads),
                  static_cast<unsigned>(p.num_heads));
  const void* kernel =
      reinterpret_cast<const void*>(&kda_chunk_prologue_kernel<kDim, kOrderSequences, kSetupLast, kGeneralInputs>);
  SmemLimitSet& limit = g_limits[kGeneralInputs][kDim == 64][kSetupLast ? 2 : kOrderSequences ? 1 : 0];
  return launch_with_smem(kernel, limit, device, grid, dim3(kPrologueThreads), sizeof(PrologueSmem), stream, p);
}

template <int kDim, bool kGeneralInputs>
cudaError_t launch_prologue_for(const FwdParams& p, int device, cudaStream_t stream) {
  const bool ordered = p.seq_order != nullptr, entries = p.ck_first_entries != nullptr || p.seg_plan != nullptr;
  return entries   ? launch_prologue_kernel<kDim, true, true, kGeneralInputs>(p, device, stream)
         : ordered ? launch_prologue_kernel<kDim, true, false, kGeneralInputs>(p, device, stream)
                   : launch_prologue_kernel<kDim, false, false, kGeneralInputs>(p, device, stream);
}
}

cudaError_t take_forward_faults(cudaStream_t stream, DeviceFaults* taken) { return take_this_unit_faults(stream, taken); }

// kPrologueMinCtasPerSm CTAs must fit the 228 KB of an SM (1 KB reserved per CTA).
static_assert(kPrologueMinCtasPerSm * (sizeof(PrologueSmem) + 1024) <= 228 * 1024,
              "the prologue's shared memory no longer fits four CTAs per SM");

cudaError_t launch_prologue(const FwdParams& p, int device, cudaStream_t stream) {
  const bool general = p.gate_log_decay || p.beta_probability || p.g_f32 != nullptr || p.beta_f32 != nullptr;
  if (p.head_dim == 64)
    return general ? launch_prologue_for<64, true>(p, device, stream) : launch_prologue_for<64, false>(p, device, stream);
  return general ? launch_prologue_for<kHeadDim, true>(p, device, stream)
                 : launch_prologue_for<kHeadDim, false>(p, device, stream);
}

}  // namespace flashkda::sm90
