// Random calls of the forward with every feature drawn at once: head dim, value
// heads grouped or not, a batch or varlen lengths (empty sequences, partial
// chunks, whole chunks, long ones), int64 or int32 boundaries with or without a
// host copy, strided token views, dense states (in place, final_state ==
// initial_state, or apart) or a state pool (int32 or int64
// indices, negative ones, has_initial_state, padded slots, fp32 or bf16),
// periodic checkpoints (either layout and dtype, any interval), slot checkpoints,
// the general inputs (a log decay, some channels far past the safe gate's bound,
// or the raw gate; g and beta in bf16 or fp32; beta as the logit or as b), and,
// for kCuda, a launch plan (the heuristic's or a forced one). A call runs on
// a backend and on the float64 reference with the same arguments, and the two
// results are compared sequence by sequence, entry by entry and slot by slot;
// what no sequence owns (pool slots, slot padding, spare checkpoint entries,
// guard bands) must keep its bytes. The feature-by-feature tests check each
// feature alone; these check them meeting. Used by tests/gpu/test_random_calls_gpu.cpp
// (kCuda) and tests/cpu/test_random_calls.cpp (kCpuChunked).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/sequences.h"
#include "flashkda/flashkda.h"
#include "tests/common/general_inputs.h"
#include "tests/common/kda_problem.h"

namespace flashkda::testing::random_calls {

constexpr uint16_t kNanBits = 0x7fc1;  // bf16 NaN: what a view's padding and an unwritten out hold
constexpr uint8_t kUntouched = 0x3c;   // spare checkpoint entries' bytes
constexpr uint8_t kGuardByte = 0x5a;   // host guard bands
constexpr size_t kGuardBytes = 256;

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  int64_t in(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen) < p; }
  template <class T>
  T pick(std::initializer_list<T> xs) {
    return *(xs.begin() + in(0, static_cast<int64_t>(xs.size()) - 1));
  }
};

// A sequence length from the mix a serving batch sends.
inline int64_t draw_length(Rng& r) {
  const int64_t kind = r.in(0, 19);
  if (kind < 2) return 0;
  if (kind < 6) return r.in(1, 15);
  if (kind < 9) return 16 * r.in(1, 12);
  if (kind < 15) return r.in(17, 300);
  if (kind < 19) return r.in(300, 1200);
  return r.in(1200, 2400);
}

// A token tensor [tokens, heads, width] of bf16 bits or fp32 as a strided view:
// every row starts `align` elements aligned (kCuda's rule: 16 bytes for q, k, v
// and g), the padding holds NaN.
struct View {
  std::vector<uint8_t> bytes;
  size_t element = 2;                                      // bytes an element
  int64_t offset = 0, token_stride = 0, head_stride = 0;  // elements; 0, 0: dense
  size_t offset_bytes() const { return static_cast<size_t>(offset) * element; }
  const void* ptr() const { return bytes.data() + offset_bytes(); }
};
template <class T>
inline View make_view(const std::vector<T>& dense, int64_t tokens, int64_t heads, int64_t width, bool strided,
                      Rng& r, int64_t align, T nan) {
  View v;
  v.element = sizeof(T);
  std::vector<T> x;
  if (!strided) {
    x = dense;
  } else {
    v.head_stride = width + align * r.in(0, 2);
    v.token_stride = heads * v.head_stride + align * r.in(0, 5);
    v.offset = align * r.in(0, 1);
    x.assign(static_cast<size_t>(v.offset + tokens * v.token_stride + align), nan);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(&x[v.offset + t * v.token_stride + h * v.head_stride], &dense[(t * heads + h) * width],
                    static_cast<size_t>(width) * sizeof(T));
  }
  v.bytes.resize(x.size() * sizeof(T));
  if (!x.empty()) std::memcpy(v.bytes.data(), x.data(), v.bytes.size());
  return v;
}
// g and beta in the problem's dtypes (general_inputs.h).
inline View make_g_view(const HostProblem& p, bool strided, Rng& r) {
  return p.g_dtype == DType::kFP32
             ? make_view(p.g_f32, p.tokens(), p.HV, p.K, strided, r, 4, std::numeric_limits<float>::quiet_NaN())
             : make_view(p.g, p.tokens(), p.HV, p.K, strided, r, 8, kNanBits);
}
inline View make_beta_view(const HostProblem& p, bool strided, Rng& r) {
  return p.beta_dtype == DType::kFP32
             ? make_view(p.beta_f32, p.tokens(), p.HV, 1, strided, r, 1, std::numeric_limits<float>::quiet_NaN())
             : make_view(p.beta, p.tokens(), p.HV, 1, strided, r, 1, kNanBits);
}

