// The launches of the forward, defined in src/sm90/instantiations/.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "sm90/kernel/params.h"

namespace flashkda::sm90 {

// Device ordinals below this get per-device cached facts (SM count, compute
// capability, kernel attributes); higher ones are queried on every call.
constexpr int kMaxCachedDevices = 64;

// Kernel 1: the token-parallel prologue, grid (chunk slots, value heads).
// `device`: the current device (its ordinal), where the launch goes.
cudaError_t launch_prologue(const FwdParams& p, int device, cudaStream_t stream);

// Kernel 2: the recurrence, one CTA per (sequence, value head, V-slice);
// kStateWarps = 8 / v_split warps (whole warpgroups: V split 1 or 2), 16 rows of
// V each; kStages chunks in flight.
// kCheckpoints: the variant that writes checkpoints (4 stages only).
// kDim: the caller's K = V; 64 runs one 4-warp CTA per (sequence, head).
// kBulkRecords: how a CTA loads its chunk records (recurrence_kernel.cuh); K = 128 only.
// kSuperposed: the segment scan's pass 1 writing o⁰ and P for the output kernel
// (segment_outputs.cuh).
// kEntryStorer: checkpoint entries written by a storer warpgroup (entry_storer.cuh).
constexpr bool kRecordsByBulkCopy = true, kRecordsByCpAsync = false;
constexpr bool kWithEntryStorer = true;
template <int kStateWarps, int kStages, bool kCheckpoints, int kDim = 128, bool kBulkRecords = kRecordsByCpAsync,
          bool kSuperposed = false, bool kEntryStorer = false>
cudaError_t launch_recurrence(const FwdParams& p, int64_t num_ctas, int device, cudaStream_t stream);

// V split 1: records by bulk copy.
extern template cudaError_t launch_recurrence<8, 4, false, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int,
                                                                                     cudaStream_t);
extern template cudaError_t launch_recurrence<8, 4, true, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int,
                                                                                    cudaStream_t);
// V split 2 and the segment scan: both ways (which one: sm90_forward.cu, records_by_bulk_copy).
extern template cudaError_t launch_recurrence<4, 4, false>(const FwdParams&, int64_t, int, cudaStream_t);
extern template cudaError_t launch_recurrence<4, 4, true>(const FwdParams&, int64_t, int, cudaStream_t);
extern template cudaError_t launch_recurrence<4, 4, false, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int,
                                                                                     cudaStream_t);
extern template cudaError_t launch_recurrence<4, 4, true, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int,
                                                                                    cudaStream_t);
// Checkpoints with the entry storer (LaunchPlan::entry_storer): bulk copy.
extern template cudaError_t launch_recurrence<8, 4, true, 128, kRecordsByBulkCopy, false, kWithEntryStorer>(
    const FwdParams&, int64_t, int, cudaStream_t);
extern template cudaError_t launch_recurrence<4, 4, true, 128, kRecordsByBulkCopy, false, kWithEntryStorer>(
    const FwdParams&, int64_t, int, cudaStream_t);
// V split 2, 3 stages (chosen where many CTAs share each SM): bulk copy.
extern template cudaError_t launch_recurrence<4, 3, false, 128, kRecordsByBulkCopy>(const FwdParams&, int64_t, int,
                                                                                     cudaStream_t);
// K = V = 64: cp.async (a part of each record).
extern template cudaError_t launch_recurrence<4, 4, false, 64>(const FwdParams&, int64_t, int, cudaStream_t);
extern template cudaError_t launch_recurrence<4, 4, true, 64>(const FwdParams&, int64_t, int, cudaStream_t);

// The segment scan's pass 1 with outputs by superposition: K = 128 by bulk copy
// (its grids are several CTAs an SM), K = 64 by cp.async.
extern template cudaError_t launch_recurrence<4, 4, false, 128, kRecordsByBulkCopy, true>(const FwdParams&, int64_t,
                                                                                           int, cudaStream_t);
extern template cudaError_t launch_recurrence<4, 4, false, 64, kRecordsByCpAsync, true>(const FwdParams&, int64_t, int,
                                                                                         cudaStream_t);

