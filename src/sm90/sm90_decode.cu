// Host side of the GPU decode: support check and launch.
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "common/sequences.h"
#include "sm90/decode/decode_common.cuh"
#include "sm90/decode/decode_fused_kernel.cuh"
#include "sm90/decode/decode_latency_kernel.cuh"
#include "sm90/gate_inputs.h"
#include "sm90/sm90_decode.h"
#include "sm90/sm90_faults.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

using DecodeKernel = void (*)(DecodeParams);

struct DecodeVariant {
  const char* name;
  DecodeKernel fp32, bf16;
  // The same kernels' twins for the general inputs (a log-decay gate, fp32 g or
  // beta, b as given) on dense token tensors (kGeneral).
  DecodeKernel fp32_general, bf16_general;
  // The bf16 kernel rounds the state after every token (PackedBf16StateRegs):
  // steps with more than one token a sequence (or cu_seqlens) run the bf16
  // bandwidth kernel fuse-ef-occ instead.
  bool bf16_one_token_only = false;
};

// rows2's shape: 8 lanes a row, two rows a thread, 7 CTAs/SM.
using Rows2Policy = DecodePolicy<7, 7, 8, 2>;

// The latency kernel's general twin is its strided build's (the only general
// build at K = 64, with speculative verify and with strided token tensors).
constexpr DecodeVariant latency_variant(const char* name) {
  return {name, &kda_decode_latency_kernel<true, 4>, &kda_decode_latency_kernel<false, 4>,
          &kda_decode_latency_kernel<true, 4, false, kDecodeDim, 1, true, true>,
          &kda_decode_latency_kernel<false, 4, false, kDecodeDim, 1, true, true>};
}
template <class P>
constexpr DecodeVariant fused_variant(const char* name) {
  return {name, &kda_decode_fused_kernel<true, P>, &kda_decode_fused_kernel<false, P>,
          &kda_decode_fused_kernel<true, P, false, true>, &kda_decode_fused_kernel<false, P, false, true>};
}
// fp32 pools: rows2; bf16 pools: the state kept as bf16 pairs in registers. The
// general inputs on bf16 pools run PGeneralBf16's fused kernel instead: packed's
// twin spilled at its 48 registers (40 bytes) and was the slower (H = 32, N = 256:
// 176 against 168 µs for fuse-ef-occ's twin; docs/perf-log.md).
template <class PBf16, class PGeneralBf16>
constexpr DecodeVariant packed_variant(const char* name) {
  return {name,
          &kda_decode_fused_kernel<true, Rows2Policy>,
          &kda_decode_fused_kernel<false, PBf16, true>,
          &kda_decode_fused_kernel<true, Rows2Policy, false, true>,
          &kda_decode_fused_kernel<false, PGeneralBf16, false, true>,
          true};
}

// Every variant has the same work items: kDecodeSlices CTAs per (sequence, head).
// What they change and why is in decode_latency_kernel.cuh,
// decode_fused_kernel.cuh and docs/perf-log.md (decode), which also keeps the
// measurements of the variants that lost and were removed (d2, d3, fuse without
// cache hints, fuse-ef at 4 CTAs/SM, fuse-ef-occ with approximate intrinsics,
// fuse-occ, lanes8, lanes8-ef, lanes2-ef, stream, bulk, fuse-ef-occ-loop, rows2
// at 8 CTAs/SM, without evict-first or with 32-bit tile division, packed at 12
// CTAs/SM or in rows2's shape).
constexpr DecodeVariant kDecodeVariants[] = {
    // Warp-built token vectors with approximate intrinsics, one state pass for both dot products.
    latency_variant("lat"),
    // One reduction pass, streaming cache hints, 4 lanes a row, 7 CTAs/SM for fp32 pools, 8 for bf16.
    fused_variant<DecodePolicy<7, 8>>("fuse-ef-occ"),
    // fuse-ef-occ with 8 lanes a row and two rows a thread (16 apart): a warp's
    // state access is whole 128-byte lines (fp32), with the same 32 rows a CTA,
    // 32 state columns a thread and 7 CTAs/SM.
    fused_variant<Rows2Policy>("rows2"),
    // bf16 pools, one token a sequence: fuse-ef-occ with the state as bf16 pairs in
    // registers, 48 registers and 10 CTAs/SM (fp32 pools: rows2).
    packed_variant<DecodePolicy<7, 10>, DecodePolicy<7, 8>>("packed"),
};
constexpr int kNumDecodeVariants = static_cast<int>(sizeof(kDecodeVariants) / sizeof(kDecodeVariants[0]));