// The seeds a suite of `count` calls runs (INSTANTIATE_TEST_SUITE_P's generator):
// [0, count), or, for a longer sweep, FLASHKDA_RANDOM_SEEDS = "first:count" (or "count").
inline auto seeds(int count) {
  int first = 0;
  const char* env = std::getenv("FLASHKDA_RANDOM_SEEDS");
  if (env != nullptr && *env != '\0') {
    const std::string s(env);
    const size_t colon = s.find(':');
    if (colon != std::string::npos) first = std::atoi(s.substr(0, colon).c_str());
    count = std::max(std::atoi(colon == std::string::npos ? s.c_str() : s.substr(colon + 1).c_str()), 1);
  }
  return ::testing::Range(first, first + count);
}

// kCuda's launch plan for the call (sm90::LaunchOverride's fields; 0: the heuristic's).
struct PlanChoice {
  int v_split = 0;
  int64_t seg_chunks = 0;
  int outputs = 0, records = 0, compose = 0;
};

// Which head dims a draw takes: kCuda's (64 or 128), or smaller ones that keep the
// float64 reference quick on the CPU backends (which run any head dim).
enum class HeadDims { kCuda, kSmall };

struct Call {
  HostProblem p;
  std::string what;
  View q, k, v, g, beta;
  bool int32_cu = false, host_copy = true;
  // Dense states (p.spec's dtypes; [N, HV, K, V] with states_key_major), or a pool.
  bool pool = false;
  bool states_key_major = false;
  bool state_in_place = false;  // final_state is the initial_state buffer
  DType pool_dtype = DType::kNone;
  int64_t pool_size = 0, pool_stride = 0;
  IndexType index_type = IndexType::kInt32;
  std::vector<int64_t> slots;      // [N]; negative: none
  std::vector<uint8_t> has_state;  // [N] or empty
  std::vector<uint8_t> pool_bytes;
  // Periodic checkpoints (interval 0: none) and slot checkpoints.
  int64_t interval = 0, capacity = 0, entries = 0;
  DType ck_dtype = DType::kNone;
  bool ck_value_major = false;
  std::vector<int64_t> slot_ck_offsets, slot_ck_slots;  // [N, 2] or empty
  PlanChoice plan{};
  std::string general = "none";  // the general inputs drawn (gate form, dtypes), for the trace

  size_t esize(DType t) const { return t == DType::kFP32 ? 4 : 2; }
  int64_t per_state() const { return p.HV * p.V * p.K; }
};

inline std::vector<uint8_t> index_bytes(const std::vector<int64_t>& xs, IndexType t) {
  std::vector<uint8_t> b;
  for (int64_t x : xs) {
    if (t == IndexType::kInt64) {
      const uint8_t* s = reinterpret_cast<const uint8_t*>(&x);
      b.insert(b.end(), s, s + 8);
    } else {
      const int32_t x32 = static_cast<int32_t>(x);
      const uint8_t* s = reinterpret_cast<const uint8_t*>(&x32);
      b.insert(b.end(), s, s + 4);
    }
  }
  return b;
}

