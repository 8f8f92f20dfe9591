// The token-parallel prologue kernel (one instantiation).
#include "sm90/fwd_launch.h"
#include "sm90/kernel/prologue_kernel.cuh"

namespace flashkda::sm90 {

cudaError_t launch_prologue(const FwdParams& p, cudaStream_t stream) {
  constexpr size_t kSmemBytes = sizeof(PrologueSmem);
  cudaError_t err =
      cudaFuncSetAttribute(kda_chunk_prologue_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.num_slots), static_cast<unsigned>(p.num_v_heads));
  kda_chunk_prologue_kernel<<<grid, dim3(kPrologueThreads), kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashkda::sm90