// Production choice, from the A/B tables on the H200 (docs/perf-log.md, decode,
// 2026-11-30). At a few sequences the step is a latency chain: lat is quickest
// (H = 32, N = 1: 3.07 µs fp32, 2.83 bf16, against 3.35 / 3.18 for d2, before
// PDL). With more sequences the pool's traffic rules: fuse-ef-occ wins from N = 8
// on for bf16 pools (6.66 against 8.11 µs: lat's 8-byte bf16 accesses at 4 CTAs
// per SM keep too little in flight) and at N = 64 for fp32 pools (70.9 against
// 75.6 µs), while lat still wins fp32 at N = 8 (8.74 against 9.28 µs).
// For fp32 pools rows2 then beats fuse-ef-occ (N = 256: 279.1 against 284.7 µs,
// N = 1024: 1114 against 1140, level at N = 64); for bf16 pools it loses (N = 256:
// 164.7 against 162.8; its bf16 build has 7 CTAs/SM, fuse-ef-occ's 8). For bf16
// pools with one token a sequence, packed beats fuse-ef-occ from N = 64 (39.5
// against 42.0 µs; N = 256: 152.3 against 163.1; N = 1024: 645 against 661) and
// loses at N = 8 (7.13 against 6.47).
constexpr int kLatencyDecodeVariant = 0;        // lat
constexpr int kBandwidthDecodeVariantBf16 = 1;  // fuse-ef-occ
constexpr int kBandwidthDecodeVariantFp32 = 2;  // rows2
constexpr int kPackedDecodeVariantBf16 = 3;     // packed
// (sequence, value head) pairs from which the bandwidth kernel runs (H = 32:
// 256 pairs are N = 8, 512 are N = 16). fp32: lat wins at N = 8 (8.72 against
// 9.25 µs for fuse-ef-occ), the bandwidth kernel at N = 16 (fuse-ef-occ 15.25
// against 15.63). bf16: fuse-ef-occ wins from N = 8 on.
constexpr int64_t kBandwidthFromPairsFp32 = 512;
constexpr int64_t kBandwidthFromPairsBf16 = 256;
// bf16: packed from N = 64 at H = 32, the smallest size measured where it wins
// (N = 16 and 32 were not measured).
constexpr int64_t kPackedFromPairsBf16 = 2048;
// K = 64: the two-row build of the latency kernel from 128 pairs (H = 32: N = 4)
// on. One run, µs per step at H = 32, one row / two rows: N = 1 2.41 / 2.70 fp32,
// 2.38 / 2.61 bf16; N = 2 2.52 / 2.68, 2.43 / 2.58; N = 4 3.08 / 2.98, 2.77 /
// 2.75; N = 8 3.84 / 3.66; N = 64 21.6 / 14.9; N = 1024 425 / 289 (docs/perf-log.md).
constexpr int64_t kTwoRowsFromPairs64 = 128;
constexpr bool same_name(const char* a, const char* b) { return *a == *b && (*a == '\0' || same_name(a + 1, b + 1)); }
static_assert(same_name(kDecodeVariants[kLatencyDecodeVariant].name, "lat") &&
                  same_name(kDecodeVariants[kBandwidthDecodeVariantBf16].name, "fuse-ef-occ") &&
                  same_name(kDecodeVariants[kBandwidthDecodeVariantFp32].name, "rows2") &&
                  same_name(kDecodeVariants[kPackedDecodeVariantBf16].name, "packed"),
              "production indices name the measured kernels");
// (For steps with more than one token a sequence, decode() turns packed into
// fuse-ef-occ: bf16_one_token_only.)
int production_variant(int64_t pairs, bool fp32) {
  if (fp32) return pairs >= kBandwidthFromPairsFp32 ? kBandwidthDecodeVariantFp32 : kLatencyDecodeVariant;
  if (pairs >= kPackedFromPairsBf16) return kPackedDecodeVariantBf16;
  return pairs >= kBandwidthFromPairsBf16 ? kBandwidthDecodeVariantBf16 : kLatencyDecodeVariant;
}

// PdlMode::kAuto: PDL on. With the latency kernel it saved 0.3 µs at N = 1
// (lat: 3.07 -> 2.76 µs fp32, 2.83 -> 2.54 bf16) and 0.2 µs at N = 8; with
// fuse-ef-occ it was level or ahead by up to 0.6 % at N = 64-1024 in two runs
// (docs/perf-log.md, decode). The mode stays a choice so that a size where it
// loses can turn it off without an API change.
bool use_pdl(PdlMode mode) { return mode != PdlMode::kOff; }