inline Call draw_call(uint64_t seed, HeadDims dims = HeadDims::kCuda) {
  Rng r(seed * 0x9e3779b97f4a7c15ull + 17);
  Call c;
  ProblemSpec spec;
  spec.head_dim = dims == HeadDims::kCuda ? (r.chance(0.35) ? 64 : 128) : r.pick<int64_t>({16, 32, 48, 64});
  spec.heads = r.in(1, 3);
  spec.v_heads = spec.heads * (r.chance(0.4) ? 2 : 1);
  const bool varlen = r.chance(0.8);
  if (varlen) {
    const int64_t n = r.in(1, 6);
    for (int64_t i = 0; i < n; ++i) spec.seqlens.push_back(draw_length(r));
  } else {
    spec.batch = r.in(1, 3);
    spec.seqlen = r.chance(0.3) ? 16 * r.in(1, 40) : r.in(1, 700);
  }
  spec.lower_bound = static_cast<float>(r.pick<double>({-5.0, -3.0, -1.0}));
  c.pool = r.chance(0.5);
  if (c.pool) {
    spec.initial_state = spec.final_state = DType::kFP32;  // the pool's initial contents come from here
  } else {
    const DType d = r.pick<DType>({DType::kNone, DType::kFP32, DType::kBF16});
    spec.initial_state = r.chance(0.75) ? d : DType::kNone;
    spec.final_state = r.chance(0.8) ? (d == DType::kNone ? DType::kFP32 : d) : DType::kNone;
    if (spec.initial_state != DType::kNone && spec.final_state != DType::kNone) spec.final_state = spec.initial_state;
  }
  c.p = make_problem(spec, seed + 1000);
  HostProblem& p = c.p;
  const int64_t N = p.N, tokens = p.tokens();
  if (r.chance(0.3)) p.scale = 0.3f;

  c.int32_cu = varlen && r.chance(0.4);
  c.host_copy = varlen && r.chance(0.6);
  const bool strided = r.chance(0.5);
  c.q = make_view(p.q, tokens, p.H, p.K, strided, r, 8, kNanBits);
  c.k = make_view(p.k, tokens, p.H, p.K, strided, r, 8, kNanBits);
  c.v = make_view(p.v, tokens, p.HV, p.V, strided, r, 8, kNanBits);
  c.g = make_g_view(p, strided, r);
  c.beta = make_beta_view(p, strided, r);

  const int64_t per = c.per_state();
  if (c.pool) {
    c.pool_dtype = r.chance(0.5) ? DType::kFP32 : DType::kBF16;
    c.pool_stride = per + (r.chance(0.5) ? 64 : 0);
    c.index_type = r.chance(0.5) ? IndexType::kInt32 : IndexType::kInt64;
    // Distinct slots (a slot two sequences share is unspecified on kCuda), a
    // few sequences without one; slot checkpoints take further distinct slots.
    c.pool_size = 3 * N + 3;
    std::vector<int64_t> free_slots(static_cast<size_t>(c.pool_size));
    for (int64_t s = 0; s < c.pool_size; ++s) free_slots[s] = s;
    std::shuffle(free_slots.begin(), free_slots.end(), r.gen);
    size_t next = 0;
    for (int64_t n = 0; n < N; ++n) c.slots.push_back(r.chance(0.2) ? -1 : free_slots[next++]);
    if (r.chance(0.5))
      for (int64_t n = 0; n < N; ++n) c.has_state.push_back(r.chance(0.7) ? 1 : 0);
    const size_t es = c.esize(c.pool_dtype);
    c.pool_bytes.resize(static_cast<size_t>(c.pool_size * c.pool_stride) * es);
    // Every slot holds a small finite state (the problem's initial states, cycled).
    for (int64_t s = 0; s < c.pool_size; ++s)
      for (int64_t i = 0; i < c.pool_stride; ++i) {
        const float x = i < per ? p.init_f32[static_cast<size_t>((s % N) * per + i)] : 0.5f;
        uint8_t* at = c.pool_bytes.data() + static_cast<size_t>(s * c.pool_stride + i) * es;
        if (c.pool_dtype == DType::kFP32) std::memcpy(at, &x, 4);
        else {
          const uint16_t b = float_to_bf16(x);
          std::memcpy(at, &b, 2);
        }
      }
    if (r.chance(0.4)) {
      c.slot_ck_offsets.assign(static_cast<size_t>(2 * N), -1);
      c.slot_ck_slots.assign(static_cast<size_t>(2 * N), -1);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t len = varlen ? p.cu_seqlens[n + 1] - p.cu_seqlens[n] : p.T;
        for (int i = 0; i < 2; ++i) {
          if (len < 16 || r.chance(0.3)) continue;
          c.slot_ck_offsets[2 * n + i] = 16 * r.in(1, len / 16);
          c.slot_ck_slots[2 * n + i] = free_slots[next++];
        }
      }
    }
  }
  if (r.chance(0.5)) {
    c.interval = 16 * r.pick<int64_t>({1, 2, 3, 4, 8, 16});
    c.ck_dtype = r.chance(0.6) ? DType::kBF16 : DType::kFP32;
    c.ck_value_major = r.chance(0.3);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t len = varlen ? p.cu_seqlens[n + 1] - p.cu_seqlens[n] : p.T;
      c.entries += checkpoints_of(len, c.interval);
    }
    c.capacity = std::max<int64_t>(1, c.entries + r.in(0, 2));  // a buffer holds one entry at least
  }
  const int64_t plan = r.in(0, 9);
  if (plan >= 5 && plan <= 7) {
    c.plan.seg_chunks = r.pick<int64_t>({1, 2, 3, 7});
    c.plan.outputs = static_cast<int>(r.in(0, 2));
  } else if (plan == 8) {
    c.plan.seg_chunks = -1;
    if (p.K == 128) {
      c.plan.v_split = static_cast<int>(r.in(1, 2));
      c.plan.records = c.plan.v_split == 2 ? static_cast<int>(r.in(0, 2)) : 0;
    }
  } else if (plan == 9) {
    c.plan.seg_chunks = 2;
    c.plan.compose = r.pick<int>({1, 4, 8});
  }

  // Drawn last, so that the calls drawn before this choice existed stay the same.
  c.states_key_major = !c.pool && r.chance(0.5);
  c.state_in_place = !c.pool && spec.initial_state != DType::kNone && spec.initial_state == spec.final_state &&
                     r.chance(0.5);
  // The general inputs (general_inputs.h), g's and beta's views drawn again for them.
  if (r.chance(0.35)) {
    const bool log_decay = r.chance(0.7);
    const DType g_dtype = r.chance(0.5) ? DType::kFP32 : DType::kBF16;
    const bool beta_probability = r.chance(0.5);
    const DType beta_dtype = r.chance(0.5) ? DType::kFP32 : DType::kBF16;
    if (log_decay) {
      std::vector<double> a = safe_gate_log_decays(p);
      if (r.chance(0.4)) a = with_strong_decays(p, a, r.pick<double>({-20.0, -60.0, -1000.0}), 7, r.chance(0.5));
      p = with_general_inputs(p, a, g_dtype, beta_probability, beta_dtype);
    } else {
      p = with_raw_gate_inputs(p, g_dtype, beta_probability, beta_dtype);
    }
    c.general = std::string(log_decay ? "log-decay" : "raw-gate") + (g_dtype == DType::kFP32 ? "/g32" : "/g16") +
                (beta_probability ? "/b" : "/logit") + (beta_dtype == DType::kFP32 ? "32" : "16");
    c.g = make_g_view(p, strided, r);
    c.beta = make_beta_view(p, strided, r);
  }

  char buf[512];
  std::string lens;
  if (varlen)
    for (int64_t n = 0; n < N; ++n) lens += (n ? "," : "") + std::to_string(p.cu_seqlens[n + 1] - p.cu_seqlens[n]);
  else lens = std::to_string(p.B) + "x" + std::to_string(p.T);
  std::snprintf(buf, sizeof(buf),
                "K=%lld H=%lld HV=%lld lens=[%s] cu=%s%s views=%s states=%s%s%s%s ck=%lld%s%s slot_ck=%s inputs=%s "
                "plan=(v%d seg%lld out%d rec%d comp%d)",
                static_cast<long long>(p.K), static_cast<long long>(p.H), static_cast<long long>(p.HV), lens.c_str(),
                !varlen ? "none" : c.int32_cu ? "int32" : "int64", c.host_copy ? "+host" : "",
                strided ? "strided" : "dense",
                c.pool ? (c.pool_dtype == DType::kFP32 ? "pool-fp32" : "pool-bf16")
                       : (to_string(spec.initial_state) + std::string("->") + to_string(spec.final_state)).c_str(),
                c.pool ? (c.index_type == IndexType::kInt64 ? "/i64" : "/i32") : "",
                c.states_key_major ? "/kv" : "", c.state_in_place ? "/in-place" : "",
                static_cast<long long>(c.interval), c.interval ? (c.ck_dtype == DType::kFP32 ? "/fp32" : "/bf16") : "",
                c.interval && c.ck_value_major ? "/vk" : "", c.slot_ck_offsets.empty() ? "no" : "yes",
                c.general.c_str(), c.plan.v_split, static_cast<long long>(c.plan.seg_chunks), c.plan.outputs,
                c.plan.records, c.plan.compose);
  c.what = buf;
  return c;
}

