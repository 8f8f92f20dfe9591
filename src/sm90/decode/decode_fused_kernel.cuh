// The bandwidth-bound decode kernel (production from 256-512 (sequence, head)
// pairs: rows2 for fp32 pools, fuse-ef-occ for bf16, packed for bf16 one-token
// steps from 2048; the variants and the rule are in sm90_decode.cu, the
// measurements in docs/perf-log.md, decode). It started from d2, the first
// decode kernel (removed: the latency kernel replaced it), with the same work
// split (one 128-thread CTA per sequence, value head and slice of rows of V; the
// state in registers; per-column vectors in shared memory) and these changes:
//
// * One lane reduction after the state arrives instead of two. The output row is
//   S_new q̂ = (S_dec + coef k̂ᵀ) q̂ = S_dec q̂ + coef (k̂·q̂), so S_dec k̂ and S_dec q̂
//   are summed in the same pass and reduced together; k̂·q̂ is one more block sum
//   over the token's inputs, done while the state is still in flight. d2 reduces
//   S_dec k̂, then runs the update pass, then reduces S_new q̂.
// * The decay is folded into the shared vectors of that pass (decay·k̂ and
//   decay·q̂), so the dot products start on the loaded state directly and the
//   pass holds two shared vectors per column group instead of three; S·diag(decay)
//   is formed in the update pass, which is off the output's path.
// * Dot products in two independent FMA chains of 16 instead of one of 32 (more
//   chains cost registers that the 8-CTAs-per-SM bf16 build does not have).
// * No block barrier after the last token (it only protects the next token's
//   shared vectors).
// * bf16 pools moved in 16-byte accesses (8 columns), so a row's four lanes move
//   64 contiguous bytes per instruction as for fp32; d2 moves 32 bytes per row
//   per instruction for bf16 (8-byte accesses), one sector at a time.
// * State loads skip L1, and state loads and stores carry an L2 evict-first
//   policy: each state byte is read once and written once per step.
// * rows2 (fp32 pools): 8 lanes share a row and each thread holds two rows 16
//   apart, so a warp's state access is four whole 128-byte lines instead of
//   eight 64-byte halves, with the same 32 rows a CTA, 32 columns a thread and
//   7 CTAs per SM (N = 256: 279 against 285 µs).
// * packed (bf16 pools, one token a sequence): the state held as the pool's bf16
//   pairs (PackedBf16StateRegs), 48 registers and 10 CTAs per SM instead of 64
//   and 8, so more state in flight (N = 256: 153 against 163 µs).
// The knobs: DecodePolicy (the minimum CTAs per SM, the lanes a row, the rows a
// thread) and the kernel's kPacked (which state registers). The variants built
// are listed in sm90_decode.cu. Variants that lost the A/B (no cache hints, 8
// lanes a row with one row a thread, 2 lanes a row, a persistent grid, 8-byte
// bf16 accesses) are in the perf log, not here.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "sm90/decode/decode_common.cuh"

namespace flashkda::sm90 {

// kLanes lanes share a row of V (4: 32 rows per CTA; 8: 16 rows per CTA, twice
// the CTAs); each state access is 16 bytes (4 fp32 or 8 bf16 columns), so a
// row's lanes move 16·kLanes contiguous bytes per instruction (8 lanes: whole
// 128-byte lines for fp32). kRowsPerThread: rows a thread holds, kDecodeThreads /
// kLanes apart (2 with 8 lanes: 32 rows per CTA and 32 state columns a thread,
// as with 4 lanes, but whole lines). kMinBlocksFp32 / kMinBlocksBf16:
// __launch_bounds__ minimum CTAs per SM.
template <int kMinBlocksFp32_, int kMinBlocksBf16_, int kLanes_ = 4, int kRowsPerThread_ = 1>
struct DecodePolicy {
  static constexpr int kLanes = kLanes_;
  static constexpr int kRowsPerThread = kRowsPerThread_;
  static constexpr int kVecBf16 = 8;
  static constexpr int kMinBlocksFp32 = kMinBlocksFp32_;
  static constexpr int kMinBlocksBf16 = kMinBlocksBf16_;
  static constexpr int kRowStep = kDecodeThreads / kLanes;       // rows between a thread's rows
  static constexpr int kRows = kRowStep * kRowsPerThread;        // rows of V per CTA
  static constexpr int kSlices = kDecodeDim / kRows;             // CTAs per (sequence, head)
  static constexpr int kCols = kDecodeDim / kLanes;              // state columns per thread and row
  static_assert(kLanes == 4 || kLanes == 8, "a row's lanes reduce with shuffles inside a warp");
  static_assert(kSlices == kDecodeSlices, "every decode kernel has the same work items (sm90_decode.cu sizes the grid)");
};

// An L2 policy that makes lines first in line for eviction.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// One 16-byte state vector as four raw 32-bit words, with the streaming hints.
struct WordIO {
  static __device__ __forceinline__ void load(const uint32_t* p, uint32_t (&w)[4], uint64_t policy) {
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "l"(p), "l"(policy));
  }
  static __device__ __forceinline__ void store(uint32_t* p, const uint32_t (&w)[4], uint64_t policy) {
    asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                 :: "l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]), "l"(policy) : "memory");
  }
};

