// Host side of the GPU decode: support check and launch.
#include <cuda_runtime.h>

#include <atomic>
#include <cstring>
#include <string>

#include "sm90/decode/decode_fused_kernel.cuh"
#include "sm90/decode/decode_kernel.cuh"
#include "sm90/sm90_decode.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

namespace {

using DecodeKernel = void (*)(DecodeParams);

struct DecodeVariant {
  const char* name;
  DecodeKernel fp32, bf16;
  int slices;  // CTAs per (sequence, value head)
};

template <class P>
constexpr DecodeVariant fused_variant(const char* name) {
  return {name, &kda_decode_fused_kernel<true, P>, &kda_decode_fused_kernel<false, P>, P::kSlices};
}

// What each variant changes and why is in decode_fused_kernel.cuh and
// docs/perf-log.md (decode). Knobs: DecodePolicy<lanes per row, bf16 columns per
// access, evict-first hints, min CTAs/SM fp32, min CTAs/SM bf16>.
const DecodeVariant kDecodeVariants[] = {
    {"d2", &kda_decode_kernel<true>, &kda_decode_kernel<false>, kDecodeSlices},
    // d2 with the token's per-column vectors built per warp: no block barrier per token.
    {"d3", &kda_decode_kernel<true, true>, &kda_decode_kernel<false, true>, kDecodeSlices},
    // One lane reduction after the state load; 16-byte state accesses for bf16 too.
    // fp32 capped at 128 registers: 4 CTAs/SM, as d2 (118 registers) gets.
    fused_variant<DecodePolicy<4, 8, false, 4, 8>>("fuse"),
    fused_variant<DecodePolicy<4, 8, true, 4, 8>>("fuse-ef"),    // + L1 no-allocate, L2 evict-first state
    fused_variant<DecodePolicy<4, 8, false, 7, 8>>("fuse-occ"),  // + 7 CTAs/SM for fp32 (72 registers, no spill)
    fused_variant<DecodePolicy<4, 8, true, 7, 8>>("fuse-ef-occ"),  // fuse-ef at 7 CTAs/SM for fp32: more state in flight
    fused_variant<DecodePolicy<8, 8, false, 8, 8>>("lanes8"),    // 8 lanes a row, 16 rows a CTA, 8 CTAs/SM
};
constexpr int kNumDecodeVariants = static_cast<int>(sizeof(kDecodeVariants) / sizeof(kDecodeVariants[0]));
// Production choice, from the A/B table on the H200 (docs/perf-log.md, decode):
// at a few sequences the step is a latency chain and d2's plain loads are
// quickest; from 8 sequences x 32 heads (256 pairs, two CTAs per SM) on, the
// pool's traffic rules and fuse-ef's evict-first state accesses and one
// reduction pass win (N = 256, H = 32: 293 vs 300 µs fp32, 164 vs 176 µs bf16).
constexpr const char* kLatencyDecodeVariant = "d2";
constexpr const char* kBandwidthDecodeVariant = "fuse-ef";
constexpr int64_t kBandwidthFromPairs = 256;  // (sequence, value head) pairs
int variant_index(const char* name) {
  for (int v = 0; v < kNumDecodeVariants; ++v)
    if (std::strcmp(kDecodeVariants[v].name, name) == 0) return v;
  return 0;  // unreachable: both names are in the table (checked by the GPU tests' variant listing)
}
int production_variant(int64_t pairs) {
  static const int latency = variant_index(kLatencyDecodeVariant), bandwidth = variant_index(kBandwidthDecodeVariant);
  return pairs >= kBandwidthFromPairs ? bandwidth : latency;
}

std::atomic<int> g_decode_variant_override{-1};

}  // namespace

int decode_variant_count() { return kNumDecodeVariants; }
const char* decode_variant_name(int v) { return v >= 0 && v < kNumDecodeVariants ? kDecodeVariants[v].name : nullptr; }
void set_decode_variant_override(int v) { g_decode_variant_override.store(v >= 0 && v < kNumDecodeVariants ? v : -1); }

Status check_decode_supported(const DecodeArgs& args) {
  std::string why;
  if (!device_supported(&why)) return Status::NotSupported(why);
  if (args.head_dim_k != kDecodeDim || args.head_dim_v != kDecodeDim)
    return Status::NotSupported("head_dim_k/head_dim_v: the CUDA decode supports K = V = 128 (got K=" +
                                std::to_string(args.head_dim_k) + ", V=" + std::to_string(args.head_dim_v) +
                                "); the CPU backends run any head dim");
  const int64_t hv = args.num_v_heads > 0 ? args.num_v_heads : args.num_heads;
  if (args.num_seqs * hv * kDecodeSlices > int64_t{0x7fffffff})
    return Status::NotSupported("num_seqs x num_v_heads: too many (sequence, head) pairs for one launch (" +
                                std::to_string(args.num_seqs * hv) + ")");
  return Status::Ok();
}

Status decode(const DecodeArgs& a, void* stream) {
  const int64_t HV = a.num_v_heads > 0 ? a.num_v_heads : a.num_heads;
  const int64_t per_slot = HV * kDecodeDim * kDecodeDim;
  DecodeParams p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  p.g = static_cast<const uint16_t*>(a.g);
  p.beta = static_cast<const uint16_t*>(a.beta);
  p.A_log = a.A_log;
  p.dt_bias = a.dt_bias;
  p.out = static_cast<uint16_t*>(a.out);
  p.cu_seqlens = a.cu_seqlens;
  p.tokens_per_seq = a.tokens_per_seq;
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

  const int forced = g_decode_variant_override.load();
  const DecodeVariant& var = kDecodeVariants[forced >= 0 ? forced : production_variant(a.num_seqs * HV)];
  const int64_t ctas = a.num_seqs * HV * var.slices;
  if (ctas > int64_t{0x7fffffff})
    return Status::NotSupported(std::string("num_seqs x num_v_heads: too many CTAs for one launch of decode variant ") +
                                var.name + " (" + std::to_string(ctas) + ")");

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
  cfg.numAttrs = a.programmatic_dependent_launch ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, a.state_dtype == DType::kFP32 ? var.fp32 : var.bf16, p);
  if (err != cudaSuccess)
    return {StatusCode::kCudaError, std::string("backend kCuda: launching the decode kernel: ") + cudaGetErrorString(err)};
  return Status::Ok();
}

}  // namespace flashkda::sm90