// The call's arguments over the given buffers (host ones, or device ones for kCuda).
struct Buffers {
  const void *q, *k, *v, *g, *beta;
  const float *A_log, *dt_bias;
  const int64_t* cu;
  const int32_t* cu32;
  void* out;
  const void* init;
  void* fin;
  void* pool;
  const void* slots;
  const uint8_t* has;
  void* ck;
  const int64_t* slot_ck_offsets;
  const void* slot_ck_slots;
};
// `cuda`: the host copy of the boundaries goes with the call where drawn (the CPU
// backends read cu_seqlens on the host; a copy there must be the same values).
inline ForwardArgs call_args(const Call& c, const Buffers& b, bool cuda) {
  const HostProblem& p = c.p;
  ForwardArgs a = p.host_args(b.out, nullptr);
  a.q = b.q; a.k = b.k; a.v = b.v; a.g = b.g; a.beta = b.beta;
  a.A_log = b.A_log; a.dt_bias = b.dt_bias;
  a.q_token_stride = c.q.token_stride; a.q_head_stride = c.q.head_stride;
  a.k_token_stride = c.k.token_stride; a.k_head_stride = c.k.head_stride;
  a.v_token_stride = c.v.token_stride; a.v_head_stride = c.v.head_stride;
  a.g_token_stride = c.g.token_stride; a.g_head_stride = c.g.head_stride;
  a.beta_token_stride = c.beta.token_stride; a.beta_head_stride = c.beta.head_stride;
  a.cu_seqlens = a.cu_seqlens_host = nullptr;
  if (!p.cu_seqlens.empty()) {
    if (c.int32_cu) a.cu_seqlens_int32 = b.cu32;
    else a.cu_seqlens = b.cu;
    if (cuda && c.host_copy) a.cu_seqlens_host = p.cu_seqlens.data();
  }
  if (c.pool) {
    a.initial_state = nullptr;
    a.initial_state_dtype = a.final_state_dtype = DType::kNone;
    a.state_pool = b.pool;
    a.state_pool_dtype = c.pool_dtype;
    a.pool_size = c.pool_size;
    a.pool_stride = c.pool_stride;
    a.state_indices = b.slots;
    a.state_index_type = c.index_type;
    a.has_initial_state = c.has_state.empty() ? nullptr : b.has;
    if (!c.slot_ck_offsets.empty()) {
      a.slot_checkpoint_offsets = b.slot_ck_offsets;
      a.slot_checkpoint_slots = b.slot_ck_slots;
    }
  } else {
    a.initial_state = p.spec.initial_state == DType::kNone ? nullptr : b.init;
    a.final_state = p.spec.final_state == DType::kNone ? nullptr : b.fin;
    a.states_key_major = c.states_key_major;
  }
  if (c.interval > 0) {
    a.checkpoints = b.ck;
    a.checkpoints_dtype = c.ck_dtype;
    a.checkpoint_interval = c.interval;
    a.checkpoints_capacity = c.capacity;
    a.checkpoints_value_major = c.ck_value_major;
  }
  return a;
}

