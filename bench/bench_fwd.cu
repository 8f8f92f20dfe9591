// flashkda-bench: times the CUDA forward on the spec's standard table (section 5)
// and prints median ms, achieved GB/s and the ratio to the IO floor.
//
//   flashkda-bench [--heads 96,64] [--states fp32,bf16,none] [--iters 100] [--warmup 10]
//                  [--cases 8192,varlen6,8x1024] [--table standard|tp] [--v-split 0|1|2] [--stages 0|3|4]
//                  [--seg-chunks 0|-1|N] [--sweep-v-split] [--sweep-plan] [--plans "v,s[,seg[,rec[,out[,compose[,ochunks[,storer]]]]]];..."]
//                  [--checkpoints C] [--checkpoints-dtype bf16|fp32] [--checkpoints-value-major]
//                  [--checkpoints-paired] [--no-host-lengths]
//                  [--head-dim 128|64] [--gate safe|log-decay|log-decay-wide] [--json FILE]
//
// --cases: the standard table's three (default) and the tensor-parallel rows'
// 1024, 32768, 4x8192, 1M (one sequence of 2^20 tokens), and 64x128 (a chunked
// prefill's batch of many short sequences); any other case is a '+'-joined list
// of NxL (N sequences of L tokens) and L terms, e.g. 512x128 or 1x8000+3x64.
// --no-host-lengths: varlen rows without cu_seqlens_host (engines' calls), so the
// launch plan knows the token count but not the lengths. --table tp replaces
// --heads x --cases by the tensor-parallel table of spec section 5: H in {12, 24,
// 48} x {1024, 8192, 32768}; H = 12 with 4x8192 and varlen6; H = 1 with 1M.
// --checkpoints C: also write a bf16 checkpoint every C tokens in fla's key-major
// layout (the prefix-caching call of spec section 7; C a multiple of 16);
// --checkpoints-dtype fp32 and --checkpoints-value-major ([HV, V, K] entries) change
// the entries' form, to tell the bytes from the layout. --checkpoints-paired
// times every row without and with the checkpoints, launch for launch in
// alternation on the same inputs, and prints what they cost: the ratio of the two
// medians and the median of the pairs' ratios (separate runs of the two drift
// apart with the SM clock by about as much as the cost itself).
// --head-dim 64: every row at K = V = 64 (the FlashKDA design column is for 128 only).
// --gate log-decay: g as fp32 log decays (GateForm::kLogDecay, uniform in (-0.5, 0]
// a token) and beta as fp32 b (beta_is_probability): the general inputs' prologue,
// as vLLM's Kimi Linear layer calls the forward; log-decay-wide: log decays in
// (-20, 0], so that every chunk passes 2^-116 and takes the exact path
// (sm90/kernel/wide_decay.cuh), its worst case.
// --v-split / --stages / --seg-chunks force one part of the launch plan
// (sm90::LaunchOverride; --seg-chunks -1: never split a sequence, N: segments of
// N chunks); unset parts keep the heuristic's choice. --sweep-plan times the plans worth
// comparing (V split 1; V split 2 with 4 or 3 stages) one after the other on the
// same inputs; --plans lists overrides to time the same way (v_split,stages, and
// optionally seg_chunks, how 4-warp CTAs load records at K = 128: 1 cp.async,
// 2 bulk copy, how a segment scan forms out: 1 chains again (pass 3), 2 by
// superposition, its composition: 1 the register form, 4/8/16/32 the staged
// form with that many rows a CTA, the outputs' chunks a CTA, and whether a
// checkpoint call on bulk records writes its entries by the entry storer: 1 no,
// 2 yes).
//
// Timing: CUDA events around each launch, median of --iters launches after
// --warmup; the SM clock measured right after them is printed with each row
// (under a sustained load the GPU lowers it, and a row's time follows). Inputs
// are random (never zeros), generated on the device; one problem's inputs
// (0.8 GB at T = 8192, H = 96) are far larger than the 60 MB L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_common.cuh"
#include "flashkda/flashkda.h"
#include "sm90/segment_plan.h"
#include "sm90/sm90_forward.h"