// kVec consecutive state columns at element offset `off` (a multiple of kVec), as floats.
template <bool kFp32, int kVec>
struct StateVecIO {
  static constexpr int kWords = kFp32 ? kVec : kVec / 2;
  static_assert(kWords == 4, "16-byte state accesses");
  using Words = WordIO;
  static __device__ __forceinline__ void load(const void* base, int64_t off, float* x, uint64_t policy) {
    uint32_t w[kWords];
    if constexpr (kFp32) {
      Words::load(reinterpret_cast<const uint32_t*>(static_cast<const float*>(base) + off), w, policy);
#pragma unroll
      for (int i = 0; i < kWords; ++i) x[i] = __uint_as_float(w[i]);
    } else {
      Words::load(reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(base) + off), w, policy);
#pragma unroll
      for (int i = 0; i < kWords; ++i) {  // the lower address is the low half
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
    }
  }
  static __device__ __forceinline__ void store(void* base, int64_t off, const float* x, uint64_t policy) {
    uint32_t w[kWords];
    if constexpr (kFp32) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = __float_as_uint(x[i]);
      Words::store(reinterpret_cast<uint32_t*>(static_cast<float*>(base) + off), w, policy);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&b);
      }
      Words::store(reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(base) + off), w, policy);
    }
  }
};

// Sum over the block (128 threads = 4 warps) of three values at once.
__device__ __forceinline__ float3 block_sum3(float a, float b, float c, float4* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
    c += __shfl_xor_sync(0xffffffffu, c, off);
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = make_float4(a, b, c, 0.f);
  __syncthreads();
  float4 s = scratch[0];
#pragma unroll
  for (int w = 1; w < kDecodeThreads / 32; ++w) {
    s.x += scratch[w].x;
    s.y += scratch[w].y;
    s.z += scratch[w].z;
  }
  return make_float3(s.x, s.y, s.z);
}

// Thread (row, lane) holds the columns kVec·(lane + kLanes·j) + e (j < kCols/kVec,
// e < kVec): a row's lanes cover kLanes·kVec contiguous columns per access, and
// the shared per-column vectors are read in 4-column groups: group g of the
// thread (s[4g .. 4g+3]) is columns kVec·(lane + kLanes·(g / (kVec/4))) + 4·(g % (kVec/4)).
template <bool kFp32, class P>
struct FusedLayout {
  static constexpr int kLanes = P::kLanes, kRows = P::kRows, kSlices = P::kSlices, kCols = P::kCols;
  static constexpr int kRowsPerThread = P::kRowsPerThread, kRowStep = P::kRowStep;
  static constexpr int kVec = kFp32 ? 4 : P::kVecBf16;
  static constexpr int kGroupsPerVec = kVec / 4, kGroups = kCols / 4;
  using IO = StateVecIO<kFp32, kVec>;
  static __device__ __forceinline__ int col_of_group(int g, int lane) {
    return kVec * (lane + kLanes * (g / kGroupsPerVec)) + 4 * (g % kGroupsPerVec);
  }
  // Element offset, within a row, of the thread's j-th state vector.
  static __device__ __forceinline__ int col_of_vec(int j, int lane) { return kVec * (lane + kLanes * j); }
  // Element offset of the j-th state vector of the thread's row i, from its first
  // row's first column.
  static __device__ __forceinline__ int64_t vec_off(int i, int j, int lane) {
    return int64_t{i} * kRowStep * kDecodeDim + col_of_vec(j, lane);
  }
};

// The token's per-column vectors, shared by the CTA.
struct FusedVectors {
  __align__(16) float khat[kDecodeDim];
  __align__(16) float decay[kDecodeDim];
  __align__(16) float dkhat[kDecodeDim];  // decay · k̂
  __align__(16) float dqhat[kDecodeDim];  // decay · q̂ · scale
  float4 scratch[kDecodeThreads / 32];
  // k̂·q̂ (scale folded in): one shared value rather than a register kept across the
  // state pass, which the 64-register bf16 builds would spill.
  float kq;
};

