// flashkda-bench-decode: one decode step (one token per sequence, state read and
// written in place in the pool) under a CUDA graph, for N ∈ {1, 8, 64, 256, 1024},
// H = 32, K = V = 128 (or 64 with --head-dim 64), fp32 and bf16 pools. Prints µs per step and the achieved
// state bandwidth 2·N·H·V·K·sizeof(state) / time.
//
//   flashkda-bench-decode [--heads 32] [--seqs 1,8,64,256,1024] [--dtypes fp32,bf16] [--head-dim 128]
//                         [--iters 200] [--json FILE]
//                         [--variants all | LIST] [--rounds 10] [--no-refs]
//
// Timing: kStepsPerGraph decode steps captured in one graph; the graph replayed
// --iters times with CUDA events around each replay; median / kStepsPerGraph.
//
// Without --variants: the production kernel, one table (as scripts/gpu_test_and_bench.sh reads).
// With --variants (A/B mode): each entry is a kernel variant name (lat, fuse-ef-occ, ...,
// see sm90_decode.cu) optionally suffixed "+log-decay" (its twin for the general
// inputs, on prod-log-decay's inputs), then "+pdl" (launched with programmatic
// dependent launch; without it a variant runs with PDL off), "all" for every
// variant with and without "+pdl", or "prod" for the production choice (PDL
// as PdlMode::kAuto chooses; "prod+pdl" forces it on; "prod-strided" is the production
// call on token tensors that are strided views: every other token row; "prod-copied" copies
// those views dense, five 2-D copies, before the dense call; "prod-log-decay" is the
// production call with the general inputs, g as fp32 log decays and beta as fp32 b,
// as vLLM's Kimi Linear layer passes them). Unless --no-refs,
// reference columns follow, for the same bytes and grid: "memcpy" (cudaMemcpyAsync D2D of the state, 20 per graph),
// "rmw" (a kernel reading and rewriting the state in place, 16 KB per 128-thread
// CTA, no math: the floor of the decode's access pattern), "rmw-rows" (the same
// with the decode's row-segment access shape), "rmw-rows-idx" (and its slot
// read from the index array first), "empty" and "empty+pdl"
// (an empty kernel on the decode's grid: the per-node launch floor). All columns
// of one (N, pool) run in the same process on the same buffers; their graph
// replays are interleaved (--rounds rounds, each round visiting every column
// once, in an order rotated by one each round, --iters / --rounds replays per
// visit) so that clock or thermal drift spreads over all columns alike.
// The second table gives each column's state bandwidth as a percentage of the
// spec's 4.25 TB/s copy bandwidth (the first table's "memcpy" column is a D2D
// cudaMemcpy, which moves less than a copy kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_common.cuh"
#include "flashkda/flashkda.h"
#include "sm90/sm90_decode.h"

namespace {

using namespace flashkda::bench;

constexpr int kStepsPerGraph = 20;  // amortises the graph launch itself
constexpr int kRmwThreads = 128, kRmwVecsPerThread = 8;
constexpr int64_t kRmwBytesPerCta = int64_t{kRmwThreads} * kRmwVecsPerThread * 16;  // 16 KB, as a decode fp32 CTA

__global__ void fill_bf16(uint16_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float f = (hash32(seed + i) * 2.3283064e-10f - 0.5f) * 3.4641016f;  // uniform, unit variance
    x[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
  }
}
__global__ void fill_state(void* x, int64_t n, uint64_t seed, bool fp32) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float f = (hash32(seed + i) * 2.3283064e-10f - 0.5f) * 0.2f;
    if (fp32) static_cast<float*>(x)[i] = f;
    else static_cast<uint16_t*>(x)[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
  }
}
__global__ void iota_i32(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = static_cast<int32_t>(i);
}

// Reads this CTA's 16 KB of the state, all of it before any store, and writes it
// back XOR `flip` (0 at run time, which the compiler cannot know): the decode's
// memory traffic and per-CTA shape without its math or its index lookup.
__global__ void __launch_bounds__(kRmwThreads) rmw_state(uint4* state, uint32_t flip) {
  uint4* base = state + blockIdx.x * (kRmwBytesPerCta / 16) + threadIdx.x;
  uint4 x[kRmwVecsPerThread];
#pragma unroll
  for (int j = 0; j < kRmwVecsPerThread; ++j) x[j] = base[j * kRmwThreads];
#pragma unroll
  for (int j = 0; j < kRmwVecsPerThread; ++j)
    base[j * kRmwThreads] = make_uint4(x[j].x ^ flip, x[j].y ^ flip, x[j].z ^ flip, x[j].w ^ flip);
}