namespace {

using namespace flashkda::bench;




// Approximately standard-normal bf16 values (sum of four uniforms, rescaled).
__global__ void fill_normal_bf16(uint16_t* x, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int j = 0; j < 4; ++j) s += hash32(seed + 4 * i + j) * 2.3283064e-10f;
    const float f = (s - 2.f) * 1.7320508f * stddev;
    uint32_t u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    x[i] = static_cast<uint16_t>(u >> 16);
  }
}

struct Case {
  std::string name;
  std::vector<int64_t> seqlens;  // one entry: a single sequence without cu_seqlens
};

struct Published {  // the published FlashKDA design, fp32 state, same GPU (spec section 5)
  int heads;
  const char* name;
  double ms;
};
// The tensor-parallel rows were measured on 2026-11-30 (spec section 5, whose
// targets for them are 0.025, 0.10, 0.30, 0.25, 0.15, 0.25 and 2.0 ms: >= 4x).
const Published kPublished[] = {{12, "1024", 0.129}, {12, "8192", 0.859}, {12, "32768", 3.303},
                                {12, "4x8192", 1.150}, {24, "8192", 0.938}, {48, "8192", 1.089},
                                {1, "1M", 92.4},
                                {96, "8192", 1.400}, {96, "varlen6", 1.394}, {96, "8x1024", 1.204},
                                {64, "8192", 1.188}, {64, "varlen6", 1.017}, {64, "8x1024", 0.814}};

double published_ms(int heads, const char* name) {
  for (const auto& p : kPublished)
    if (p.heads == heads && std::strcmp(p.name, name) == 0) return p.ms;
  return 0;
}

struct Row {
  int heads;
  std::string name, state;
  int v_split;
  std::string plan;
  double ms, gbps, floor_ms, published, sm_mhz;
};

// A row timed without and with checkpoints (--checkpoints-paired).
struct PairedRow {
  int heads;
  std::string name;
  double none_ms, ck_ms, ratio_of_medians, median_ratio, sm_mhz;
};

