// What the decode kernels share: their parameters, work items, state accesses
// and token inputs. A decode step reads a few tokens per sequence and the
// sequence's state from an engine's pool, and writes the state back. Memory-
// bound at many sequences (every byte of state read and written once, the rest
// small), a latency chain at a few.
//
// Work split (every kernel): one CTA of 128 threads per work item (sequence,
// value head, slice of 32 rows of V); four threads share a row of V and hold
// 32 of its 128 key columns in registers (rows2: eight threads a row, 16 of its
// columns for each of two rows a thread); row dot products reduce over the
// row's lanes. The kernels: decode_latency_kernel.cuh (few sequences) and
// decode_fused_kernel.cuh (many); their A/B history is in docs/perf-log.md.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/gate.h"
#include "sm90/device_fault_record.cuh"

namespace flashkda::sm90 {

struct DecodeParams {
  const uint16_t* q;     // [T, H,  K] bf16
  const uint16_t* k;
  const uint16_t* v;     // [T, HV, V]
  const uint16_t* g;     // [T, HV, K]
  const uint16_t* beta;  // [T, HV]
  const float* A_log;    // [HV]
  const float* dt_bias;  // [HV, K]
  uint16_t* out;         // [T, HV, V]
  // The general inputs (DecodeArgs' gate_form, g_dtype, beta_is_probability,
  // beta_dtype), read only by the kernels' kGeneral builds, which every decode with
  // them runs: g_f32 / beta_f32 replace g / beta where those are fp32.
  const float* g_f32;
  const float* beta_f32;
  int32_t gate_log_decay;
  int32_t beta_probability;
  const int64_t* cu_seqlens;  // [N+1] or null: tokens_per_seq each; values clamped to [0, total_tokens]
  const int32_t* cu_seqlens32;  // the same as int32 (vLLM's offsets), instead of cu_seqlens
  int64_t tokens_per_seq;
  int64_t total_tokens, num_seqs;
  void* pool;              // slot s at pool + s·pool_stride elements
  void* out_pool;          // where the final states go (== pool in place)
  void* per_token_states;  // [T, HV, V, K] or null
  int64_t pool_stride, out_stride, pool_size;
  const void* indices;  // [N], or [N, verify_slots] with speculative verify
  int32_t index_is_64;
  int32_t num_heads, num_v_heads;
  float scale, lower_bound;
  // Speculative verify (speculative_verify(DecodeArgs); the verify kernel only):
  // sequence n starts from slot indices[n, num_accepted[n] − 1] (column 0
  // without num_accepted) and token t's state goes to slot indices[n, t − t0].
  int64_t verify_slots;
  const void* num_accepted;  // [N] or null, the index type
  // The token tensors' element strides between tokens and between heads
  // (DecodeArgs' *_token_stride / *_head_stride, dense values filled in): views of
  // one fused projection output are read in place, by the latency kernel's strided
  // build (decode_latency_kernel.cuh, kStrided); the other builds read dense
  // tensors with the addressing they were tuned with. Below 2^31
  // (check_decode_supported).
  int32_t q_token_stride, q_head_stride, k_token_stride, k_head_stride;
  int32_t v_token_stride, v_head_stride, g_token_stride, g_head_stride;
  int32_t beta_token_stride, beta_head_stride;
};

// Where token t, head h of a strided token tensor starts, in 64 bits: a head
// count times its stride may pass 2^31 (check_decode_strides refuses those, but
// the offset does not rely on it).
__device__ __forceinline__ int64_t q_at(const DecodeParams& p, int64_t t, int h) {
  return t * p.q_token_stride + static_cast<int64_t>(h) * p.q_head_stride;
}
__device__ __forceinline__ int64_t k_at(const DecodeParams& p, int64_t t, int h) {
  return t * p.k_token_stride + static_cast<int64_t>(h) * p.k_head_stride;
}
__device__ __forceinline__ int64_t v_at(const DecodeParams& p, int64_t t, int hv) {
  return t * p.v_token_stride + static_cast<int64_t>(hv) * p.v_head_stride;
}
__device__ __forceinline__ int64_t g_at(const DecodeParams& p, int64_t t, int hv) {
  return t * p.g_token_stride + static_cast<int64_t>(hv) * p.g_head_stride;
}
__device__ __forceinline__ int64_t beta_at(const DecodeParams& p, int64_t t, int hv) {
  return t * p.beta_token_stride + static_cast<int64_t>(hv) * p.beta_head_stride;
}

constexpr int kDecodeDim = 128;                                // K = V
constexpr int kDecodeRows = 32;                                // rows of V per CTA
constexpr int kDecodeThreads = 128;                            // 4 threads per row (rows2: 8)
constexpr int kDecodeSlices = kDecodeDim / kDecodeRows;        // CTAs per (sequence, head)
constexpr int kDecodeColsPerThread = kDecodeDim / 4;           // 32

template <bool kFp32>
struct StateIO {
  // Columns 4c .. 4c+3 of element offset `off` (a multiple of 4).
  static __device__ __forceinline__ float4 load4(const void* base, int64_t off) {
    if constexpr (kFp32) {
      return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + off);
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + off);
      return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                         __uint_as_float(w.y & 0xffff0000u));
    }
  }
  static __device__ __forceinline__ void store4(void* base, int64_t off, float4 x) {
    if constexpr (kFp32) {
      *reinterpret_cast<float4*>(static_cast<float*>(base) + off) = x;
    } else {
      __nv_bfloat162 a = __floats2bfloat162_rn(x.x, x.y), b = __floats2bfloat162_rn(x.z, x.w);
      uint2 w;
      w.x = *reinterpret_cast<uint32_t*>(&a);
      w.y = *reinterpret_cast<uint32_t*>(&b);
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(base) + off) = w;
    }
  }
};