struct Results {
  std::vector<uint16_t> out;
  std::vector<uint8_t> fin, pool, ck;
};

inline const void* initial_bytes(const HostProblem& p) {
  return p.spec.initial_state == DType::kBF16 ? static_cast<const void*>(p.init_bf16.data())
                                               : static_cast<const void*>(p.init_f32.data());
}
inline size_t state_size(const Call& c) {
  return c.p.spec.final_state == DType::kNone ? 0
                                               : static_cast<size_t>(c.p.N * c.per_state()) * c.esize(c.p.spec.final_state);
}
// What the final state's buffer holds before the call: the initial states where
// the call updates them in place, else NaN bytes (an unwritten state shows).
inline std::vector<uint8_t> final_state_start(const Call& c) {
  std::vector<uint8_t> b(state_size(c), 0xff);
  if (c.state_in_place && !b.empty()) std::memcpy(b.data(), initial_bytes(c.p), b.size());
  return b;
}
inline size_t ck_size(const Call& c) {
  return c.interval > 0 ? static_cast<size_t>(c.capacity * c.per_state()) * c.esize(c.ck_dtype) : 0;
}

// Host bytes with guard bands on both sides: a write outside the tensor shows.
struct HostGuarded {
  std::vector<uint8_t> bytes;
  size_t size;
  explicit HostGuarded(const std::vector<uint8_t>& inner) : size(inner.size()) {
    bytes.assign(inner.size() + 2 * kGuardBytes, kGuardByte);
    if (!inner.empty()) std::memcpy(bytes.data() + kGuardBytes, inner.data(), inner.size());
  }
  uint8_t* data() { return bytes.data() + kGuardBytes; }
  std::vector<uint8_t> inner() const {
    return std::vector<uint8_t>(bytes.begin() + kGuardBytes, bytes.begin() + kGuardBytes + size);
  }
  size_t damaged() const {
    size_t bad = 0;
    for (size_t i = 0; i < kGuardBytes; ++i)
      bad += (bytes[i] != kGuardByte) + (bytes[kGuardBytes + size + i] != kGuardByte);
    return bad;
  }
};

