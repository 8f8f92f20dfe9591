// Host side of the GPU decode: support check and launch.
#include <cuda_runtime.h>

#include <string>

#include "sm90/decode/decode_kernel.cuh"
#include "sm90/sm90_decode.h"
#include "sm90/sm90_forward.h"

namespace flashkda::sm90 {

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

  const dim3 grid(static_cast<unsigned>(a.num_seqs * HV * kDecodeSlices));
  auto s = static_cast<cudaStream_t>(stream);
  if (a.state_dtype == DType::kFP32) kda_decode_kernel<true><<<grid, kDecodeThreads, 0, s>>>(p);
  else kda_decode_kernel<false><<<grid, kDecodeThreads, 0, s>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return {StatusCode::kCudaError, std::string("backend kCuda: launching the decode kernel: ") + cudaGetErrorString(err)};
  return Status::Ok();
}

}  // namespace flashkda::sm90