__device__ __forceinline__ float bf16_at(const uint16_t* p, int64_t i) { return __uint_as_float(uint32_t(p[i]) << 16); }

// Programmatic dependent launch (DecodeArgs::programmatic_dependent_launch). With
// the launch attribute the grid may start while the previous kernel in the stream
// is still running; griddepcontrol.wait returns once that kernel has completed and
// its writes are visible. Every input (indices, tokens, weights, the pool) may be
// that kernel's output, and the pool may still be read by it, so the wait comes
// before the first global read and the first global write. Without the attribute
// the wait returns at once. launch_dependents lets the next kernel in the stream,
// if it was launched with the attribute, be scheduled now; it still waits for
// this grid's completion before reading, so signalling early is always safe.
// It is signalled right after the wait, so at most two decode grids are resident
// at a time and the next one's launch overlaps this one's work.
__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Which (sequence n, value head hv, slice of rows) work item this CTA is
// (item = blockIdx.x: one CTA per item), with hv's query/key head h. Index arithmetic
// only: safe before wait_for_prior_grids().
// kDivide32: items number below 2^31 (check_decode_supported), so 32-bit
// division does, and 64-bit division is a ~70-instruction call on the path
// from launch to the first load (the latency kernel uses 32 bits). The
// register-capped fused builds spill 32-56 bytes with it (ptxas), so they keep
// the 64-bit path, whose cost the bandwidth-bound steps hide.
struct DecodeTile {
  int64_t n;
  int hv, h, slice;
};
template <int kSlices, bool kDivide32 = false>
__device__ __forceinline__ DecodeTile decode_tile(const DecodeParams& p) {
  const int64_t item = blockIdx.x;
  DecodeTile w;
  if constexpr (kDivide32) {
    const uint32_t it = static_cast<uint32_t>(item), heads = static_cast<uint32_t>(p.num_v_heads);
    const uint32_t sh = it / kSlices;
    w.slice = static_cast<int>(it % kSlices);
    w.hv = static_cast<int>(sh % heads);
    w.n = static_cast<int64_t>(sh / heads);
  } else {
    w.slice = static_cast<int>(item % kSlices);
    const int64_t sh = item / kSlices;
    w.hv = static_cast<int>(sh % p.num_v_heads);
    w.n = sh / p.num_v_heads;
  }
  w.h = w.hv / (p.num_v_heads / p.num_heads);
  return w;
}

// Sequence n's pool slot (negative: padding) and its tokens [t0, t1). Reads
// inputs: only after wait_for_prior_grids(). The device-resident values are
// never trusted: the tokens are clamped to 0 <= t0 <= t1 <= T, and the kernels
// skip a slot outside [0, pool_size). `faults` says what was wrong (bit k: kind
// k of device_faults.h); the kernels hand it to report_decode_faults on their
// way out, where it is the only extra live value (recording it here, among the
// loads, made the register-capped rows2 kernel spill 40 more bytes).
struct DecodeSequence {
  int64_t slot, t0, t1;
  uint32_t faults;
};
__device__ __forceinline__ int64_t index_at(const DecodeParams& p, const void* base, int64_t i) {
  return p.index_is_64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}