// The token's per-column vectors into `sh` (thread tid: column tid), k̂·q̂·scale
// into sh.kq, and the token's beta gate, returned. Ends with a block barrier:
// `sh` is then readable by every thread. kGeneral: g may be the log decay itself
// (DecodeParams::gate_log_decay; one above 0 is read as 0 and recorded against
// token t, as the latency kernel does) and beta b itself (beta_probability).
template <bool kGeneral = false>
__device__ __forceinline__ float fused_token_vectors(const DecodeParams& p, FusedVectors& sh, const TokenInputs& in,
                                                     float exp_a, float dt_bias, int64_t t) {
  const int tid = threadIdx.x;
  float dec, b;
  if (kGeneral && p.gate_log_decay != 0) {
    if (in.g > 0.f) record_fault(kFaultDecodeGate, t);
    dec = expf(in.g > 0.f ? 0.f : in.g);  // a NaN stays NaN
  } else {
    const float x = exp_a * (in.g + dt_bias);
    dec = expf(p.lower_bound / (1.f + expf(-x)));  // exp(lower_bound·sigmoid(x))
  }
  if (kGeneral && p.beta_probability != 0)
    b = in.beta;
  else
    b = 1.f / (1.f + expf(-in.beta));
  const float3 ss = block_sum3(in.q * in.q, in.k * in.k, in.q * in.k, sh.scratch);
  const float qn = sqrtf(ss.x + 1e-6f), kn = sqrtf(ss.y + 1e-6f);
  const float kh_d = in.k / kn, qh_d = in.q / qn * p.scale;
  sh.khat[tid] = kh_d;
  sh.decay[tid] = dec;
  sh.dkhat[tid] = dec * kh_d;
  sh.dqhat[tid] = dec * qh_d;
  if (tid == 0) sh.kq = ss.z / (qn * kn) * p.scale;
  __syncthreads();
  return b;
}

// The thread's state registers for rows row0 + i·kRowStep, read and written in
// 4-column groups (group g of row i: columns col_of_group(g, lane)), loaded from
// and stored to element offset `base` (row0's first column) of a state array.
// FloatStateRegs keeps them as floats (any pool dtype; a sequence's tokens
// accumulate in fp32 and are rounded once, on the store).
template <bool kFp32, class P>
struct FloatStateRegs {
  using L = FusedLayout<kFp32, P>;
  float v[P::kRowsPerThread][P::kCols];
  __device__ __forceinline__ float4 group(int i, int g) const {
    return make_float4(v[i][4 * g], v[i][4 * g + 1], v[i][4 * g + 2], v[i][4 * g + 3]);
  }
  __device__ __forceinline__ float4 group_for_update(int i, int g) const { return group(i, g); }
  __device__ __forceinline__ void set_group(int i, int g, float4 x) {
    v[i][4 * g] = x.x; v[i][4 * g + 1] = x.y; v[i][4 * g + 2] = x.z; v[i][4 * g + 3] = x.w;
  }
  __device__ __forceinline__ void load(const void* src, int64_t base, int lane, uint64_t policy) {
#pragma unroll
    for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < L::kCols / L::kVec; ++j)
        L::IO::load(src, base + L::vec_off(i, j, lane), &v[i][L::kVec * j], policy);
  }
  __device__ __forceinline__ void store(void* dst, int64_t base, int lane, uint64_t policy) const {
#pragma unroll
    for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < L::kCols / L::kVec; ++j)
        L::IO::store(dst, base + L::vec_off(i, j, lane), &v[i][L::kVec * j], policy);
  }
};

