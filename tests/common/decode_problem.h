// Random decode steps: N sequences with a few tokens each, states in a pool
// with padding slots and permuted indices. Shared by the CPU and GPU decode tests
// and the decode benchmark.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "flashkda/flashkda.h"

namespace flashkda::testing {

struct DecodeSpec {
  int64_t num_seqs = 4;
  int64_t tokens_per_seq = 1;
  std::vector<int64_t> seq_tokens;  // non-empty: per-sequence token counts (cu_seqlens)
  int64_t heads = 2;
  int64_t v_heads = 0;
  int64_t head_dim = 128;
  DType state_dtype = DType::kFP32;
  int64_t extra_slots = 3;      // pool slots no sequence uses (must stay untouched)
  int64_t padding_entries = 0;  // sequences whose index is -1
  bool int64_indices = false;
  bool per_token_states = false;
};

struct DecodeProblem {
  DecodeSpec spec;
  int64_t N = 0, T = 0, H = 0, HV = 0, K = 0, V = 0, pool_size = 0, per_slot = 0;
  std::vector<uint16_t> q, k, v, g, beta;
  std::vector<float> A_log, dt_bias;
  std::vector<int64_t> cu_seqlens;  // empty for uniform tokens
  std::vector<int32_t> idx32;
  std::vector<int64_t> idx64;
  std::vector<float> pool_f32;      // the pool, as floats (bf16-exact when the dtype is bf16)
  float scale = 0.f;

  int64_t index(int64_t n) const { return spec.int64_indices ? idx64[n] : idx32[n]; }

  // Pool contents in the pool's dtype, as raw bytes.
  std::vector<uint8_t> pool_bytes() const {
    const size_t es = spec.state_dtype == DType::kFP32 ? 4 : 2;
    std::vector<uint8_t> b(pool_f32.size() * es);
    for (size_t i = 0; i < pool_f32.size(); ++i) {
      if (es == 4) {
        std::memcpy(&b[4 * i], &pool_f32[i], 4);
      } else {
        const uint16_t h = float_to_bf16(pool_f32[i]);
        std::memcpy(&b[2 * i], &h, 2);
      }
    }
    return b;
  }