// kVerify (speculative verify, DecodeParams::verify_slots): the slot comes from
// column num_accepted[n] − 1 of row n (a count outside [1, verify_slots] skips
// the sequence, recorded), and tokens past the row's verify_slots columns have
// no slot: they are not run (recorded).
template <bool kVerify = false>
__device__ __forceinline__ DecodeSequence decode_sequence(const DecodeParams& p, int64_t n) {
  DecodeSequence seq;
  if constexpr (!kVerify) {
    seq.slot = index_at(p, p.indices, n);
    seq.faults = seq.slot >= p.pool_size ? 1u << kFaultDecodeStateIndex : 0u;
  } else {
    seq.faults = 0u;
  }
  if (p.cu_seqlens != nullptr || p.cu_seqlens32 != nullptr) {
    // The two boundaries loaded by width first, then one clamp: two clamps were
    // 8 more bytes of spills in the register-capped fused kernels (4 -> 12).
    int64_t b, e;
    if (p.cu_seqlens != nullptr) {
      b = p.cu_seqlens[n];
      e = p.cu_seqlens[n + 1];
    } else {
      b = p.cu_seqlens32[n];
      e = p.cu_seqlens32[n + 1];
    }
    const ClampedSpan span = clamped_span_of(b, e, n, p.num_seqs, p.total_tokens);
    seq.t0 = span.begin;
    seq.t1 = span.end;
    if (!span.valid) seq.faults |= 1u << kFaultDecodeCuSeqlens;
  } else {
    seq.t0 = n * p.tokens_per_seq;
    seq.t1 = seq.t0 + p.tokens_per_seq;
  }
  if constexpr (kVerify) {
    if (seq.t1 - seq.t0 > p.verify_slots) {
      seq.t1 = seq.t0 + p.verify_slots;
      seq.faults |= 1u << kFaultDecodeVerifyLength;
    }
    int64_t column = 0;
    if (p.num_accepted != nullptr) {
      const int64_t accepted = index_at(p, p.num_accepted, n);
      column = accepted >= 1 && accepted <= p.verify_slots ? accepted - 1 : -1;
      if (column < 0) seq.faults |= 1u << kFaultDecodeAcceptedTokens;
    }
    seq.slot = column < 0 ? -1 : index_at(p, p.indices, n * p.verify_slots + column);
    if (seq.slot >= p.pool_size) seq.faults |= 1u << kFaultDecodeStateIndex;
  }
  return seq;
}

// Thread 0 of the item's first CTA (value head 0, slice 0) records the faults
// of its sequence: one record per sequence, not one per CTA.
template <bool kVerify = false>
__device__ __forceinline__ void report_decode_faults(const DecodeParams& p, const DecodeTile& tile, uint32_t faults) {
  if (faults == 0 || threadIdx.x != 0 || tile.hv != 0 || tile.slice != 0) return;
  if (faults & (1u << kFaultDecodeCuSeqlens)) record_fault(kFaultDecodeCuSeqlens, tile.n);
  if (faults & (1u << kFaultDecodeStateIndex)) record_fault(kFaultDecodeStateIndex, tile.n);
  if constexpr (kVerify) {
    if (faults & (1u << kFaultDecodeAcceptedTokens)) record_fault(kFaultDecodeAcceptedTokens, tile.n);
    if (faults & (1u << kFaultDecodeVerifyLength)) record_fault(kFaultDecodeVerifyLength, tile.n);
  }
}

// Four state columns c .. c+3 of a row: S ← S·diag(decay) + coef·k̂ᵀ, from the
// token's shared per-column vectors.
__device__ __forceinline__ void decay_and_update4(float* sg, float coef, const float* decay, const float* khat, int c) {
  const float4 d = *reinterpret_cast<const float4*>(decay + c);
  const float4 k = *reinterpret_cast<const float4*>(khat + c);
  sg[0] = fmaf(coef, k.x, sg[0] * d.x); sg[1] = fmaf(coef, k.y, sg[1] * d.y);
  sg[2] = fmaf(coef, k.z, sg[2] * d.z); sg[3] = fmaf(coef, k.w, sg[3] * d.w);
}

// One token's inputs for thread tid (column tid of q, k, g; row `row` of v), from
// dense tensors. kGeneral: g and beta from the general inputs' fp32 tensors where
// they are fp32 (DecodeParams::g_f32, beta_f32; dense too).
struct TokenInputs {
  float q, k, g, beta, v;
};
template <bool kGeneral = false>
__device__ __forceinline__ TokenInputs load_token_inputs(const DecodeParams& p, int64_t t, int h, int hv, int tid,
                                                         int row) {
  const int64_t qk_off = (t * p.num_heads + h) * kDecodeDim + tid;
  const int64_t vh = t * p.num_v_heads + hv;
  if constexpr (kGeneral) {
    const int64_t g_off = vh * kDecodeDim + tid;
    return {bf16_at(p.q, qk_off), bf16_at(p.k, qk_off), p.g_f32 != nullptr ? p.g_f32[g_off] : bf16_at(p.g, g_off),
            p.beta_f32 != nullptr ? p.beta_f32[vh] : bf16_at(p.beta, vh), bf16_at(p.v, vh * kDecodeDim + row)};
  } else {
    return {bf16_at(p.q, qk_off), bf16_at(p.k, qk_off), bf16_at(p.g, vh * kDecodeDim + tid), bf16_at(p.beta, vh),
            bf16_at(p.v, vh * kDecodeDim + row)};
  }
}

}  // namespace flashkda::sm90