// The decode kernels' per-CTA access shape without their math, in two steps
// from rmw_state (reference columns "rmw-rows" and "rmw-rows-idx"): thread
// (row, part) of the CTA's 32 rows of 512 bytes (an fp32 slice) moves the 16-byte
// chunks part + 4·jj of its row, so a warp's access is eight 64-byte segments
// rather than 512 contiguous bytes; with kIndexed the CTA first reads its slot
// from the index array, as a decode CTA does, and only then its state.
template <bool kIndexed>
__global__ void __launch_bounds__(kRmwThreads) rmw_rows(uint4* pool, const int32_t* idx, int64_t slot_vecs,
                                                         uint32_t flip) {
  constexpr int64_t kCtaVecs = kRmwBytesPerCta / 16, kRowVecs = 32;
  const int64_t ctas_per_slot = slot_vecs / kCtaVecs;
  const int64_t n = blockIdx.x / ctas_per_slot;
  const int64_t slot = kIndexed ? idx[n] : n;
  const int row = threadIdx.x / 4, part = threadIdx.x % 4;
  uint4* base = pool + slot * slot_vecs + (blockIdx.x % ctas_per_slot) * kCtaVecs + row * kRowVecs + part;
  uint4 x[kRmwVecsPerThread];
#pragma unroll
  for (int j = 0; j < kRmwVecsPerThread; ++j) x[j] = base[4 * j];
#pragma unroll
  for (int j = 0; j < kRmwVecsPerThread; ++j)
    base[4 * j] = make_uint4(x[j].x ^ flip, x[j].y ^ flip, x[j].z ^ flip, x[j].w ^ flip);
}

// Nothing but the programmatic-launch handshake (a no-op without the attribute).
__global__ void empty_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

enum class Kind { kDecode, kMemcpy, kRmw, kRmwRows, kEmpty };
struct Column {
  std::string label;
  Kind kind = Kind::kDecode;
  int variant = -1;  // kDecode: sm90 variant index, -1 = production
  flashkda::PdlMode mode = flashkda::PdlMode::kOff;  // kDecode; kEmpty: kOn or kOff
  bool indexed = false;  // kRmwRows: read the slot from the index array first
  bool strided = false;  // kDecode: token tensors as every other row of a buffer twice their size
  bool copied = false;  // kDecode: those views copied dense first (2-D copies in the graph), as glue would
  bool general = false;  // kDecode: g as fp32 log decays, beta as fp32 b (GateForm::kLogDecay)
};

bool parse_columns(const std::string& list, bool refs, std::vector<Column>* cols) {
  const int nv = flashkda::sm90::decode_variant_count();
  for (const std::string& item : split_list(list)) {
    if (item == "all") {
      for (int v = 0; v < nv; ++v)
        for (bool pdl : {false, true})
          cols->push_back({std::string(flashkda::sm90::decode_variant_name(v)) + (pdl ? "+pdl" : ""), Kind::kDecode, v,
                           pdl ? flashkda::PdlMode::kOn : flashkda::PdlMode::kOff});
      continue;
    }
    // "VARIANT+log-decay[+pdl]": the variant's general-inputs twin (as prod-log-decay).
    const auto suffix = [](const std::string& s, const std::string& x) {
      return s.size() > x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    };
    const bool pdl = suffix(item, "+pdl");
    std::string name = pdl ? item.substr(0, item.size() - 4) : item;
    const bool log_decay = suffix(name, "+log-decay");
    if (log_decay) name.resize(name.size() - std::string("+log-decay").size());
    if (name == "prod" || name == "prod-strided" || name == "prod-copied" || name == "prod-log-decay") {
      cols->push_back({item, Kind::kDecode, -1, pdl ? flashkda::PdlMode::kOn : flashkda::PdlMode::kAuto, false,
                       name == "prod-strided", name == "prod-copied", name == "prod-log-decay"});
      continue;
    }
    int found = -1;
    for (int v = 0; v < nv; ++v)
      if (name == flashkda::sm90::decode_variant_name(v)) found = v;
    if (found < 0) {
      std::fprintf(stderr, "--variants: unknown variant '%s'; known:", name.c_str());
      for (int v = 0; v < nv; ++v) std::fprintf(stderr, " %s", flashkda::sm90::decode_variant_name(v));
      std::fprintf(stderr, " (each optionally +log-decay, then +pdl), prod, all\n");
      return false;
    }
    cols->push_back({item, Kind::kDecode, found, pdl ? flashkda::PdlMode::kOn : flashkda::PdlMode::kOff, false, false,
                     false, log_decay});
  }
  if (refs) {
    cols->push_back({"memcpy", Kind::kMemcpy});
    cols->push_back({"rmw", Kind::kRmw});
    cols->push_back({"rmw-rows", Kind::kRmwRows});
    cols->push_back({"rmw-rows-idx", Kind::kRmwRows, -1, flashkda::PdlMode::kOff, true});
    cols->push_back({"empty", Kind::kEmpty, -1, flashkda::PdlMode::kOff});
    cols->push_back({"empty+pdl", Kind::kEmpty, -1, flashkda::PdlMode::kOn});
  }
  return true;
}