  DecodeArgs args(void* out, void* pool, void* per_token) const {
    DecodeArgs a;
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.g = g.data(); a.beta = beta.data();
    a.A_log = A_log.data(); a.dt_bias = dt_bias.data(); a.out = out;
    a.num_seqs = N;
    a.total_tokens = T;
    if (!cu_seqlens.empty()) {
      a.cu_seqlens = cu_seqlens.data();
      a.cu_seqlens_host = cu_seqlens.data();
    } else {
      a.tokens_per_seq = spec.tokens_per_seq;
    }
    a.state_pool = pool;
    a.state_dtype = spec.state_dtype;
    a.pool_size = pool_size;
    a.state_indices = spec.int64_indices ? static_cast<const void*>(idx64.data()) : idx32.data();
    a.index_type = spec.int64_indices ? IndexType::kInt64 : IndexType::kInt32;
    a.per_token_states = per_token;
    a.num_heads = H; a.num_v_heads = HV; a.head_dim_k = K; a.head_dim_v = V;
    a.scale = scale;
    a.lower_bound = -5.f;
    return a;
  }
};

// A pool (or per-token states) given as raw bytes of dtype t, as floats.
inline std::vector<float> state_bytes_to_float(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<float> f(bytes.size() / (t == DType::kFP32 ? 4 : 2));
  for (size_t i = 0; i < f.size(); ++i) {
    if (t == DType::kFP32) {
      std::memcpy(&f[i], &bytes[4 * i], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      f[i] = bf16_to_float(h);
    }
  }
  return f;
}

inline DecodeProblem make_decode_problem(const DecodeSpec& spec, uint64_t seed) {
  DecodeProblem p;
  p.spec = spec;
  p.H = spec.heads;
  p.HV = spec.v_heads > 0 ? spec.v_heads : spec.heads;
  p.K = p.V = spec.head_dim;
  p.N = spec.seq_tokens.empty() ? spec.num_seqs : static_cast<int64_t>(spec.seq_tokens.size());
  if (!spec.seq_tokens.empty()) {
    p.cu_seqlens.push_back(0);
    for (int64_t t : spec.seq_tokens) p.cu_seqlens.push_back(p.cu_seqlens.back() + t);
    p.T = p.cu_seqlens.back();
  } else {
    p.T = p.N * spec.tokens_per_seq;
  }
  p.scale = 1.f / std::sqrt(static_cast<float>(p.K));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  auto fill = [&](std::vector<uint16_t>& x, int64_t n) {
    x.resize(static_cast<size_t>(n));
    for (auto& e : x) e = float_to_bf16(normal(rng));
  };
  fill(p.q, p.T * p.H * p.K);
  fill(p.k, p.T * p.H * p.K);
  fill(p.v, p.T * p.HV * p.V);
  fill(p.g, p.T * p.HV * p.K);
  fill(p.beta, p.T * p.HV);
  p.A_log.resize(static_cast<size_t>(p.HV));
  for (auto& e : p.A_log) e = uniform(rng);
  p.dt_bias.resize(static_cast<size_t>(p.HV * p.K));
  for (auto& e : p.dt_bias) e = uniform(rng);

  // Slots: a random permutation over N + extra, the first `padding_entries`
  // sequences marked -1.
  p.pool_size = p.N + spec.extra_slots;
  std::vector<int64_t> slots(static_cast<size_t>(p.pool_size));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  p.idx32.resize(static_cast<size_t>(p.N));
  p.idx64.resize(static_cast<size_t>(p.N));
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t s = n < spec.padding_entries ? -1 : slots[static_cast<size_t>(n)];
    p.idx32[n] = static_cast<int32_t>(s);
    p.idx64[n] = s;
  }
  p.per_slot = p.HV * p.V * p.K;
  p.pool_f32.resize(static_cast<size_t>(p.pool_size * p.per_slot));
  for (auto& e : p.pool_f32) {
    e = 0.1f * normal(rng);
    if (spec.state_dtype == DType::kBF16) e = round_to_bf16(e);
  }
  return p;
}

// The problem's token tensors as views of one fused projection output: [T, width]
// rows holding q | k | v | g | beta, each tensor's heads `pad` elements apart beyond
// their rows, NaN wherever nothing is (a read of padding shows). `at` is where
// each tensor starts in a row; the strides are DecodeArgs' (*_token_stride = width).
struct FusedTokenViews {
  std::vector<uint16_t> data;
  int64_t width = 0, pad = 0, at[5] = {};
  // Sets a's token tensors to these views over `base` (the data, here or on a device).
  void apply(DecodeArgs& a, const uint16_t* base, const DecodeProblem& p) const {
    a.q = base + at[0]; a.k = base + at[1]; a.v = base + at[2]; a.g = base + at[3]; a.beta = base + at[4];
    a.q_token_stride = a.k_token_stride = a.v_token_stride = a.g_token_stride = a.beta_token_stride = width;
    a.q_head_stride = a.k_head_stride = a.g_head_stride = p.K + pad;
    a.v_head_stride = p.V + pad;
    a.beta_head_stride = 1 + pad;
  }
};
inline FusedTokenViews fused_token_views(const DecodeProblem& p, int64_t pad) {
  FusedTokenViews f;
  f.pad = pad;
  const struct {
    const std::vector<uint16_t>* dense;
    int64_t heads, width;
  } parts[] = {{&p.q, p.H, p.K}, {&p.k, p.H, p.K}, {&p.v, p.HV, p.V}, {&p.g, p.HV, p.K}, {&p.beta, p.HV, 1}};
  for (int i = 0; i < 5; ++i) {
    f.at[i] = f.width;
    f.width += parts[i].heads * (parts[i].width + pad);
  }
  f.data.assign(static_cast<size_t>(p.T * f.width), 0x7fc1);
  for (int i = 0; i < 5; ++i)
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t h = 0; h < parts[i].heads; ++h)
        for (int64_t e = 0; e < parts[i].width; ++e)
          f.data[static_cast<size_t>(t * f.width + f.at[i] + h * (parts[i].width + pad) + e)] =
              (*parts[i].dense)[static_cast<size_t>((t * parts[i].heads + h) * parts[i].width + e)];
  return f;
}

}  // namespace flashkda::testing
