// Kernel 1, token-parallel: everything about a chunk that does not depend on the
// recurrent state. One CTA (8 warps) per (chunk slot, value head):
//   load      cp.async of the chunk's q, k, g; beta by 16 threads
//   prologue  norms, gates, decay prefix, decayed operands (prologue.cuh);
//             warp 0: L and its inverse (fp32 forward substitution), warp 1: Mqk;
//             all: w (chunk_matrices.cuh)
//   store     the ChunkOperands record, 16-byte coalesced stores; at K = 128 its
//             early part (Q_dec, K_res) by warps 2-7 while warps 0 and 1 build
//             the matrices, the rest at the end
#pragma once
#include "sm90/kernel/checkpoints.cuh"
#include "sm90/kernel/chunk_loader.cuh"
#include "sm90/kernel/chunk_matrices.cuh"
#include "sm90/device_fault_record.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/prologue.cuh"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/state_location.cuh"
#include "sm90/kernel/tile_scheduler.cuh"
#include "sm90/kernel/wide_decay.cuh"

namespace flashkda::sm90 {

// Four CTAs per SM fit (54 KB of shared memory, <= 64 registers a thread): while
// one waits on its loads or on its warp-0 inverse, the others compute.
constexpr int kPrologueMinCtasPerSm = 4;
// Warps 0 and 1 build the chunk's matrices (build_inverse, build_mqk); at K = 128
// the others store the record's early part meanwhile (shared_storage.cuh).
constexpr int kMatrixWarps = 2;

// The record's vectors with map indices (record_vector) [kBegin, kEnd) whose
// index in the range is t, t + kThreads, ... (t < kThreads), from shared to global
// memory; unrolled with compile-time counts, so each copy's offset is a constant
// (or a constant and t's whole atoms at K = 64: record_copy_offset).
template <int kDim, int kBegin, int kEnd, int kThreads>
__device__ __forceinline__ void store_record_range(uint4* record, const PrologueSmem& s, int t) {
  constexpr int kVectors = kEnd - kBegin, kCopies = (kVectors + kThreads - 1) / kThreads;
  static_assert(kBegin == 0 || kDim == kHeadDim, "K = 64 stores its whole record (record_copy_offset)");
  uint4* const dst = record + kBegin + t;
  const uint4* const src = reinterpret_cast<const uint4*>(static_cast<const ChunkOperands*>(&s)) + kBegin + t;
#pragma unroll
  for (int j = 0; j < kCopies; ++j) {
    if (kVectors % kThreads != 0 && j + 1 == kCopies && j * kThreads + t >= kVectors) break;
    const int off = record_copy_offset<kDim, kThreads>(j, t);
    dst[off] = src[off];
  }
}

// A varlen batch's set-up after the chunk: the longest-first order (where the
// plan runs one pass), every sequence's first checkpoint entry (where it takes
// periodic checkpoints), and the segment plan (where only the device has the
// lengths), by the CTA's kPrologueThreads threads; `smem`: the CTA's shared
// memory, free by then.
__device__ __noinline__ void batch_setup(const FwdParams& p, unsigned char* smem, int tid) {
  if (p.seq_order != nullptr) {
    order_sequences_longest_first<kPrologueThreads>(p, reinterpret_cast<int32_t*>(smem), tid);
    __syncthreads();
  }
  if (p.ck_first_entries != nullptr) {
    write_first_entries<kPrologueThreads>(p, reinterpret_cast<int64_t*>(smem), tid);
    __syncthreads();
  }
  if (p.seg_plan != nullptr) plan_segments_on_device<kPrologueThreads>(p, reinterpret_cast<int64_t*>(smem), tid);
}

// kDim: the caller's K = V (shared_storage.cuh): the columns past it load as zeros.
// The CTA of slot 0 and value head 0 also does the batch's set-up for the
// recurrence: kOrderSequences, a varlen batch's longest-first order (p.seq_order,
// tile_scheduler.cuh), first; kSetupLast, batch_setup after the chunk: its
// sequences' first checkpoint entries (p.ck_first_entries, checkpoints.cuh) and
// the device's segment plan (p.seg_plan), and the order too where p.seq_order
// is set. Each its own instantiation: with the sort's code in it, the kernel's
// registers and schedule changed throughout, and the K = 64 rows that order
// nothing measured 0.4-1.3 % slower; so the other calls keep a kernel without
// the set-up's code.
// kGeneralInputs: g as the log decay (GateForm::kLogDecay) or in fp32, beta as b
// itself or in fp32 (FwdParams' general inputs), and chunks whose decay is too
// wide for K_inv (wide_decay.cuh). Instantiations of their own, so that the
// default inputs' kernels keep their code.
template <int kDim, bool kOrderSequences, bool kSetupLast, bool kGeneralInputs = false>
__global__ void __launch_bounds__(kPrologueThreads, kPrologueMinCtasPerSm)
    kda_chunk_prologue_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  PrologueSmem& s = *reinterpret_cast<PrologueSmem*>(smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const ElementMap m(tid);

  // grid (slot, value head within its q/k head's group, q/k head): no division
  // for the GVA head map (two integer divisions were ~45 instructions a warp).
  const int64_t slot = blockIdx.x;
  const int qk_head = blockIdx.z;
  const int v_head = qk_head * gridDim.y + blockIdx.y;
  // Slot CTAs of value head 0 check one sequence each (there are at least N slots).
  if (v_head == 0 && tid == 0 && slot < p.num_seqs) {
    const ClampedSpan span = sequence_span(p, slot);
    if (!span.valid) record_fault(kFaultForwardCuSeqlens, slot);
    if (p.state_pool != nullptr && state_slot(p, slot) >= p.pool_size) record_fault(kFaultForwardStateIndex, slot);
    if (p.slot_ck_offsets != nullptr &&
        (slot_checkpoint_fault(p, slot, 0, span.end - span.begin) ||
         slot_checkpoint_fault(p, slot, 1, span.end - span.begin)))
      record_fault(kFaultForwardSlotCheckpoint, slot);
  }
  static_assert(sizeof(PrologueSmem) >= kOrderBins * sizeof(int32_t), "the order's bins fit the chunk's shared memory");
  if constexpr (kOrderSequences && !kSetupLast) {
    if (slot == 0 && v_head == 0) {
      order_sequences_longest_first<kPrologueThreads>(p, reinterpret_cast<int32_t*>(smem_raw), tid);
      __syncthreads();  // the bins' shared memory, before the chunk's loads reuse it
    }
  }
  // Otherwise the whole set-up comes after the CTA's own chunk (or in its
  // place), out of line: ahead of it, or inlined, the entries' code changed the
  // chunk's schedule (docs/perf-log.md). The recurrence reads none of it before
  // this kernel ends.
  auto batch_setup_last = [&] {
    if constexpr (kSetupLast) {
      if (slot == 0 && v_head == 0) {
        __syncthreads();  // the chunk's shared memory, before the set-up reuses it
        batch_setup(p, smem_raw, tid);
      }
    }
  };
  const ChunkTile chunk = locate_chunk(p, slot);
  if (!chunk.valid) {
    batch_setup_last();
    return;
  }

  // The small loads first: beta (16 threads) and A_log. Issued after the beta
  // branch, ptxas placed them behind the copies' wait, and warp 0 waited on beta
  // before issuing them: up to two more round trips before the first barrier.
  // dt_bias goes by 4-byte copies beside the chunk's: its pointer is promised
  // only 4-byte alignment, and ptxas put two plain 4-byte loads behind the wait.
  const bool real_column = kDim == kHeadDim || m.d0 < kDim;  // padding columns: zero k and q
  const bool beta_row = tid < kChunk && tid < chunk.rows;
  // The safe gate's scale and bias (the general inputs' log decay reads neither:
  // A_log and dt_bias may be null there).
  const bool safe_gate = !kGeneralInputs || !p.gate_log_decay;
  float beta_in = 0.f;  // the general inputs' beta, widened
  uint16_t beta_bits = 0;
  if constexpr (kGeneralInputs) {
    const int64_t at = (chunk.token_begin + tid) * p.beta_tok + static_cast<int64_t>(v_head) * p.beta_head;
    if (beta_row) beta_in = p.beta_f32 != nullptr ? p.beta_f32[at] : bf16_bits_to_float(p.beta[at]);
  } else {
    beta_bits =
        beta_row ? p.beta[(chunk.token_begin + tid) * p.beta_tok + static_cast<int64_t>(v_head) * p.beta_head] : 0;
  }
  const float a_log = real_column && safe_gate ? p.A_log[v_head] : 0.f;
  if (tid < kDim && safe_gate)
    cute::SM80_CP_ASYNC_CACHEALWAYS<uint32_t>::copy(
        *reinterpret_cast<const uint32_t*>(p.dt_bias + static_cast<int64_t>(v_head) * kDim + tid),
        *reinterpret_cast<uint32_t*>(&s.dt_bias[tid]));
  else if (tid < kHeadDim)
    s.dt_bias[tid] = 0.f;
  load_token_rows_async<kHeadDim, kPrologueThreads, kDim>(&s.q[0][0], kHeadDim, p.q, chunk.token_begin, chunk.rows,
                                                           p.q_tok, static_cast<int64_t>(qk_head) * p.q_head, 0, tid);
  load_token_rows_async<kHeadDim, kPrologueThreads, kDim>(&s.k[0][0], kHeadDim, p.k, chunk.token_begin, chunk.rows,
                                                           p.k_tok, static_cast<int64_t>(qk_head) * p.k_head, 0, tid);
  const float(*g32)[kHeadDim] = nullptr;  // the general inputs' fp32 g, in G's place (wide_decay.cuh)
  if (kGeneralInputs && p.g_f32 != nullptr) {
    g32 = wide_g(s);
    load_token_rows_async<kHeadDim, kPrologueThreads, kDim>(&wide_g(s)[0][0], kHeadDim, p.g_f32, chunk.token_begin,
                                                             chunk.rows, p.g_tok,
                                                             static_cast<int64_t>(v_head) * p.g_head, 0, tid);
  } else {
    load_token_rows_async<kHeadDim, kPrologueThreads, kDim>(&s.g[0][0], kHeadDim, p.g, chunk.token_begin, chunk.rows,
                                                             p.g_tok, static_cast<int64_t>(v_head) * p.g_head, 0, tid);
  }
  cute::cp_async_fence();
  // Padding columns get the gate of exp_a = 0 (finite whatever A_log is: an
  // exp(A_log) that overflows times their zero g would be NaN). exp by the MUFU
  // op: ~2^-22 of relative error in a scale of the gate's argument, against nine
  // instructions a thread for expf.
  const float e_a = ex2_approx(a_log * 1.4426950408889634f);
  const float exp_a = real_column ? clamp_gate_scale(e_a) : 0.f;  // common/gate.h; a NaN stays NaN
  cute::cp_async_wait<0>();
  if constexpr (kGeneralInputs) {
    if (tid < kChunk) s.beta_sig[tid] = p.beta_probability ? beta_in : sigmoid(beta_in);  // pad rows: 0 or 0.5
  } else {
    if (tid < kChunk) s.beta_sig[tid] = sigmoid(bf16_bits_to_float(beta_bits));  // pad rows: sigmoid(0)
  }
  __syncthreads();

  const GateConstants gate = gate_constants(exp_a, *reinterpret_cast<const float2*>(&s.dt_bias[m.d0]));
  row_norms(s, warp, lane, p.scale);
  float2 G[kRowsPerThread];
  bool wide = false;  // this chunk takes wide_decay.cuh's path (general inputs only)
  if constexpr (kGeneralInputs) {
    if (gate_prefix_general(s, m, gate, p.lower_bound_log2e, p.gate_log_decay != 0, g32, G))
      record_fault(kFaultForwardGate, chunk.token_begin);
    __syncthreads();
    finish_gate_prefix(s, m, G, chunk.rows, wide_g_last(s));
    bool below = false;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      below = below || G[r].x < -kMaxChunkDecayLog2 || G[r].y < -kMaxChunkDecayLog2;
    wide = __syncthreads_or(below) != 0;
    if (wide)
      write_decayed_operands_wide(s, m, G, gate, p.lower_bound_log2e, p.gate_log_decay != 0, g32);
    else
      write_decayed_operands(s, m, G);
    __syncthreads();
    if (wide) {
      wide_lower_sums<kDim>(s, warp, lane);
      __syncthreads();
    }
  } else {
    gate_prefix(s, m, gate, p.lower_bound_log2e, G);
    __syncthreads();
    finish_gate_prefix(s, m, G, chunk.rows);
    __syncthreads();
    write_decayed_operands(s, m, G);
    __syncthreads();
  }
  constexpr bool kEarlyPart = kDim == kHeadDim;
  constexpr int kStoreThreads = kPrologueThreads - kMatrixWarps * 32;
  auto record_address = [&] { return reinterpret_cast<uint4*>(const_cast<ChunkOperands*>(chunk_record(p, slot, v_head))); };
  // K = 64 computes it at the end: no address held across the matrices there.
  uint4* const record = kEarlyPart ? record_address() : nullptr;
  if (warp == 0) build_inverse<kDim, kGeneralInputs>(s, lane, wide ? wide_sums(s).l : nullptr);
  else if (warp == 1) build_mqk<kDim, kGeneralInputs>(s, lane, wide ? wide_sums(s).mqk : nullptr);
  else if constexpr (kEarlyPart)
    store_record_range<kDim, kRecordQdecVector, kRecordEarlyEnd, kStoreThreads>(record, s, tid - kMatrixWarps * 32);
  __syncthreads();
  build_w(s, warp, lane);
  __syncthreads();
  if constexpr (kEarlyPart) {
    store_record_range<kDim, 0, kRecordQdecVector, kPrologueThreads>(record, s, tid);
    store_record_range<kDim, kRecordEarlyEnd, record_vectors<kDim>(), kPrologueThreads>(record, s, tid);
  } else {
    store_record_range<kDim, 0, record_vectors<kDim>(), kPrologueThreads>(record_address(), s, tid);
  }
  batch_setup_last();
}

}  // namespace flashkda::sm90
