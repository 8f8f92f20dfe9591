// The decode kernel: a few tokens per sequence, the state read from and written
// back to an engine's pool. Memory-bound: every byte of state is read and written
// once, everything else is small.
//
// One CTA of 128 threads per (sequence, value head, slice of 32 rows of V):
// thread (row, part) holds 32 of the row's 128 key columns in registers, the
// columns 4·(part + 4·jj) + e (jj < 8, e < 4), so that the four threads of a row
// move 64 contiguous bytes per load and read the shared per-column vectors
// without bank conflicts. Row dot products reduce over the row's 4 lanes.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

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
  const int64_t* cu_seqlens;  // [N+1] or null: tokens_per_seq each
  int64_t tokens_per_seq;
  void* pool;              // slot s at pool + s·pool_stride elements
  void* out_pool;          // where the final states go (== pool in place)
  void* per_token_states;  // [T, HV, V, K] or null
  int64_t pool_stride, out_stride, pool_size;
  const void* indices;  // [N]
  int32_t index_is_64;
  int32_t num_heads, num_v_heads;
  float scale, lower_bound;
};

constexpr int kDecodeDim = 128;                                // K = V
constexpr int kDecodeRows = 32;                                // rows of V per CTA
constexpr int kDecodeThreads = 128;                            // 4 threads per row
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

// Which (sequence n, value head hv, slice of rows) blockIdx.x serves, with hv's
// query/key head h. Index arithmetic only: safe before wait_for_prior_grids().
struct DecodeTile {
  int64_t n;
  int hv, h, slice;
};
template <int kSlices>
__device__ __forceinline__ DecodeTile decode_tile(const DecodeParams& p) {
  const int64_t cta = blockIdx.x;
  DecodeTile w;
  w.slice = static_cast<int>(cta % kSlices);
  const int64_t sh = cta / kSlices;
  w.hv = static_cast<int>(sh % p.num_v_heads);
  w.n = sh / p.num_v_heads;
  w.h = w.hv / (p.num_v_heads / p.num_heads);
  return w;
}

// Sequence n's pool slot (negative: padding) and its tokens [t0, t1). Reads
// inputs: only after wait_for_prior_grids().
struct DecodeSequence {
  int64_t slot, t0, t1;
};
__device__ __forceinline__ DecodeSequence decode_sequence(const DecodeParams& p, int64_t n) {
  DecodeSequence seq;
  seq.slot = p.index_is_64 ? static_cast<const int64_t*>(p.indices)[n] : static_cast<const int32_t*>(p.indices)[n];
  seq.t0 = p.cu_seqlens != nullptr ? p.cu_seqlens[n] : n * p.tokens_per_seq;
  seq.t1 = p.cu_seqlens != nullptr ? p.cu_seqlens[n + 1] : seq.t0 + p.tokens_per_seq;
  return seq;
}

// Sum over the block (128 threads = 4 warps) of two values at once.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = make_float2(a, b);
  __syncthreads();
  float2 s = scratch[0];
#pragma unroll
  for (int w = 1; w < kDecodeThreads / 32; ++w) {
    s.x += scratch[w].x;
    s.y += scratch[w].y;
  }
  return s;
}

// One token's inputs for thread tid (column tid of q, k, g; row `row` of v).
struct TokenInputs {
  float q, k, g, beta, v;
};
__device__ __forceinline__ TokenInputs load_token_inputs(const DecodeParams& p, int64_t t, int h, int hv, int tid,
                                                         int row) {
  const int64_t qk_off = (t * p.num_heads + h) * kDecodeDim + tid;
  const int64_t vh = t * p.num_v_heads + hv;
  return {bf16_at(p.q, qk_off), bf16_at(p.k, qk_off), bf16_at(p.g, vh * kDecodeDim + tid), bf16_at(p.beta, vh),
          bf16_at(p.v, vh * kDecodeDim + row)};
}