// The call on a CPU backend over host buffers; guard bands around every output
// (checked: no write outside the tensors).
inline Results run_on_host(const Call& c, Backend backend) {
  const HostProblem& p = c.p;
  HostGuarded out(std::vector<uint8_t>(p.out_elems() * 2, 0xff));  // NaN: unwritten shows
  HostGuarded fin(final_state_start(c));
  HostGuarded pool(c.pool_bytes);
  HostGuarded ck(std::vector<uint8_t>(ck_size(c), kUntouched));
  const std::vector<int32_t> cu32(p.cu_seqlens.begin(), p.cu_seqlens.end());
  const std::vector<uint8_t> slots = index_bytes(c.slots, c.index_type);
  const std::vector<uint8_t> slot_ck_slots = index_bytes(c.slot_ck_slots, c.index_type);
  const Buffers b{c.q.ptr(), c.k.ptr(), c.v.ptr(), c.g.ptr(), c.beta.ptr(), p.A_log.data(), p.dt_bias.data(),
                  p.cu_seqlens.data(), cu32.data(), out.data(), c.state_in_place ? fin.data() : initial_bytes(p),
                  fin.data(), pool.data(),
                  slots.data(), c.has_state.data(), ck.data(), c.slot_ck_offsets.data(), slot_ck_slots.data()};
  ForwardArgs a = call_args(c, b, false);
  if (c.host_copy && !p.cu_seqlens.empty()) a.cu_seqlens_host = p.cu_seqlens.data();  // the same values
  const Status s = forward(a, backend, nullptr, 0, nullptr);
  if (!s.ok()) throw std::runtime_error(std::string(to_string(backend)) + ": " + s.message);
  EXPECT_EQ(out.damaged() + fin.damaged() + pool.damaged() + ck.damaged(), 0u)
      << to_string(backend) << ": a write outside the tensors";
  Results r;
  const std::vector<uint8_t> o = out.inner();
  r.out.resize(p.out_elems());
  if (!o.empty()) std::memcpy(r.out.data(), o.data(), o.size());
  r.fin = fin.inner();
  r.pool = pool.inner();
  r.ck = ck.inner();
  return r;
}

inline std::vector<float> floats(const uint8_t* bytes, size_t n, DType t) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kFP32) std::memcpy(&f[i], bytes + 4 * i, 4);
    else {
      uint16_t b;
      std::memcpy(&b, bytes + 2 * i, 2);
      f[i] = bf16_to_float(b);
    }
  }
  return f;
}

// One state ([HV, V, K] or [HV, K, V]) of dtype t at byte offset `at` of both results.
inline double state_error(const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref, size_t at, int64_t elems,
                          DType t) {
  const std::vector<float> x = floats(got.data() + at, static_cast<size_t>(elems), t);
  const std::vector<float> y = floats(ref.data() + at, static_cast<size_t>(elems), t);
  return rel_rms(x, y);
}