// bf16 pools: the state kept as the pool's bf16 pairs, half the registers of
// FloatStateRegs (so more CTAs per SM, more state in flight). Every set_group
// rounds to bf16, so a sequence's state is rounded after each of its tokens:
// the same result as FloatStateRegs for one token a sequence, not for more
// (sm90_decode.cu runs it for one token a sequence only).
template <class P>
struct PackedBf16StateRegs {
  using L = FusedLayout<false, P>;
  static constexpr int kWords = P::kCols / 2;  // two columns a word, the lower column in the low half
  uint32_t w[P::kRowsPerThread][kWords];
  __device__ __forceinline__ float4 group(int i, int g) const {
    const uint32_t a = w[i][2 * g], b = w[i][2 * g + 1];
    return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u), __uint_as_float(b << 16),
                       __uint_as_float(b & 0xffff0000u));
  }
  // The same values as group(), unpacked by byte permutes instead of shifts so
  // that the compiler does not keep the dot-product pass's unpacked floats alive
  // until the update pass (which would cost the registers packing saves).
  __device__ __forceinline__ float4 group_for_update(int i, int g) const {
    const uint32_t a = w[i][2 * g], b = w[i][2 * g + 1];
    return make_float4(__uint_as_float(__byte_perm(a, 0u, 0x1044)), __uint_as_float(__byte_perm(a, 0u, 0x3244)),
                       __uint_as_float(__byte_perm(b, 0u, 0x1044)), __uint_as_float(__byte_perm(b, 0u, 0x3244)));
  }
  __device__ __forceinline__ void set_group(int i, int g, float4 x) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    w[i][2 * g] = *reinterpret_cast<const uint32_t*>(&lo);
    w[i][2 * g + 1] = *reinterpret_cast<const uint32_t*>(&hi);
  }
  __device__ __forceinline__ void load(const void* src, int64_t base, int lane, uint64_t policy) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma unroll
    for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < L::kCols / L::kVec; ++j) {
        uint32_t(&x)[4] = *reinterpret_cast<uint32_t(*)[4]>(&w[i][4 * j]);
        WordIO::load(reinterpret_cast<const uint32_t*>(s + base + L::vec_off(i, j, lane)), x, policy);
      }
  }
  __device__ __forceinline__ void store(void* dst, int64_t base, int lane, uint64_t policy) const {
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma unroll
    for (int i = 0; i < L::kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < L::kCols / L::kVec; ++j) {
        const uint32_t(&x)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&w[i][4 * j]);
        WordIO::store(reinterpret_cast<uint32_t*>(d + base + L::vec_off(i, j, lane)), x, policy);
      }
  }
};

// Tokens [t0, t1) of one sequence on the thread's state columns s[i] of rows
// row0 + i·kRowStep of value head hv, writing out (and the per-token states).
// `next` holds token t0's inputs (its v: row0's); each token requests the
// following one's before its own math. The caller needs a barrier before `sh`
// is written again after this returns.
template <bool kFp32, class P, bool kGeneral, class Regs>
__device__ __forceinline__ void fused_tokens(const DecodeParams& p, FusedVectors& sh, Regs& s, TokenInputs next,
                                             int64_t t0, int64_t t1, int h, int hv, int row0, int lane, float exp_a,
                                             float dt_bias, uint64_t policy) {
  using L = FusedLayout<kFp32, P>;
  constexpr int R = L::kRowsPerThread;
  const int tid = threadIdx.x;
  for (int64_t t = t0; t < t1; ++t) {
    const TokenInputs in = next;
    if (t + 1 < t1) next = load_token_inputs<kGeneral>(p, t + 1, h, hv, tid, row0);
    const int64_t vh = t * p.num_v_heads + hv;
    float v[R];
    v[0] = in.v;
#pragma unroll
    for (int i = 1; i < R; ++i) v[i] = bf16_at(p.v, vh * kDecodeDim + row0 + i * L::kRowStep);
    const float b = fused_token_vectors<kGeneral>(p, sh, in, exp_a, dt_bias, t);

    // (S·diag(decay)) k̂ and (S·diag(decay)) q̂ in two chains each, then one lane reduction.
    float sk[R], sq[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float2 sk2 = make_float2(0.f, 0.f), sq2 = sk2;
#pragma unroll
      for (int g = 0; g < L::kGroups; ++g) {
        const int c = L::col_of_group(g, lane);
        const float4 dk = *reinterpret_cast<const float4*>(&sh.dkhat[c]);
        const float4 dq = *reinterpret_cast<const float4*>(&sh.dqhat[c]);
        const float4 sg = s.group(i, g);
        sk2.x = fmaf(sg.y, dk.y, fmaf(sg.x, dk.x, sk2.x));
        sk2.y = fmaf(sg.w, dk.w, fmaf(sg.z, dk.z, sk2.y));
        sq2.x = fmaf(sg.y, dq.y, fmaf(sg.x, dq.x, sq2.x));
        sq2.y = fmaf(sg.w, dq.w, fmaf(sg.z, dq.z, sq2.y));
      }
      sk[i] = sk2.x + sk2.y;
      sq[i] = sq2.x + sq2.y;
    }
#pragma unroll
    for (int off = 1; off < L::kLanes; off <<= 1)
#pragma unroll
      for (int i = 0; i < R; ++i) {
        sk[i] += __shfl_xor_sync(0xffffffffu, sk[i], off);
        sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], off);
      }
    // S ← S·diag(decay) + b (v − S k̂) k̂ᵀ; o = scale · S q̂ = sq + coef · (k̂·q̂)
    const float kq = sh.kq;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float coef = b * (v[i] - sk[i]);
      if (lane == 0) {
        const __nv_bfloat16 ob = __float2bfloat16_rn(fmaf(coef, kq, sq[i]));
        p.out[vh * kDecodeDim + row0 + i * L::kRowStep] = *reinterpret_cast<const uint16_t*>(&ob);
      }