float median_of(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> heads = {96, 64};
  std::vector<std::string> states = {"fp32", "bf16", "none"};
  int iters = 100, warmup = 10;
  int64_t checkpoint_every = 0;
  bool checkpoints_fp32 = false, checkpoints_value_major = false, checkpoints_paired = false;
  bool host_lengths = true;  // --no-host-lengths: cu_seqlens on the device only, as engines pass it
  int64_t dim = 128;  // K = V of every row (--head-dim)
  std::string gate = "safe";  // --gate
  flashkda::sm90::LaunchOverride forced;
  bool sweep = false, sweep_plan = false;
  std::string json;
  std::vector<std::string> case_names = {"8192", "varlen6", "8x1024"};
  bool tp_table = false;
  std::vector<flashkda::sm90::LaunchOverride> listed_plans;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--heads") heads = split_ints(next());
    else if (a == "--states") states = split_list(next());
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--v-split") forced.v_split = std::atoi(next().c_str());
    else if (a == "--stages") forced.stages = std::atoi(next().c_str());
    else if (a == "--seg-chunks") forced.seg_chunks = std::atoll(next().c_str());
    else if (a == "--cases") case_names = split_list(next());
    else if (a == "--table") {
      const std::string t = next();
      if (t != "standard" && t != "tp") { std::fprintf(stderr, "--table: expected standard or tp\n"); return 2; }
      tp_table = t == "tp";
    }
    else if (a == "--plans") {
      for (const std::string& one : split_list(next(), ';')) {
        const std::vector<int> f = split_ints(one);
        flashkda::sm90::LaunchOverride o;
        if (f.size() > 0) o.v_split = f[0];
        if (f.size() > 1) o.stages = f[1];
        if (f.size() > 2) o.seg_chunks = f[2];
        if (f.size() > 3) o.records = f[3];
        if (f.size() > 4) o.outputs = f[4];
        if (f.size() > 5) o.compose = f[5];
        if (f.size() > 6) o.output_chunks = f[6];
        if (f.size() > 7) o.entry_storer = f[7];
        listed_plans.push_back(o);
      }
    }
    else if (a == "--sweep-v-split") sweep = true;
    else if (a == "--sweep-plan") sweep_plan = true;
    else if (a == "--json") json = next();
    else if (a == "--checkpoints") checkpoint_every = std::atoll(next().c_str());
    else if (a == "--checkpoints-dtype") {
      const std::string d = next();
      if (d != "bf16" && d != "fp32") { std::fprintf(stderr, "--checkpoints-dtype: expected bf16 or fp32\n"); return 2; }
      checkpoints_fp32 = d == "fp32";
    }
    else if (a == "--checkpoints-value-major") checkpoints_value_major = true;
    else if (a == "--checkpoints-paired") checkpoints_paired = true;
    else if (a == "--no-host-lengths") host_lengths = false;
    else if (a == "--gate") {
      gate = next();
      if (gate != "safe" && gate != "log-decay" && gate != "log-decay-wide") {
        std::fprintf(stderr, "--gate: expected safe, log-decay or log-decay-wide\n");
        return 2;
      }
    }
    else if (a == "--head-dim") {
      dim = std::atoll(next().c_str());
      if (dim != 64 && dim != 128) { std::fprintf(stderr, "--head-dim: expected 64 or 128\n"); return 2; }
    }
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  if (checkpoints_paired && checkpoint_every <= 0) {
    std::fprintf(stderr, "--checkpoints-paired needs --checkpoints C\n");
    return 2;
  }
  std::string why;
  if (!flashkda::cuda_backend_available(&why)) {
    std::fprintf(stderr, "flashkda-bench: %s\n", why.c_str());
    return 1;
  }
  const Case known[] = {{"8192", {8192}},
                        {"varlen6", {1300, 547, 2048, 963, 271, 3063}},
                        {"8x1024", {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}},
                        {"1024", {1024}},
                        {"32768", {32768}},
                        {"4x8192", {8192, 8192, 8192, 8192}},
                        {"1M", {int64_t{1} << 20}},
                        {"64x128", std::vector<int64_t>(64, 128)}};
  // Any other case is a '+'-joined list of NxL (N sequences of L tokens) and L
  // (one of L) terms, given as cu_seqlens: 512x128, 1x8000+3x64.
  std::deque<Case> parsed;  // stable addresses
  auto find_case = [&](const std::string& name) -> const Case* {
    for (const Case& c : known)
      if (name == c.name) return &c;
    Case made{name, {}};
    for (const std::string& term : split_list(name, '+')) {
      long long n = 1, len = 0;
      char tail = 0;
      const bool many = std::sscanf(term.c_str(), "%lldx%lld%c", &n, &len, &tail) == 2;
      if (!many && std::sscanf(term.c_str(), "%lld%c", &len, &tail) != 1) return nullptr;
      if (n < 1 || len < 1 || made.seqlens.size() + n > (1 << 20)) return nullptr;
      made.seqlens.insert(made.seqlens.end(), static_cast<size_t>(n), len);
    }
    if (made.seqlens.size() < 2) return nullptr;  // one sequence: the known single-sequence cases
    parsed.push_back(made);
    return &parsed.back();
  };
  // The (H, case) rows to time.
  std::vector<std::pair<int, Case>> table;
  if (tp_table) {
    for (int H : {12, 24, 48})
      for (const char* name : {"1024", "8192", "32768"}) table.push_back({H, *find_case(name)});
    table.push_back({12, *find_case("4x8192")});
    table.push_back({12, *find_case("varlen6")});
    table.push_back({1, *find_case("1M")});
  } else {
    for (int H : heads)
      for (const std::string& name : case_names) {
        const Case* found = find_case(name);
        if (!found) { std::fprintf(stderr, "unknown case %s\n", name.c_str()); return 2; }
        table.push_back({H, *found});
      }
  }
  // Launch plans to time, each on the same inputs one after the other.
  std::vector<flashkda::sm90::LaunchOverride> plans = {forced};
  if (sweep) {
    plans.clear();
    for (int vs : {1, 2}) {
      flashkda::sm90::LaunchOverride o = forced;
      o.v_split = vs;
      plans.push_back(o);
    }
  }
  if (sweep_plan) plans = {{1, 4}, {2, 4}, {2, 3}};
  if (!listed_plans.empty()) plans = listed_plans;
  std::vector<Row> rows;
  std::vector<PairedRow> paired_rows;
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  for (const auto& [H, c] : table) {
    {
      std::vector<int64_t> cu = {0};
      for (int64_t L : c.seqlens) cu.push_back(cu.back() + L);
      const int64_t T = cu.back(), N = static_cast<int64_t>(c.seqlens.size());
      const int64_t tok_elems = T * H * dim, state_elems = N * H * dim * dim;
      uint16_t *q, *k, *v, *g, *beta, *out;
      float *A_log, *dt_bias;
      void *init, *fin;
      int64_t* d_cu;
      CHECK_CUDA(cudaMalloc(&q, tok_elems * 2));
      CHECK_CUDA(cudaMalloc(&k, tok_elems * 2));
      CHECK_CUDA(cudaMalloc(&v, tok_elems * 2));
      CHECK_CUDA(cudaMalloc(&g, tok_elems * 2));
      CHECK_CUDA(cudaMalloc(&out, tok_elems * 2));
      CHECK_CUDA(cudaMalloc(&beta, T * H * 2));
      CHECK_CUDA(cudaMalloc(&A_log, H * 4));
      CHECK_CUDA(cudaMalloc(&dt_bias, H * dim * 4));
      CHECK_CUDA(cudaMalloc(&init, state_elems * 4));
      CHECK_CUDA(cudaMalloc(&fin, state_elems * 4));
      CHECK_CUDA(cudaMalloc(&d_cu, cu.size() * 8));
      CHECK_CUDA(cudaMemcpy(d_cu, cu.data(), cu.size() * 8, cudaMemcpyHostToDevice));
      fill_normal_bf16<<<1024, 256>>>(q, tok_elems, 1, 1.f);
      fill_normal_bf16<<<1024, 256>>>(k, tok_elems, 2, 1.f);
      fill_normal_bf16<<<1024, 256>>>(v, tok_elems, 3, 1.f);
      fill_normal_bf16<<<1024, 256>>>(g, tok_elems, 4, 1.f);
      fill_normal_bf16<<<1024, 256>>>(beta, T * H, 5, 1.f);
      fill_uniform_f32<<<64, 256>>>(A_log, H, 6, 1.f);
      fill_uniform_f32<<<64, 256>>>(dt_bias, H * dim, 7, 1.f);
      float *g_log = nullptr, *beta_prob = nullptr;  // --gate log-decay*: the general inputs
      if (gate != "safe") {
        CHECK_CUDA(cudaMalloc(&g_log, tok_elems * 4));
        CHECK_CUDA(cudaMalloc(&beta_prob, T * H * 4));
        fill_uniform_f32<<<1024, 256>>>(g_log, tok_elems, 9, gate == "log-decay" ? -0.5f : -20.f);
        fill_uniform_f32<<<64, 256>>>(beta_prob, T * H, 10, 1.f);
      }
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaDeviceSynchronize());

      for (const std::string& st : states) {
        const flashkda::DType dt = st == "fp32"   ? flashkda::DType::kFP32
                                   : st == "bf16" ? flashkda::DType::kBF16
                                                  : flashkda::DType::kNone;
        // The initial state in the dtype it is read as (an fp32 buffer read as bf16
        // would be random exponents, Inf and NaN).
        if (dt == flashkda::DType::kBF16) fill_normal_bf16<<<1024, 256>>>(static_cast<uint16_t*>(init), state_elems, 8, 0.1f);
        else fill_uniform_f32<<<1024, 256>>>(static_cast<float*>(init), state_elems, 8, 0.1f);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaDeviceSynchronize());
        flashkda::ForwardArgs a;
        a.q = q; a.k = k; a.v = v; a.g = g; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias; a.out = out;
        if (gate != "safe") {
          a.gate_form = flashkda::GateForm::kLogDecay;
          a.g = g_log;
          a.g_dtype = flashkda::DType::kFP32;
          a.beta = beta_prob;
          a.beta_dtype = flashkda::DType::kFP32;
          a.beta_is_probability = true;
        }
        a.initial_state = dt == flashkda::DType::kNone ? nullptr : init;
        a.initial_state_dtype = dt;
        a.final_state = dt == flashkda::DType::kNone ? nullptr : fin;
        a.final_state_dtype = dt;
        if (N > 1) {
          a.cu_seqlens = d_cu;
          a.cu_seqlens_host = host_lengths ? cu.data() : nullptr;
          a.num_seqs = N;
        }
        a.batch = 1; a.seqlen = T; a.num_heads = H; a.num_v_heads = H; a.head_dim_k = dim; a.head_dim_v = dim;
        a.scale = 1.f / std::sqrt(float(dim));
        a.lower_bound = -5.f;
        void* checkpoints = nullptr;
        if (checkpoint_every > 0) {
          int64_t entries = 0;
          for (int64_t L : c.seqlens) entries += (L + checkpoint_every - 1) / checkpoint_every;
          CHECK_CUDA(cudaMalloc(&checkpoints, static_cast<size_t>(entries * H * dim * dim) * (checkpoints_fp32 ? 4 : 2)));
          a.checkpoints = checkpoints;
          a.checkpoints_dtype = checkpoints_fp32 ? flashkda::DType::kFP32 : flashkda::DType::kBF16;
          a.checkpoints_value_major = checkpoints_value_major;
          a.checkpoint_interval = checkpoint_every;
          a.checkpoints_capacity = entries;
        }
        const double state_bytes = dt == flashkda::DType::kNone ? 0.0
                                   : 2.0 * state_elems * (dt == flashkda::DType::kFP32 ? 4 : 2);
        const double bytes = 5.0 * tok_elems * 2 + T * H * 2.0 + state_bytes;
        int dev = 0, sms = 0;
        CHECK_CUDA(cudaGetDevice(&dev));
        CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        for (const auto& plan_override : plans) {
          flashkda::sm90::set_launch_override(plan_override);
          // The workspace depends on the plan (a split one holds segment states).
          flashkda::ForwardArgs a_none = a;  // the paired twin without checkpoints
          {
            const flashkda::ForwardArgs defaults;
            a_none.checkpoints = defaults.checkpoints;
            a_none.checkpoints_dtype = defaults.checkpoints_dtype;
            a_none.checkpoints_value_major = defaults.checkpoints_value_major;
            a_none.checkpoint_interval = defaults.checkpoint_interval;
            a_none.checkpoints_capacity = defaults.checkpoints_capacity;
          }
          size_t ws_bytes = 0, ws_none = 0;
          flashkda::Status wss = flashkda::workspace_size(a, flashkda::Backend::kCuda, &ws_bytes);
          if (wss.ok()) wss = flashkda::workspace_size(a_none, flashkda::Backend::kCuda, &ws_none);
          if (!wss.ok()) { std::fprintf(stderr, "workspace_size failed: %s\n", wss.message.c_str()); return 1; }
          ws_bytes = std::max(ws_bytes, ws_none);
          void* ws = nullptr;
          CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
          flashkda::sm90::LaunchPlan used;
          if (!flashkda::sm90::launch_plan_for(a, sms, &used).ok()) { std::fprintf(stderr, "no launch plan\n"); return 1; }
          for (int i = 0; i < warmup; ++i) {
            flashkda::Status s = flashkda::forward(a, flashkda::Backend::kCuda, ws, ws_bytes, nullptr);
            if (s.ok() && checkpoints_paired) s = flashkda::forward(a_none, flashkda::Backend::kCuda, ws, ws_bytes, nullptr);
            if (!s.ok()) { std::fprintf(stderr, "forward failed: %s\n", s.message.c_str()); return 1; }
          }
          auto time_one = [&](const flashkda::ForwardArgs& args) {
            float t = 0.f;
            CHECK_CUDA(cudaEventRecord(e0));
            flashkda::forward(args, flashkda::Backend::kCuda, ws, ws_bytes, nullptr);
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
            return t;
          };
          std::vector<float> ms(iters), ms_none, pair_ratio;
          for (int i = 0; i < iters; ++i) {
            if (!checkpoints_paired) {
              ms[i] = time_one(a);
              continue;
            }
            // Which of the pair runs first alternates, so that neither always
            // follows the other's writes.
            float none = 0.f;
            if (i % 2 == 0) none = time_one(a_none);
            ms[i] = time_one(a);
            if (i % 2 != 0) none = time_one(a_none);
            ms_none.push_back(none);
            pair_ratio.push_back(ms[i] / none);
          }
          CHECK_CUDA(cudaGetLastError());
          const double mhz = sm_clock_mhz();
          const double med = median_of(ms);
          if (checkpoints_paired) {
            const double none_med = median_of(ms_none);
            paired_rows.push_back({H, c.name, none_med, med, med / none_med, median_of(pair_ratio), mhz});
          }
          // Lengths on the device only: the segments the device chose (pieces of seg_chunks).
          std::string device_choice;
          if (used.device_segments) {
            int32_t pieces = 0;
            CHECK_CUDA(cudaMemcpy(&pieces, static_cast<char*>(ws) + flashkda::sm90::device_segment_plan_offset(a, used),
                                  sizeof(pieces), cudaMemcpyDeviceToHost));
            device_choice = pieces == flashkda::sm90::kWholeSequences
                                ? " (device: none cut)"
                                : " (device: " + std::to_string(pieces * used.seg_chunks) + ")";
          }
          const std::string plan = std::to_string(used.stages) + " stages" +
                                   (used.seg_chunks > 0 ? ", segments of " + std::to_string(used.seg_chunks) +
                                                              device_choice +
                                                              (used.superposed_outputs ? " superposed" : "")
                                                        : "") +
                                   (checkpoint_every > 0 ? ", checkpoints every " + std::to_string(checkpoint_every) +
                                                               (checkpoints_fp32 ? " fp32" : " bf16") +
                                                               (checkpoints_value_major ? " value-major" : " key-major")
                                                         : "");
          rows.push_back({H, c.name, st, used.v_split, plan, med, bytes / (med * 1e-3) / 1e9,
                          bytes / kCopyBandwidth * 1e3, st == "fp32" && dim == 128 ? published_ms(H, c.name.c_str()) : 0.0,
                          mhz});
          std::fprintf(stderr, "  H=%d %-8s %-4s vsplit=%d %s  %4.0f MHz  %.3f ms\n", H, c.name.c_str(), st.c_str(),
                       used.v_split, plan.c_str(), mhz, med);
          CHECK_CUDA(cudaFree(ws));
        }
        flashkda::sm90::set_launch_override({});
        if (checkpoints != nullptr) CHECK_CUDA(cudaFree(checkpoints));
      }
      cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(g); cudaFree(out); cudaFree(beta);
      cudaFree(A_log); cudaFree(dt_bias); cudaFree(init); cudaFree(fin); cudaFree(d_cu);
      cudaFree(g_log); cudaFree(beta_prob);
    }
  }

  if (dim != 128) std::printf("\nK = V = %lld\n", static_cast<long long>(dim));
  std::printf("\n| H | case | state | v_split | launch | median ms | GB/s | x IO floor | FlashKDA design ms | ratio | SM MHz |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    char pub[64] = "-", ratio[64] = "-";
    if (r.published > 0) {
      std::snprintf(pub, sizeof pub, "%.3f", r.published);
      std::snprintf(ratio, sizeof ratio, "%.2fx", r.ms / r.published);
    }
    std::printf("| %d | %s | %s | %d | %s | %.3f | %.0f | %.2f | %s | %s | %.0f |\n", r.heads, r.name.c_str(),
                r.state.c_str(), r.v_split, r.plan.c_str(), r.ms, r.gbps, r.ms / r.floor_ms, pub, ratio, r.sm_mhz);
  }
  if (!paired_rows.empty()) {
    std::printf("\nCheckpoints every %lld tokens (%s, %s), each launch paired with one without:\n\n",
                static_cast<long long>(checkpoint_every), checkpoints_fp32 ? "fp32" : "bf16",
                checkpoints_value_major ? "value-major" : "key-major");
    std::printf("| H | case | none ms | with ms | ratio of medians | median of pair ratios | SM MHz |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (const PairedRow& r : paired_rows)
      std::printf("| %d | %s | %.3f | %.3f | %.3f | %.3f | %.0f |\n", r.heads, r.name.c_str(), r.none_ms, r.ck_ms,
                  r.ratio_of_medians, r.median_ratio, r.sm_mhz);
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) { std::perror(json.c_str()); return 1; }
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "  {\"heads\": %d, \"case\": \"%s\", \"state\": \"%s\", \"v_split\": %d, \"launch\": \"%s\", "
                   "\"median_ms\": %.5f, "
                   "\"gbps\": %.1f, \"io_floor_ms\": %.5f, \"flashkda_design_ms\": %.3f, \"sm_mhz\": %.0f}%s\n",
                   r.heads, r.name.c_str(), r.state.c_str(), r.v_split, r.plan.c_str(), r.ms, r.gbps, r.floor_ms,
                   r.published, r.sm_mhz,
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