// Kernel 3, pass 2 of the segment scan (p.seg_chunks > 0): composes the segment
// summaries of pass 1 into every segment's incoming state (the instantiation of
// p.head_dim): the staged form with staged_rows (4, 8, 16 or 32) rows of S a
// CTA, or with 0 the register form (staged_compose_rows, sm90_forward.h).
cudaError_t launch_segment_compose(const FwdParams& p, int device, int staged_rows, cudaStream_t stream);
// The register form's CTAs per (sequence, value head) at K = 128 (half at 64), 4
// rows of S each: a step's latency is its loads of M, the same for any row
// count, and more CTAs spread the FMAs (segment_compose_kernel.cuh). The grid
// limit of the plan (sm90_forward.cu) is the register form's: the staged one's
// grid is at most the SM count.
constexpr int64_t kComposeCtasPerSeqHead = 32;

// Kernel 4, the segment scan's outputs by superposition (p.superpose): out = o⁰ +
// S_in·P, token-parallel, p.output_parts CTAs per (segment slot, value head),
// p.output_chunks chunks each (segment_output_kernel.cuh).
cudaError_t launch_segment_output(const FwdParams& p, int64_t num_ctas, int device, cudaStream_t stream);
// Chunks an output CTA: enough that loading and splitting its S_in (64 KB from
// L2) is a small part of its traffic (8 x 12 KB of o⁰ and P), few enough that a
// segment of 32 chunks (kMinSegmentChunks) still spreads over four CTAs. Where
// the grid is many waves deep anyway, twice as many halve the S_in loads: 1/1M
// and 4/1M −2.3 %, 12/32768 −2.8 %; at 12/8192 (1.45 waves at 16) level, so it
// keeps 8 (docs/perf-log.md, "chunks an output CTA").
constexpr int64_t kOutputChunksPerCta = 8;
constexpr int64_t kOutputChunksPerCtaDeep = 16;
// The deep form from this many waves of it on: two output CTAs an SM (its launch bounds).
constexpr int64_t kOutputDeepMinWaves = 4;
constexpr int64_t kOutputCtasPerSm = 2;

// Which devices one kernel's dynamic shared memory limit has been raised on
// (bit d: device d). The attribute belongs to the kernel's per-context function
// and never changes here (one fixed size per kernel), so it is set once per
// device rather than before every launch, where it was a driver call per kernel
// on the path of every small call. Zero-initialised as a namespace- or
// function-scope static.
struct SmemLimitSet {
  std::atomic<uint64_t> devices;
};

// Launches `kernel(p)` with `smem_bytes` of dynamic shared memory on `device`
// (the current device), raising the kernel's limit there to `limit_bytes`
// (default: smem_bytes; a kernel launched with several sizes passes its largest)
// first if not yet done. Returns the launch's error, else any error pending on
// this thread (cleared), as `kernel<<<...>>>(p); return cudaGetLastError();` does.
// after_previous_starts: launched with programmatic stream serialization, so its
// CTAs may start once every CTA of the previous kernel has started (or
// signalled, griddepcontrol.launch_dependents); the kernel itself orders what
// must come after that kernel (griddepcontrol.wait).
template <class Params>
cudaError_t launch_with_smem(const void* kernel, SmemLimitSet& limit, int device, dim3 grid, dim3 block,
                             size_t smem_bytes, cudaStream_t stream, const Params& p, size_t limit_bytes = 0,
                             bool after_previous_starts = false) {
  if (limit_bytes < smem_bytes) limit_bytes = smem_bytes;
  const uint64_t bit = device >= 0 && device < kMaxCachedDevices ? uint64_t{1} << device : 0;
  const bool was_set = bit != 0 && (limit.devices.load(std::memory_order_acquire) & bit) != 0;
  auto raise_limit = [&]() -> cudaError_t {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit_bytes));
    if (e == cudaSuccess && bit != 0) limit.devices.fetch_or(bit, std::memory_order_release);
    return e;
  };
  if (!was_set) {
    const cudaError_t e = raise_limit();
    if (e != cudaSuccess) return e;
  }
  void* args[] = {const_cast<Params*>(&p)};
  auto launch = [&]() -> cudaError_t {
    if (!after_previous_starts) return cudaLaunchKernel(kernel, grid, block, args, smem_bytes, stream);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelExC(&cfg, kernel, args);
  };
  cudaError_t err = launch();
  if (err != cudaSuccess && was_set) {
    // A failed launch queued nothing, so it may be retried. The cached bit can be
    // stale: cudaDeviceReset() destroys the context, and with it the attribute.
    // Any other error comes back again from the second attempt.
    cudaGetLastError();
    limit.devices.fetch_and(~bit, std::memory_order_release);
    err = raise_limit();
    if (err == cudaSuccess) err = launch();
  }
  const cudaError_t pending = cudaGetLastError();
  return err != cudaSuccess ? err : pending;
}

}  // namespace flashkda::sm90
