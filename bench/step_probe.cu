// flashkda-step-probe: the chain of chunk steps alone, in ns a step: the latency
// that bounds the few-heads rows. A 4-warp CTA runs the recurrence kernel's own step
// (recurrence_step, src/sm90/kernel/recurrence.cuh) on records already in shared
// memory: no loads, no stores, one CTA barrier a step, as in the kernel's chunk
// loop. So the time is the step's dependent chain (its conversions, the two
// products' issue and drain, U's split, the decay, the out tile's staging) and
// nothing the kernel adds around it (the records' and v's loads, the stage's
// wait, the out tile's global stores); the recurrence kernel's own time a chunk
// (ncu) minus this is what those cost.
//
//   flashkda-step-probe [--steps 4096] [--iters 20]
//
// Prints, for K = V = 128 and 64, ns a step with one CTA on each SM and with two
// (the plans' two residencies: a lone chain, and the segment scan's passes),
// median of --iters launches of --steps steps each.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_common.cuh"
#include "sm90/kernel/recurrence_kernel.cuh"

namespace {

using namespace flashkda::sm90;

constexpr int kProbeWarps = 4;   // one warpgroup: the plans' 4-warp CTA
constexpr int kProbeStages = 4;  // records cycled through, as the kernel's ring
using ProbeCfg = RecurrenceConfig<kProbeWarps, kProbeStages>;
using ProbeSmem = ProbeCfg::Smem;

// A small finite value from an index (bench_common's hash), so that the state
// stays finite over many steps. The step's time moves with the values by a few
// per cent (docs/perf-log.md, 2026-12-03): compare runs of one build's values only.
__device__ __forceinline__ float probe_value(uint32_t i) {
  return (flashkda::bench::hash32(i) * 2.3283064e-10f - 0.5f) * 0.125f;
}

template <int kDim>
__global__ void __launch_bounds__(ProbeCfg::kThreads, 1) step_chain_kernel(int steps, float* sink) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  ProbeSmem& s =
      *reinterpret_cast<ProbeSmem*>(smem_raw + ((kSw128AtomBytes - raw_addr % kSw128AtomBytes) % kSw128AtomBytes));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // Records and v of every stage: small values, and 2^G_last of 0.5 so that the
  // state stays bounded however many steps run.
  for (int st = 0; st < kProbeStages; ++st) {
    ChunkOperands& ops = s.stage[st].ops;
    auto* bf = reinterpret_cast<__nv_bfloat16*>(&ops);
    constexpr int kBf16 = static_cast<int>(offsetof(ChunkOperands, decay_last) / sizeof(__nv_bfloat16));
    for (int i = tid; i < kBf16; i += ProbeCfg::kThreads) bf[i] = __float2bfloat16(probe_value(st * kBf16 + i));
    for (int i = tid; i < kHeadDim; i += ProbeCfg::kThreads) ops.decay_last[i] = 0.5f;
    for (int i = tid; i < kChunk * ProbeSmem::kLdV; i += ProbeCfg::kThreads)
      (&s.stage[st].v[0][0])[i] = __bfloat16_as_ushort(__float2bfloat16(probe_value(7919u * st + i)));
  }
  StateRows S;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) S.tile[j].x[e] = 8 * j < kDim ? probe_value(tid * 64 + 4 * j + e) : 0.f;

  int stage = 0;
  for (int c = 0; c < steps; ++c) {
    __syncthreads();  // the kernel's one barrier a chunk
    const auto& st = s.stage[stage];
    recurrence_step<kDim>(S, st.ops, &st.v[0][0], ProbeSmem::kLdV, 16 * warp, s.out[warp], lane);
    stage = stage + 1 == kProbeStages ? 0 : stage + 1;
  }
  // Keep the state (and so every step) live.
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc += S.tile[j].x[e];
  if (acc == 12345.f) sink[blockIdx.x * ProbeCfg::kThreads + tid] = acc;
}

template <int kDim>
double ns_a_step(int ctas, int steps, int iters, float* sink) {
  const size_t smem = ProbeCfg::kSmemBytes;
  CHECK_CUDA(cudaFuncSetAttribute(step_chain_kernel<kDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  step_chain_kernel<kDim><<<ctas, ProbeCfg::kThreads, smem>>>(steps, sink);  // warm-up
  CHECK_CUDA(cudaGetLastError());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    step_chain_kernel<kDim><<<ctas, ProbeCfg::kThreads, smem>>>(steps, sink);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], e0, e1));
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return 1e6 * ms[iters / 2] / steps;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 4096, iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else {
      std::fprintf(stderr, "unknown option %s (known: --steps N, --iters N)\n", a.c_str());
      return 2;
    }
  }
  if (steps < 1 || iters < 1) {
    std::fprintf(stderr, "--steps and --iters: expected positive counts\n");
    return 2;
  }
  int dev = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  float* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(float) * 2 * sms * ProbeCfg::kThreads));

  std::printf("The chain of chunk steps alone (4-warp CTAs, records in shared memory, %d steps, median of %d)\n\n",
              steps, iters);
  std::printf("| K = V | CTAs an SM | ns a step | SM MHz |\n|---|---|---|---|\n");
  for (int per_sm : {1, 2}) {
    const double ns = ns_a_step<kHeadDim>(per_sm * sms, steps, iters, sink);
    std::printf("| 128 | %d | %.0f | %.0f |\n", per_sm, ns, flashkda::bench::sm_clock_mhz());
  }
  for (int per_sm : {1, 2}) {
    const double ns = ns_a_step<64>(per_sm * sms, steps, iters, sink);
    std::printf("| 64 | %d | %.0f | %.0f |\n", per_sm, ns, flashkda::bench::sm_clock_mhz());
  }
  CHECK_CUDA(cudaFree(sink));
  return 0;
}