cudaError_t launch_empty(dim3 grid, bool pdl, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, empty_kernel);
}

struct Stats { double median, p10, p90; };

// Times `graphs` (kStepsPerGraph steps each): `rounds` rounds, each replaying
// every graph `per_round` times, starting one graph later each round. Per-step µs.
std::vector<Stats> time_interleaved(const std::vector<cudaGraphExec_t>& graphs, int rounds, int per_round,
                                    cudaStream_t stream) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  const size_t n = graphs.size();
  for (cudaGraphExec_t g : graphs)
    for (int w = 0; w < 3; ++w) CHECK_CUDA(cudaGraphLaunch(g, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<std::vector<float>> us(n);
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n; ++i) {
      const size_t c = (i + static_cast<size_t>(r)) % n;
      for (int it = 0; it < per_round; ++it) {
        CHECK_CUDA(cudaEventRecord(e0, stream));
        CHECK_CUDA(cudaGraphLaunch(graphs[c], stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        us[c].push_back(ms * 1e3f / kStepsPerGraph);
      }
    }
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  std::vector<Stats> out;
  for (auto& v : us) {
    std::sort(v.begin(), v.end());
    out.push_back({v[v.size() / 2], v[v.size() / 10], v[(v.size() * 9) / 10]});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int H = 32, iters = 200, rounds = 10, dim = 128;
  std::vector<int> seqs = {1, 8, 64, 256, 1024};
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  std::string json, variants;
  bool refs = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--heads") H = std::atoi(next().c_str());
    else if (a == "--seqs") seqs = split_ints(next());
    else if (a == "--dtypes") dtypes = split_list(next());
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--variants") variants = next();
    else if (a == "--no-refs") refs = false;
    else if (a == "--head-dim") {
      dim = std::atoi(next().c_str());
      if (dim != 64 && dim != 128) { std::fprintf(stderr, "--head-dim: expected 64 or 128\n"); return 2; }
    }
    else if (a == "--json") json = next();
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  for (const std::string& d : dtypes)
    if (d != "fp32" && d != "bf16") { std::fprintf(stderr, "--dtypes: fp32 or bf16, got %s\n", d.c_str()); return 2; }
  std::string why;
  if (!flashkda::cuda_backend_available(&why)) {
    std::fprintf(stderr, "flashkda-bench-decode: %s\n", why.c_str());
    return 1;
  }
  const bool ab = !variants.empty();
  std::vector<Column> cols;
  if (ab) {
    if (!parse_columns(variants, refs, &cols)) return 2;
  } else {
    cols.push_back({"prod", Kind::kDecode, -1, flashkda::PdlMode::kAuto});
    rounds = 1;
  }
  rounds = std::max(1, std::min(rounds, iters));
  const int per_round = std::max(1, iters / rounds);

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  struct Row { int N; std::string dtype; std::vector<Stats> st; double bytes; };
  std::vector<Row> rows;
  for (int N : seqs) {
    for (const std::string& dname : dtypes) {
      const bool fp32 = dname == "fp32";
      const flashkda::DType dt = fp32 ? flashkda::DType::kFP32 : flashkda::DType::kBF16;
      const int64_t tok = int64_t{N} * H * dim, state_elems = int64_t{N} * H * dim * dim;
      const int64_t state_bytes = state_elems * (fp32 ? 4 : 2);
      uint16_t *q, *k, *v, *g, *beta, *out;
      float *A_log, *dt_bias;
      void *pool, *copy_dst = nullptr;
      int32_t* idx;
      // Token tensors twice their size: a strided column reads every other token row
      // (a view of a wider projection output), a dense one the first half.
      CHECK_CUDA(cudaMalloc(&q, 2 * tok * 2)); CHECK_CUDA(cudaMalloc(&k, 2 * tok * 2));
      CHECK_CUDA(cudaMalloc(&v, 2 * tok * 2)); CHECK_CUDA(cudaMalloc(&g, 2 * tok * 2));
      CHECK_CUDA(cudaMalloc(&out, tok * 2)); CHECK_CUDA(cudaMalloc(&beta, 2 * int64_t{N} * H * 2));
      CHECK_CUDA(cudaMalloc(&A_log, H * 4)); CHECK_CUDA(cudaMalloc(&dt_bias, H * dim * 4));
      CHECK_CUDA(cudaMalloc(&pool, state_bytes));
      CHECK_CUDA(cudaMalloc(&idx, N * 4));
      uint16_t* dense[5] = {};  // prod-copied: q, k, v, g, beta copied dense
      for (int t = 0; t < 5; ++t) CHECK_CUDA(cudaMalloc(&dense[t], t < 4 ? tok * 2 : int64_t{N} * H * 2));
      const bool want_copy = std::any_of(cols.begin(), cols.end(), [](const Column& c) { return c.kind == Kind::kMemcpy; });
      if (want_copy) CHECK_CUDA(cudaMalloc(&copy_dst, state_bytes));
      fill_bf16<<<256, 256>>>(q, 2 * tok, 1); fill_bf16<<<256, 256>>>(k, 2 * tok, 2);
      fill_bf16<<<256, 256>>>(v, 2 * tok, 3); fill_bf16<<<256, 256>>>(g, 2 * tok, 4);
      fill_bf16<<<256, 256>>>(beta, 2 * int64_t{N} * H, 5);
      fill_uniform_f32<<<8, 256>>>(A_log, H, 6, 1.f); fill_uniform_f32<<<8, 256>>>(dt_bias, H * dim, 7, 1.f);
      fill_state<<<1024, 256>>>(pool, state_elems, 8, fp32);
      float *g_log = nullptr, *beta_prob = nullptr;  // prod-log-decay: the general inputs
      if (std::any_of(cols.begin(), cols.end(), [](const Column& c) { return c.general; })) {
        CHECK_CUDA(cudaMalloc(&g_log, tok * 4));
        CHECK_CUDA(cudaMalloc(&beta_prob, int64_t{N} * H * 4));
        fill_uniform_f32<<<256, 256>>>(g_log, tok, 11, -0.5f);  // log decays in (-0.5, 0]
        fill_uniform_f32<<<8, 256>>>(beta_prob, int64_t{N} * H, 12, 1.f);
      }
      iota_i32<<<8, 256>>>(idx, N);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaDeviceSynchronize());

      flashkda::DecodeArgs a;
      a.q = q; a.k = k; a.v = v; a.g = g; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias; a.out = out;
      a.num_seqs = N; a.tokens_per_seq = 1; a.total_tokens = N;
      a.state_pool = pool; a.state_dtype = dt; a.pool_size = N; a.state_indices = idx;
      a.num_heads = H; a.num_v_heads = H; a.head_dim_k = dim; a.head_dim_v = dim;
      a.scale = 1.f / std::sqrt(float(dim)); a.lower_bound = -5.f;

      std::vector<cudaGraph_t> graphs;
      std::vector<cudaGraphExec_t> execs;
      for (const Column& c : cols) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int s = 0; s < kStepsPerGraph; ++s) {
          switch (c.kind) {
            case Kind::kDecode: {
              flashkda::sm90::set_decode_variant_override(c.variant);
              a.programmatic_dependent_launch = c.mode;
              uint16_t* const src[5] = {q, k, v, g, beta};
              if (c.copied) {
                for (int t = 0; t < 5; ++t) {
                  const size_t row_bytes = (t < 4 ? size_t(H) * dim : size_t(H)) * 2;
                  CHECK_CUDA(cudaMemcpy2DAsync(dense[t], row_bytes, src[t], 2 * row_bytes, row_bytes, N,
                                               cudaMemcpyDeviceToDevice, stream));
                }
              }
              a.q = c.copied ? dense[0] : q; a.k = c.copied ? dense[1] : k; a.v = c.copied ? dense[2] : v;
              a.g = c.copied ? dense[3] : g; a.beta = c.copied ? dense[4] : beta;
              a.gate_form = c.general ? flashkda::GateForm::kLogDecay : flashkda::GateForm::kSafeGate;
              a.g_dtype = a.beta_dtype = c.general ? flashkda::DType::kFP32 : flashkda::DType::kBF16;
              a.beta_is_probability = c.general;
              if (c.general) { a.g = g_log; a.beta = beta_prob; }
              const int64_t row = c.strided ? 2 * int64_t{H} * dim : 0, head = c.strided ? dim : 0;
              a.q_token_stride = a.k_token_stride = a.v_token_stride = a.g_token_stride = row;
              a.q_head_stride = a.k_head_stride = a.v_head_stride = a.g_head_stride = head;
              a.beta_token_stride = c.strided ? 2 * int64_t{H} : 0;
              a.beta_head_stride = c.strided ? 1 : 0;
              const flashkda::Status st = flashkda::decode(a, flashkda::Backend::kCuda, stream);
              flashkda::sm90::set_decode_variant_override(-1);
              if (!st.ok()) { std::fprintf(stderr, "decode (%s) failed: %s\n", c.label.c_str(), st.message.c_str()); return 1; }
              break;
            }
            case Kind::kMemcpy:
              CHECK_CUDA(cudaMemcpyAsync(copy_dst, pool, state_bytes, cudaMemcpyDeviceToDevice, stream));
              break;
            case Kind::kRmw:
              rmw_state<<<static_cast<unsigned>(state_bytes / kRmwBytesPerCta), kRmwThreads, 0, stream>>>(
                  static_cast<uint4*>(pool), 0u);
              CHECK_CUDA(cudaGetLastError());
              break;
            case Kind::kRmwRows: {
              const auto kernel = c.indexed ? rmw_rows<true> : rmw_rows<false>;
              kernel<<<static_cast<unsigned>(state_bytes / kRmwBytesPerCta), kRmwThreads, 0, stream>>>(
                  static_cast<uint4*>(pool), idx, state_bytes / N / 16, 0u);
              CHECK_CUDA(cudaGetLastError());
              break;
            }
            case Kind::kEmpty:
              CHECK_CUDA(launch_empty(dim3(static_cast<unsigned>(int64_t{N} * H * 4)), c.mode == flashkda::PdlMode::kOn, stream));
              break;
          }
        }
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        graphs.push_back(graph);
        execs.push_back(exec);
      }
      rows.push_back({N, dname, time_interleaved(execs, rounds, per_round, stream), 2.0 * state_bytes});
      // Each row's medians as soon as it is measured: a run cut short keeps them.
      std::fprintf(stderr, "N=%d %s:", N, dname.c_str());
      for (size_t c = 0; c < cols.size(); ++c) std::fprintf(stderr, " %s=%.2f", cols[c].label.c_str(), rows.back().st[c].median);
      std::fprintf(stderr, " (us per step)\n");
      for (size_t i = 0; i < execs.size(); ++i) {
        CHECK_CUDA(cudaGraphExecDestroy(execs[i]));
        CHECK_CUDA(cudaGraphDestroy(graphs[i]));
      }
      cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(g); cudaFree(out); cudaFree(beta);
      cudaFree(A_log); cudaFree(dt_bias); cudaFree(pool); cudaFree(idx); cudaFree(copy_dst); cudaFree(g_log); cudaFree(beta_prob);
      for (uint16_t* d : dense) cudaFree(d);
    }
  }

  // "% of copy bandwidth" is against the spec's copy kernel (kCopyBandwidth, 4.25
  // TB/s read + write). A D2D cudaMemcpy moved only 2.76 TB/s on the H200, less
  // than the decode kernels themselves (docs/perf-log.md), so it is a column, not
  // the reference; "rmw" is the floor of the decode's own access pattern.
  auto tbps = [](const Row& r, size_t c) { return r.bytes / (r.st[c].median * 1e-6) / 1e12; };
  if (dim != 128) std::printf("\nK = V = %d\n", dim);
  if (!ab) {
    std::printf("\n| N | H | pool | µs / step | state TB/s | %% of copy bandwidth (4.25 TB/s) |\n|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %d | %d | %s | %.2f | %.2f | %.0f%% |\n", r.N, H, r.dtype.c_str(), r.st[0].median, tbps(r, 0),
                  100 * tbps(r, 0) * 1e12 / kCopyBandwidth);
  } else {
    std::printf("\ncopy bandwidth %.3f TB/s (spec section 5); H = %d; median of %d replays (%d rounds x %d, interleaved) of a "
                "%d-step CUDA graph, per step\n",
                kCopyBandwidth / 1e12, H, rounds * per_round, rounds, per_round, kStepsPerGraph);
    auto header = [&](const char* title, bool best) {
      std::printf("\n%s\n\n| N | pool |", title);
      for (const Column& c : cols) std::printf(" %s |", c.label.c_str());
      std::printf(best ? " best |\n|---|---|" : "\n|---|---|");
      for (size_t i = 0; i < cols.size(); ++i) std::printf("---|");
      std::printf(best ? "---|\n" : "\n");
    };
    header("µs per decode step", true);
    for (const Row& r : rows) {
      std::printf("| %d | %s |", r.N, r.dtype.c_str());
      size_t best = cols.size();
      for (size_t c = 0; c < cols.size(); ++c) {
        std::printf(" %.2f |", r.st[c].median);
        if (cols[c].kind == Kind::kDecode && (best == cols.size() || r.st[c].median < r.st[best].median)) best = c;
      }
      if (best < cols.size()) std::printf(" %s |\n", cols[best].label.c_str());
      else std::printf(" — |\n");
    }
    header("state bandwidth, % of the copy bandwidth", false);
    for (const Row& r : rows) {
      std::printf("| %d | %s |", r.N, r.dtype.c_str());
      for (size_t c = 0; c < cols.size(); ++c)
        if (cols[c].kind == Kind::kEmpty) std::printf(" — |");
        else std::printf(" %.1f%% |", 100 * tbps(r, c) * 1e12 / kCopyBandwidth);
      std::printf("\n");
    }
    header("spread: (p90 − p10) / median, %", false);
    for (const Row& r : rows) {
      std::printf("| %d | %s |", r.N, r.dtype.c_str());
      for (size_t c = 0; c < cols.size(); ++c) std::printf(" %.1f |", 100 * (r.st[c].p90 - r.st[c].p10) / r.st[c].median);
      std::printf("\n");
    }
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) { std::perror(json.c_str()); return 1; }
    if (!ab) {  // the production table, in the format of earlier runs
      std::fprintf(f, "[\n");
      for (size_t i = 0; i < rows.size(); ++i)
        std::fprintf(f, "  {\"N\": %d, \"heads\": %d, \"pool\": \"%s\", \"us_per_step\": %.3f, \"state_tbps\": %.3f}%s\n",
                     rows[i].N, H, rows[i].dtype.c_str(), rows[i].st[0].median, tbps(rows[i], 0),
                     i + 1 < rows.size() ? "," : "");
      std::fprintf(f, "]\n");
      std::fclose(f);
      return 0;
    }
    std::fprintf(f, "{\"copy_tbps\": %.4f, \"heads\": %d, \"rows\": [\n", kCopyBandwidth / 1e12, H);
    bool first = true;
    for (const Row& r : rows)
      for (size_t c = 0; c < cols.size(); ++c) {
        std::fprintf(f, "%s  {\"N\": %d, \"pool\": \"%s\", \"column\": \"%s\", \"us_per_step\": %.3f, \"p10\": %.3f, "
                        "\"p90\": %.3f, \"state_tbps\": %.4f}",
                     first ? "" : ",\n", r.N, r.dtype.c_str(), cols[c].label.c_str(), r.st[c].median, r.st[c].p10,
                     r.st[c].p90, tbps(r, c));
        first = false;
      }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  return 0;
}