// The latency kernel's build for a pool dtype and verify or not, at head dim kDim
// with kRows rows a thread.
template <int kDim, int kRows, bool kStrided = false, bool kGeneral = false>
DecodeKernel latency_build(bool fp32, bool verify) {
  if (verify)
    return fp32 ? &kda_decode_latency_kernel<true, 4, true, kDim, kRows, kStrided, kGeneral>
                : &kda_decode_latency_kernel<false, 4, true, kDim, kRows, kStrided, kGeneral>;
  return fp32 ? &kda_decode_latency_kernel<true, 4, false, kDim, kRows, kStrided, kGeneral>
              : &kda_decode_latency_kernel<false, 4, false, kDim, kRows, kStrided, kGeneral>;
}
// The strided builds, or their general-inputs twins (kGeneral).
template <bool kGeneral>
DecodeKernel strided_build(int64_t K, bool two_rows, bool fp32, bool verify) {
  if (K == 64)
    return two_rows ? latency_build<64, 2, true, kGeneral>(fp32, verify) : latency_build<64, 1, true, kGeneral>(fp32, verify);
  return latency_build<kDecodeDim, 1, true, kGeneral>(fp32, verify);
}

std::atomic<int> g_decode_variant_override{-1};

}  // namespace

int decode_variant_count() { return kNumDecodeVariants; }
const char* decode_variant_name(int v) { return v >= 0 && v < kNumDecodeVariants ? kDecodeVariants[v].name : nullptr; }
void set_decode_variant_override(int v) { g_decode_variant_override.store(v >= 0 && v < kNumDecodeVariants ? v : -1); }

// The token tensors' strides as the kernels take them: below 2^31 (DecodeParams
// keeps them as int32), and h·head_stride below
// 2^31 for every head h, the dense head stride (the row width) as much as a given
// one: a token stride smaller than heads × width (tokens that overlap, or a single
// token whose stride is never used) does not bound it. The offsets are formed in
// 64 bits (decode_common.cuh). Arguments only: checked before the device.
Status check_decode_strides(const DecodeArgs& args) {
  const int64_t hv = args.num_v_heads > 0 ? args.num_v_heads : args.num_heads;
  const std::array<TokenView, 5> views = token_views(args, args.num_heads, hv, args.head_dim_k, args.head_dim_v);
  for (const TokenView& x : views)
    if (x.token_stride > int64_t{0x7fffffff})
      return Status::NotSupported(std::string(x.name) + "_token_stride: the CUDA decode needs strides below 2^31 " +
                                  "elements (got " + std::to_string(x.token_stride) + ")");
  for (const TokenView& x : views) {
    if (x.head_stride > int64_t{0x7fffffff})
      return Status::NotSupported(std::string(x.name) + "_head_stride: the CUDA decode needs strides below 2^31 " +
                                  "elements (got " + std::to_string(x.head_stride) + ")");
    // By division: a huge head count would overflow the product.
    if (x.heads > 1 && x.head_stride > 0 && x.heads - 1 > int64_t{0x7fffffff} / x.head_stride)
      return Status::NotSupported(std::string(x.name) + "_head_stride: the CUDA decode needs (heads - 1) x head " +
                                  "stride below 2^31 elements (got " + std::to_string(x.heads - 1) + " x " +
                                  std::to_string(x.head_stride) + "); pass a dense tensor");
  }
  return Status::Ok();
}

Status check_decode_supported(const DecodeArgs& args) {
  const Status strides = check_decode_strides(args);
  if (!strides.ok()) return strides;
  std::string why;
  if (!device_supported(&why)) return Status::NotSupported(why);
  if (args.head_dim_k != args.head_dim_v || (args.head_dim_k != 64 && args.head_dim_k != kDecodeDim))
    return Status::NotSupported("head_dim_k/head_dim_v: the CUDA decode supports K = V = 64 or 128 (got K=" +
                                std::to_string(args.head_dim_k) + ", V=" + std::to_string(args.head_dim_v) +
                                "); the CPU backends run any head dim");
  const int64_t hv = args.num_v_heads > 0 ? args.num_v_heads : args.num_heads;
  // num_seqs is bounded by nothing else when cu_seqlens is given: compare by
  // division, the product may overflow int64 (and wrap below the limit).
  if (args.num_seqs > int64_t{0x7fffffff} / (hv * kDecodeSlices))
    return Status::NotSupported("num_seqs x num_v_heads: too many (sequence, head) pairs for one launch (" +
                                std::to_string(args.num_seqs) + " x " + std::to_string(hv) + ")");
  return Status::Ok();
}

cudaError_t take_decode_faults(cudaStream_t stream, DeviceFaults* taken) { return take_this_unit_faults(stream, taken); }