#pragma unroll
      for (int g = 0; g < L::kGroups; ++g) {
        float4 x = s.group_for_update(i, g);
        decay_and_update4(&x.x, coef, sh.decay, sh.khat, L::col_of_group(g, lane));
        s.set_group(i, g, x);
      }
    }
    if (p.per_token_states != nullptr) {
      const int64_t head_off = (static_cast<int64_t>(hv) * kDecodeDim + row0) * kDecodeDim;
      const int64_t base = t * p.num_v_heads * int64_t{kDecodeDim} * kDecodeDim + head_off;
      s.store(p.per_token_states, base, lane, policy);
    }
    if (t + 1 < t1) __syncthreads();  // the next token overwrites the shared vectors and scratch
  }
}

// kPacked (bf16 pools only): the state in PackedBf16StateRegs, else FloatStateRegs.
// kGeneral: the general inputs (DecodeParams::gate_log_decay, beta_probability,
// g_f32, beta_f32) read at run time, dense as every input of this kernel; twins of
// their own, so that the default inputs' builds keep their code.
template <bool kFp32, class P, bool kPacked = false, bool kGeneral = false>
__global__ void __launch_bounds__(kDecodeThreads, kFp32 ? P::kMinBlocksFp32 : P::kMinBlocksBf16)
    kda_decode_fused_kernel(const __grid_constant__ DecodeParams p) {
  static_assert(!(kPacked && kFp32), "packed state registers hold bf16 pools");
  using L = FusedLayout<kFp32, P>;
  using Regs = std::conditional_t<kPacked, PackedBf16StateRegs<P>, FloatStateRegs<kFp32, P>>;
  __shared__ FusedVectors sh;

  const DecodeTile tile = decode_tile<L::kSlices>(p);
  const int tid = threadIdx.x;
  const int row = tile.slice * L::kRows + tid / L::kLanes, lane = tid % L::kLanes;  // the thread's first row
  const uint64_t policy = l2_evict_first_policy();
  wait_for_prior_grids();
  allow_dependent_grids();

  // As in d2: everything that does not depend on the pool slot is requested first.
  const DecodeSequence seq = decode_sequence(p, tile.n);
  // The gate's weights too: requested after the state, the token's vectors wait
  // for them after the state arrives (N = 64 bf16: 44.4 against 42.0 µs). rows2
  // spills one register here (ptxas: 4 bytes), to L1.
  // The general inputs' log decay reads neither A_log nor dt_bias, which may then be null.
  const bool log_decay = kGeneral && p.gate_log_decay != 0;
  // Clamped as the forward's prologue clamps it (common/gate.h): exp(A_log) past
  // fp32's range times a zero g + dt_bias is the contract's sigmoid(0), not NaN.
  const float exp_a = log_decay ? 0.f : clamp_gate_scale(expf(p.A_log[tile.hv]));
  // thread tid: column tid
  const float dt_bias = log_decay ? 0.f : p.dt_bias[static_cast<int64_t>(tile.hv) * kDecodeDim + tid];
  TokenInputs first{};
  if (seq.t0 < seq.t1) first = load_token_inputs<kGeneral>(p, seq.t0, tile.h, tile.hv, tid, row);
  if (seq.slot < 0 || seq.slot >= p.pool_size) {  // padding entry or index past the pool: no access
    report_decode_faults(p, tile, seq.faults);
    return;
  }

  const int64_t head_off = (static_cast<int64_t>(tile.hv) * kDecodeDim + row) * kDecodeDim;
  Regs s;
  s.load(p.pool, seq.slot * p.pool_stride + head_off, lane, policy);
  fused_tokens<kFp32, P, kGeneral>(p, sh, s, first, seq.t0, seq.t1, tile.h, tile.hv, row, lane, exp_a, dt_bias, policy);
  s.store(p.out_pool, seq.slot * p.out_stride + head_off, lane, policy);
  report_decode_faults(p, tile, seq.faults);
}

}  // namespace flashkda::sm90