// bf16 pools move half the bytes per thread: eight CTAs an SM (64 registers a
// thread) keep enough of them in flight (measured 182 against 219 µs at N = 256,
// H = 32). fp32 pools reached ~92 % of copy bandwidth with and without the cap,
// and 3.36 against 3.14 µs at N = 1 with it, so they go without (docs/perf-log.md).
template <bool kFp32>
__global__ void __launch_bounds__(kDecodeThreads, kFp32 ? 1 : 8) kda_decode_kernel(const __grid_constant__ DecodeParams p) {
  using IO = StateIO<kFp32>;
  __shared__ __align__(16) float khat[kDecodeDim];
  __shared__ __align__(16) float qhat[kDecodeDim];  // scale folded in
  __shared__ __align__(16) float decay[kDecodeDim];
  __shared__ float2 scratch[kDecodeThreads / 32];

  const DecodeTile tile = decode_tile<kDecodeSlices>(p);
  const int64_t n = tile.n;
  const int hv = tile.hv, h = tile.h, slice = tile.slice;
  const int tid = threadIdx.x;
  wait_for_prior_grids();
  allow_dependent_grids();
  // Everything that does not depend on the pool slot is requested before the
  // slot is known: at one sequence the step is a chain of memory latencies.
  const DecodeSequence seq = decode_sequence(p, n);
  const int64_t t0 = seq.t0, t1 = seq.t1;
  const float exp_a = expf(p.A_log[hv]);
  const float dt_bias = p.dt_bias[static_cast<int64_t>(hv) * kDecodeDim + tid];  // thread tid: column tid
  TokenInputs next{};
  if (t0 < t1) next = load_token_inputs(p, t0, h, hv, tid, slice * kDecodeRows + tid / 4);
  // Padding entries (negative), and indices past the pool, which only the host
  // could report and cannot see here: nothing is read or written.
  const int64_t slot = seq.slot;
  if (slot < 0 || slot >= p.pool_size) return;

  const int row = slice * kDecodeRows + tid / 4, part = tid & 3;
  const int64_t head_off = (static_cast<int64_t>(hv) * kDecodeDim + row) * kDecodeDim;

  float s[kDecodeColsPerThread];  // s[4·jj + e] = S[row][4·(part + 4·jj) + e]
  {
    const int64_t base = slot * p.pool_stride + head_off;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const float4 x = IO::load4(p.pool, base + 4 * (part + 4 * jj));
      s[4 * jj] = x.x; s[4 * jj + 1] = x.y; s[4 * jj + 2] = x.z; s[4 * jj + 3] = x.w;
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    // Per-column quantities of this token: thread tid computes column tid. The
    // next token's inputs are requested now, so their latency hides behind this one.
    const TokenInputs in = next;
    if (t + 1 < t1) next = load_token_inputs(p, t + 1, h, hv, tid, row);
    const int64_t vh = t * p.num_v_heads + hv;
    const float qd = in.q, kd = in.k, vr = in.v;
    const float x = exp_a * (in.g + dt_bias);
    const float dec = expf(p.lower_bound / (1.f + expf(-x)));  // exp(lower_bound·sigmoid(x))
    const float b = 1.f / (1.f + expf(-in.beta));
    const float2 ss = block_sum2(qd * qd, kd * kd, scratch);
    khat[tid] = kd / sqrtf(ss.y + 1e-6f);
    qhat[tid] = qd / sqrtf(ss.x + 1e-6f) * p.scale;
    decay[tid] = dec;
    __syncthreads();

    // S ← S·diag(decay); sk = S k̂ (row dot, 4 lanes)
    float sk = 0.f;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int c = 4 * (part + 4 * jj);
      const float4 dk = *reinterpret_cast<const float4*>(&decay[c]);
      const float4 kh = *reinterpret_cast<const float4*>(&khat[c]);
      s[4 * jj] *= dk.x; s[4 * jj + 1] *= dk.y; s[4 * jj + 2] *= dk.z; s[4 * jj + 3] *= dk.w;
      sk = fmaf(s[4 * jj], kh.x, fmaf(s[4 * jj + 1], kh.y, fmaf(s[4 * jj + 2], kh.z, fmaf(s[4 * jj + 3], kh.w, sk))));
    }
    sk += __shfl_xor_sync(0xffffffffu, sk, 1);
    sk += __shfl_xor_sync(0xffffffffu, sk, 2);
    // S ← S + b (v − S k̂) k̂ᵀ; o = scale · S q̂
    const float coef = b * (vr - sk);
    float o = 0.f;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int c = 4 * (part + 4 * jj);
      const float4 kh = *reinterpret_cast<const float4*>(&khat[c]);
      const float4 qh = *reinterpret_cast<const float4*>(&qhat[c]);
      s[4 * jj] = fmaf(coef, kh.x, s[4 * jj]);
      s[4 * jj + 1] = fmaf(coef, kh.y, s[4 * jj + 1]);
      s[4 * jj + 2] = fmaf(coef, kh.z, s[4 * jj + 2]);
      s[4 * jj + 3] = fmaf(coef, kh.w, s[4 * jj + 3]);
      o = fmaf(s[4 * jj], qh.x, fmaf(s[4 * jj + 1], qh.y, fmaf(s[4 * jj + 2], qh.z, fmaf(s[4 * jj + 3], qh.w, o))));
    }
    o += __shfl_xor_sync(0xffffffffu, o, 1);
    o += __shfl_xor_sync(0xffffffffu, o, 2);
    if (part == 0) {
      const __nv_bfloat16 ob = __float2bfloat16_rn(o);
      p.out[vh * kDecodeDim + row] = *reinterpret_cast<const uint16_t*>(&ob);
    }
    if (p.per_token_states != nullptr) {
      const int64_t base = t * p.num_v_heads * int64_t{kDecodeDim} * kDecodeDim + head_off;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
        IO::store4(p.per_token_states, base + 4 * (part + 4 * jj),
                   make_float4(s[4 * jj], s[4 * jj + 1], s[4 * jj + 2], s[4 * jj + 3]));
    }
    __syncthreads();  // the next token overwrites khat, qhat, decay, scratch
  }

  const int64_t base = slot * p.out_stride + head_off;
#pragma unroll
  for (int jj = 0; jj < 8; ++jj)
    IO::store4(p.out_pool, base + 4 * (part + 4 * jj), make_float4(s[4 * jj], s[4 * jj + 1], s[4 * jj + 2], s[4 * jj + 3]));
}

}  // namespace flashkda::sm90