Status decode(const DecodeArgs& a, void* stream) {
  const int64_t HV = a.num_v_heads > 0 ? a.num_v_heads : a.num_heads;
  const int64_t K = a.head_dim_k;  // = V, 64 or 128: check_decode_supported
  const int64_t per_slot = HV * K * K;
  DecodeParams p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  set_gate_inputs(p, a);
  p.A_log = a.A_log;
  p.dt_bias = a.dt_bias;
  p.out = static_cast<uint16_t*>(a.out);
  p.cu_seqlens = a.cu_seqlens;
  p.cu_seqlens32 = a.cu_seqlens_int32;
  p.tokens_per_seq = a.tokens_per_seq;
  p.total_tokens = a.total_tokens;
  p.num_seqs = a.num_seqs;
  p.pool = a.state_pool;
  p.out_pool = a.state_out_pool != nullptr ? a.state_out_pool : a.state_pool;
  p.per_token_states = a.per_token_states;
  p.pool_stride = a.pool_stride > 0 ? a.pool_stride : per_slot;
  p.out_stride = a.state_out_stride > 0 ? a.state_out_stride : p.pool_stride;
  p.pool_size = a.pool_size;
  p.indices = a.state_indices;
  p.index_is_64 = a.index_type == IndexType::kInt64;
  p.num_heads = static_cast<int32_t>(a.num_heads);
  p.num_v_heads = static_cast<int32_t>(HV);
  p.scale = a.scale;
  p.lower_bound = a.lower_bound;
  const bool verify = speculative_verify(a);
  p.verify_slots = verify ? a.verify_slots : 0;
  p.num_accepted = a.num_accepted_tokens;
  // Strides, dense ones resolved; below 2^31: check_decode_strides.
  store_strides32(token_views(a, a.num_heads, HV, K, K),
                  {{&p.q_token_stride, &p.q_head_stride}, {&p.k_token_stride, &p.k_head_stride},
                   {&p.v_token_stride, &p.v_head_stride}, {&p.g_token_stride, &p.g_head_stride},
                   {&p.beta_token_stride, &p.beta_head_stride}});

  const int64_t pairs = a.num_seqs * HV;
  const bool fp32 = a.state_dtype == DType::kFP32;
  const int forced = g_decode_variant_override.load();
  int variant = forced >= 0 ? forced : production_variant(pairs, fp32);
  if (!fp32 && kDecodeVariants[variant].bf16_one_token_only && (a.cu_seqlens != nullptr || a.cu_seqlens_int32 != nullptr || a.tokens_per_seq != 1))
    variant = kBandwidthDecodeVariantBf16;
  // Speculative verify runs its own build of the latency kernel (a variant
  // override does not apply), and so does K = V = 64 (the latency kernel is the
  // only one built for it: decode_latency_kernel.cuh), with two rows a thread and
  // one CTA per pair from kTwoRowsFromPairs64 on.
  const bool two_rows = K == 64 && pairs >= kTwoRowsFromPairs64;
  // Strided token tensors: the latency kernel's strided build at every size (the
  // other builds keep the dense addressing they were tuned with; with the strides
  // they spilled). At K = 128 from ~2,048 pairs the bandwidth kernels on dense
  // copies are faster (docs/perf-log.md): the Python decode copies there.
  // The general inputs (a log-decay gate, fp32 g or beta, b as given) run twins
  // whose loads and gate read them at run time (every other build keeps its code):
  // on dense tensors at K = 128 without verify, the twin of the kernel the default
  // inputs would run; else the strided builds' twins.
  const bool general = has_general_inputs(a);
  const bool strided = has_strided_inputs(a);
  const bool dense_general = general && !strided && K == kDecodeDim && !verify;
  const DecodeKernel kernel =
      dense_general ? (fp32 ? kDecodeVariants[variant].fp32_general : kDecodeVariants[variant].bf16_general)
      : general     ? strided_build<true>(K, two_rows, fp32, verify)
      : strided     ? strided_build<false>(K, two_rows, fp32, verify)
      : K == 64 ? (two_rows ? latency_build<64, 2>(fp32, verify) : latency_build<64, 1>(fp32, verify))
      : verify  ? latency_build<kDecodeDim, 1>(fp32, true)
      : fp32    ? kDecodeVariants[variant].fp32
                : kDecodeVariants[variant].bf16;
  const int64_t ctas = two_rows ? pairs : pairs * (K / kDecodeRows);  // below 2^31: check_decode_supported
  if (ctas == 0) return Status::Ok();

  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(kDecodeThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = static_cast<cudaStream_t>(stream);
  // The kernels wait for the previous grid before touching memory (wait_for_prior_grids),
  // so they may be started while it runs.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = use_pdl(a.programmatic_dependent_launch) ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
  if (err != cudaSuccess)
    return {StatusCode::kCudaError, std::string("backend kCuda: launching the decode kernel: ") + cudaGetErrorString(err)};
  return Status::Ok();
}

}  // namespace flashkda::sm90