// What a backend's results are held to against the reference's: out's bar (after
// both sides' bf16 rounding) and a state's, by dtype.
struct Bars {
  double out;
  double fp32_state;
  double bf16_state;
  double state(DType t) const { return t == DType::kBF16 ? bf16_state : fp32_state; }
};
struct Worst {
  double out = 0, state = 0, checkpoints = 0;
};

// Compares `got` with the reference's `ref` for call c (gtest expectations), and
// returns the worst errors.
inline Worst compare(const Call& c, const Results& got, const Results& ref, const Bars& bars) {
  const HostProblem& p = c.p;
  const int64_t N = p.N, per = c.per_state(), row = p.HV * p.V;
  Worst w;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t begin = p.cu_seqlens.empty() ? n * p.T : p.cu_seqlens[n];
    const int64_t end = p.cu_seqlens.empty() ? (n + 1) * p.T : p.cu_seqlens[n + 1];
    const std::vector<float> x = bf16_vector_to_float(
        std::vector<uint16_t>(got.out.begin() + begin * row, got.out.begin() + end * row));
    const std::vector<float> y = bf16_vector_to_float(
        std::vector<uint16_t>(ref.out.begin() + begin * row, ref.out.begin() + end * row));
    const double e = rel_rms(x, y);
    w.out = std::max(w.out, e);
    EXPECT_LE(e, bars.out) << "out of sequence " << n;
  }
  if (!c.pool && p.spec.final_state != DType::kNone) {
    const size_t es = c.esize(p.spec.final_state);
    for (int64_t n = 0; n < N; ++n) {
      const double e = state_error(got.fin, ref.fin, static_cast<size_t>(n * per) * es, per, p.spec.final_state);
      w.state = std::max(w.state, e);
      EXPECT_LE(e, bars.state(p.spec.final_state)) << "final state of sequence " << n;
    }
  }
  if (c.pool) {
    // Slots written (a sequence's own, slot checkpoints') within the bars; every
    // other byte of the pool (other slots, the slots' padding) as it was.
    const size_t es = c.esize(c.pool_dtype);
    std::vector<bool> written(static_cast<size_t>(c.pool_size), false);
    for (int64_t s : c.slots)
      if (s >= 0) written[s] = true;
    for (size_t i = 0; i < c.slot_ck_slots.size(); ++i)
      if (c.slot_ck_slots[i] >= 0 && c.slot_ck_offsets[i] >= 0) written[c.slot_ck_slots[i]] = true;
    for (int64_t s = 0; s < c.pool_size; ++s) {
      const size_t at = static_cast<size_t>(s * c.pool_stride) * es;
      const size_t owned = written[s] ? static_cast<size_t>(per) * es : 0;
      if (written[s]) {
        const double e = state_error(got.pool, ref.pool, at, per, c.pool_dtype);
        w.state = std::max(w.state, e);
        EXPECT_LE(e, bars.state(c.pool_dtype)) << "pool slot " << s;
      }
      EXPECT_EQ(0, std::memcmp(got.pool.data() + at + owned, c.pool_bytes.data() + at + owned,
                               static_cast<size_t>(c.pool_stride) * es - owned))
          << "pool slot " << s << ": bytes no sequence owns changed";
    }
  }
  if (c.interval > 0) {
    const size_t es = c.esize(c.ck_dtype);
    for (int64_t j = 0; j < c.entries; ++j) {
      const double e = state_error(got.ck, ref.ck, static_cast<size_t>(j * per) * es, per, c.ck_dtype);
      w.checkpoints = std::max(w.checkpoints, e);
      EXPECT_LE(e, bars.state(c.ck_dtype)) << "checkpoint entry " << j;
    }
    const size_t used = static_cast<size_t>(c.entries * per) * es;
    EXPECT_TRUE(std::all_of(got.ck.begin() + used, got.ck.end(), [](uint8_t x) { return x == kUntouched; }))
        << "spare checkpoint entries changed";
  }
  return w;
}

}  // namespace flashkda::testing::random_calls
