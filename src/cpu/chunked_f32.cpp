// The chunk-16 algorithm of spec section 3 in fp32: the GPU kernel's slow twin.
//
// The steps are named as in the spec and in the kernel so that an intermediate of
// the kernel can be compared against the one computed here:
//
//   token-parallel (per chunk, no state):
//     prepare_chunk   q̂, k̂ (fp32 L2 norm), γ (base-2 log decay: the safe gate or
//                     the given one), G (prefix sum),
//                     K_dec, Q_dec, K_inv, K_res, b
//     form_L_Mqk      L = strictly_lower(b ⊙ K_dec K_invᵀ), Mqk = lower_incl(Q_dec K_invᵀ)
//                     (form_L_Mqk_pairwise for a chunk whose decay passes 2^-116,
//                     where K_inv = k̂·2^-G would overflow: common/gate.h)
//     unit_lower_inverse_16   INV = (I + L)^{-1} by forward substitution
//     wy_operands     A_w = INV·diag(b); w = A_w K_dec; u = A_w V
//   sequential (per chunk, with the state S [V, K]):
//     recurrence_step U = u − w Sᵀ; out = Q_dec Sᵀ + Mqk U; S = S·diag(2^G_last) + Uᵀ K_res
//   or per pair of chunks (ChunkSteps::kPairs):
//     pair_records    the pair's token-parallel operands (Y, Z, the scaled w, Q_dec, K_res)
//     pair_step       one product with S and one update for both chunks
//
// Pad rows of a partial last chunk are zero everywhere (q̂ = k̂ = v = b = γ = 0),
// so they add nothing to L, Mqk, w, u, U or S; their `out` rows are not stored.
// Parallel over (sequence, value head) pairs with a small std::thread pool.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/bf16.h"
#include "common/gate.h"
#include "common/sequences.h"
#include "cpu/checkpoints.h"
#include "cpu/cpu_backends.h"
#include "cpu/parallel.h"

namespace flashkda::cpu {
namespace {

constexpr int kChunk = 16;

// C[m][n] (+)= A[m][kk] · B[kk][n], all row-major fp32. Tiny and plain on purpose.
void matmul(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t kk,
            bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    float* c = C + i * n;
    if (!accumulate) std::fill(c, c + n, 0.f);
    for (int64_t p = 0; p < kk; ++p) {
      const float a = A[i * kk + p];
      const float* b = B + p * n;
      for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}

// Per-chunk scratch of one worker: everything the kernel keeps in smem/registers.
struct ChunkScratch {
  int64_t K = 0, V = 0;
  std::vector<float> q_hat, k_hat;          // [16, K]
  std::vector<float> gamma, G;              // [16, K], base 2
  std::vector<float> K_dec, Q_dec, K_inv, K_res;  // [16, K]
  std::vector<float> G_last;                // [K]
  std::vector<float> vals;                  // [16, V]
  float b[kChunk] = {};
  float L[kChunk * kChunk] = {}, Mqk[kChunk * kChunk] = {};
  float INV[kChunk * kChunk] = {}, A_w[kChunk * kChunk] = {};
  std::vector<float> w;                     // [16, K]
  std::vector<float> u, U, o;               // [16, V]
  std::vector<float> decay_last;            // [K] = 2^G_last
  std::vector<float> pair_exponent;         // [K], form_L_Mqk_pairwise's running sums
  // Some G of the chunk is below -kMaxChunkDecayLog2 (common/gate.h): L, Mqk and
  // K_res are formed pairwise from γ (form_L_Mqk_pairwise) and K_inv is not formed.
  bool wide = false;

  ChunkScratch(int64_t k, int64_t v) : K(k), V(v) {
    for (auto* x : {&q_hat, &k_hat, &gamma, &G, &K_dec, &Q_dec, &K_inv, &K_res, &w})
      x->assign(static_cast<size_t>(kChunk * K), 0.f);
    G_last.assign(static_cast<size_t>(K), 0.f);
    decay_last.assign(static_cast<size_t>(K), 0.f);
    pair_exponent.assign(static_cast<size_t>(K), 0.f);
    for (auto* x : {&vals, &u, &U, &o}) x->assign(static_cast<size_t>(kChunk * V), 0.f);
  }
};

// Token-parallel part 1: normalisation, gate, decays, b. Rows >= n_c are zero.
void prepare_chunk(const ForwardArgs& args, int64_t t0, int n_c, int64_t h, int64_t hv,
                   ChunkScratch& c) {
  const int64_t H = args.num_heads, HV = value_heads(args), K = c.K, V = c.V;
  const auto* q = static_cast<const uint16_t*>(args.q);
  const auto* k = static_cast<const uint16_t*>(args.k);
  const auto* v = static_cast<const uint16_t*>(args.v);
  const bool log_decay = args.gate_form == GateForm::kLogDecay;
  // The safe gate's per-head operands (A_log and dt_bias may be null with a log decay).
  const float A = log_decay ? 0.f : clamp_gate_scale(std::exp(args.A_log[hv]));  // as kCuda's prologue
  const float* dt_bias = log_decay ? nullptr : args.dt_bias + hv * K;
  const float lb2 = args.lower_bound * kLog2e;  // log2(e) folded into lower_bound

  for (int i = 0; i < kChunk; ++i) {
    float* qh = c.q_hat.data() + i * K;
    float* kh = c.k_hat.data() + i * K;
    float* gm = c.gamma.data() + i * K;
    float* vr = c.vals.data() + i * V;
    if (i >= n_c) {  // pad row: touches nothing
      std::fill(qh, qh + K, 0.f);
      std::fill(kh, kh + K, 0.f);
      std::fill(gm, gm + K, 0.f);
      std::fill(vr, vr + V, 0.f);
      c.b[i] = 0.f;
      continue;
    }
    const int64_t t = t0 + i;
    const uint16_t* qt = q + (t * H + h) * K;
    const uint16_t* kt = k + (t * H + h) * K;
    const int64_t gt = (t * HV + hv) * K;  // g's first element of this row (g_dtype)
    const uint16_t* vt = v + (t * HV + hv) * V;
    // The squared norms in double: in fp32 a row of norm above ~1.8e19 (a bf16 row
    // can reach 3.4e38·sqrt(K)) overflows to inf, and the row would read as zero.
    double qss = 0.0, kss = 0.0;
    for (int64_t d = 0; d < K; ++d) {
      qh[d] = bf16_to_float(qt[d]);
      kh[d] = bf16_to_float(kt[d]);
      qss += static_cast<double>(qh[d]) * qh[d];
      kss += static_cast<double>(kh[d]) * kh[d];
    }
    const float qinv = static_cast<float>(1.0 / std::sqrt(qss + 1e-6));
    const float kinv = static_cast<float>(1.0 / std::sqrt(kss + 1e-6));
    for (int64_t d = 0; d < K; ++d) {
      qh[d] *= qinv;
      kh[d] *= kinv;
      const float g = load_gate_input(args.g, args.g_dtype, gt + d);
      gm[d] = log_decay ? log_decay_log2(g) : safe_gate(g, dt_bias[d], A, lb2);
    }
    for (int64_t e = 0; e < V; ++e) vr[e] = bf16_to_float(vt[e]);
    c.b[i] = beta_coefficient(load_gate_input(args.beta, args.beta_dtype, t * HV + hv), args.beta_is_probability);
  }

  // G = inclusive prefix sum of γ over rows; G_last = G of the last real row.
  c.wide = false;
  for (int64_t d = 0; d < K; ++d) {
    float acc = 0.f;
    for (int i = 0; i < kChunk; ++i) {
      acc += c.gamma[i * K + d];
      c.G[i * K + d] = acc;
      c.wide = c.wide || acc < -kMaxChunkDecayLog2;
    }
    c.G_last[d] = c.G[(n_c - 1) * K + d];
    c.decay_last[d] = std::exp2(c.G_last[d]);
  }

  // 2^G <= 1 and 2^(G_last - G) <= 1 in any chunk; 2^-G only where |G| <= 116.
  const float scale = args.scale;
  for (int i = 0; i < kChunk; ++i) {
    for (int64_t d = 0; d < K; ++d) {
      const int64_t x = i * K + d;
      const float Gi = c.G[x];
      const float kh = c.k_hat[x];
      c.K_dec[x] = kh * std::exp2(Gi);
      c.Q_dec[x] = scale * c.q_hat[x] * std::exp2(Gi);
      if (c.wide) continue;  // K_res: form_L_Mqk_pairwise
      c.K_inv[x] = kh * std::exp2(-Gi);
      c.K_res[x] = kh * std::exp2(c.G_last[d] - Gi);
    }
  }
}

// Token-parallel part 2: L_ij = b_i (K_dec_i · K_inv_j) for i > j; Mqk_ij = Q_dec_i · K_inv_j, i >= j.
void form_L_Mqk(ChunkScratch& c) {
  const int64_t K = c.K;
  for (int i = 0; i < kChunk; ++i) {
    for (int j = 0; j < kChunk; ++j) {
      float l = 0.f, m = 0.f;
      if (j <= i) {
        const float* ki = c.K_dec.data() + i * K;
        const float* qi = c.Q_dec.data() + i * K;
        const float* kj = c.K_inv.data() + j * K;
        for (int64_t d = 0; d < K; ++d) {
          m += qi[d] * kj[d];
          if (j < i) l += ki[d] * kj[d];
        }
        l *= c.b[i];
      }
      c.L[i * kChunk + j] = j < i ? l : 0.f;
      c.Mqk[i * kChunk + j] = m;
    }
  }
}

// Part 2 for a wide chunk (c.wide), where 2^-G overflows: with D_ij = 2^(G_i - G_j)
// on each channel (the decay from row j to row i, <= 1 for i >= j),
//   L_ij = b_i Σ_d k̂_id k̂_jd D_ij,d (i > j);  Mqk_ij = scale Σ_d q̂_id k̂_jd D_ij,d (i >= j);
//   K_res_j = k̂_j 2^(G_last - G_j).
// Each exponent G_i - G_j is formed as the sum of γ over rows j+1..i, not as the
// difference of the prefix sums: once strong decays have taken G to -8000, the
// prefix sums hold the later rows' mild γ only to their ulp (2^-11), and a γ of
// -inf (a decay of exactly 0) would give -inf - (-inf) = NaN; the sum of the rows
// between is the exponent to fp32 rounding, and -inf where the decay is 0.
void form_L_Mqk_pairwise(ChunkScratch& c, float scale) {
  const int64_t K = c.K;
  std::vector<float>& exponent = c.pair_exponent;  // [K]: Σ γ over rows j+1..i
  for (int j = 0; j < kChunk; ++j) {
    const float* kj = c.k_hat.data() + j * K;
    std::fill(exponent.begin(), exponent.end(), 0.f);
    for (int i = 0; i < j; ++i) {
      c.L[i * kChunk + j] = 0.f;
      c.Mqk[i * kChunk + j] = 0.f;
    }
    for (int i = j; i < kChunk; ++i) {
      const float* gi = c.gamma.data() + i * K;
      const float* ki = c.k_hat.data() + i * K;
      const float* qi = c.q_hat.data() + i * K;
      float l = 0.f, m = 0.f;
      for (int64_t d = 0; d < K; ++d) {
        if (i > j) exponent[d] += gi[d];
        const float decay = std::exp2(exponent[d]);
        m += qi[d] * kj[d] * decay;
        l += ki[d] * kj[d] * decay;
      }
      c.L[i * kChunk + j] = i > j ? c.b[i] * l : 0.f;
      c.Mqk[i * kChunk + j] = scale * m;
    }
  }
  // K_res_j = k̂_j 2^(Σ γ over rows j+1..15), from the last row up (pad rows add γ = 0).
  std::fill(exponent.begin(), exponent.end(), 0.f);
  for (int j = kChunk - 1; j >= 0; --j)
    for (int64_t d = 0; d < K; ++d) {
      c.K_res[j * K + d] = c.k_hat[j * K + d] * std::exp2(exponent[d]);
      exponent[d] += c.gamma[j * K + d];
    }
}

// Token-parallel part 3: A_w = INV·diag(b); w = A_w K_dec [16, K]; u = A_w V [16, V].
void wy_operands(ChunkScratch& c) {
  for (int i = 0; i < kChunk; ++i)
    for (int j = 0; j < kChunk; ++j) c.A_w[i * kChunk + j] = c.INV[i * kChunk + j] * c.b[j];
  matmul(c.A_w, c.K_dec.data(), c.w.data(), kChunk, c.K, kChunk, false);
  matmul(c.A_w, c.vals.data(), c.u.data(), kChunk, c.V, kChunk, false);
}

// The sequential part, with the incoming state S [V, K] (updated in place):
//   U = u − w Sᵀ;  out = Q_dec Sᵀ + Mqk U;  S = S·diag(2^G_last) + Uᵀ K_res.
void recurrence_step(ChunkScratch& c, float* S) {
  const int64_t K = c.K, V = c.V;
  // w Sᵀ and Q_dec Sᵀ: [16, K] × [K, V].
  for (int i = 0; i < kChunk; ++i) {
    const float* wi = c.w.data() + i * K;
    const float* qi = c.Q_dec.data() + i * K;
    for (int64_t e = 0; e < V; ++e) {
      const float* Se = S + e * K;
      float ws = 0.f, qs = 0.f;
      for (int64_t d = 0; d < K; ++d) {
        ws += wi[d] * Se[d];
        qs += qi[d] * Se[d];
      }
      c.U[i * V + e] = c.u[i * V + e] - ws;
      c.o[i * V + e] = qs;
    }
  }
  // out += Mqk U.
  matmul(c.Mqk, c.U.data(), c.o.data(), kChunk, V, kChunk, true);
  // S = S·diag(2^G_last) + Uᵀ K_res.
  const std::vector<float>& decay = c.decay_last;
  for (int64_t e = 0; e < V; ++e) {
    float* Se = S + e * K;
    for (int64_t d = 0; d < K; ++d) Se[d] *= decay[d];
    for (int i = 0; i < kChunk; ++i) {
      const float ui = c.U[i * V + e];
      const float* kr = c.K_res.data() + i * K;
      for (int64_t d = 0; d < K; ++d) Se[d] += ui * kr[d];
    }
  }
}

// Two consecutive chunks A, B of a sequence as one step. With D = diag(2^G_last) and
// R = K_res of each chunk, S_A = S·D_A + U_Aᵀ R_A enters chunk B, so
//   U_B = u_B − (w_B D_A) Sᵀ − Y U_A          Y = w_B R_Aᵀ      [16, 16]
//   o_B = (Q_B D_A) Sᵀ + Z U_A + Mqk_B U_B     Z = Q_dec_B R_Aᵀ  [16, 16]
//   S   = S·D_A D_B + U_Aᵀ (R_A D_B) + U_Bᵀ R_B
// and chunk A's U_A and o_A are the single step's. S enters through one product with
// 64 token rows [w_A; Q_A; w_B D_A; Q_B D_A] and leaves through one update with 32:
// half the dependent steps of the single chunks. Every new factor is a decay (<= 1)
// times the chunks' own bounded operands, so no exponent leaves the single chunk's range.
struct PairScratch {
  std::vector<float> wq;    // [64, K]: w_A, Q_dec_A, w_B·d_A, Q_dec_B·d_A
  std::vector<float> kres;  // [32, K]: K_res_A·d_B, K_res_B
  std::vector<float> decay;  // [K]: d_A·d_B
  std::vector<float> P;      // [64, V]: wq Sᵀ
  std::vector<float> yu;     // [16, V]: Y U_A
  float Y[kChunk * kChunk] = {}, Z[kChunk * kChunk] = {};

  PairScratch(int64_t K, int64_t V) {
    wq.assign(static_cast<size_t>(4 * kChunk * K), 0.f);
    kres.assign(static_cast<size_t>(2 * kChunk * K), 0.f);
    decay.assign(static_cast<size_t>(K), 0.f);
    P.assign(static_cast<size_t>(4 * kChunk * V), 0.f);
    yu.assign(static_cast<size_t>(kChunk * V), 0.f);
  }
};

// The pair's token-parallel operands (the contents of a pair record).
void pair_records(const ChunkScratch& a, const ChunkScratch& b, PairScratch& pr) {
  const int64_t K = a.K;
  for (int64_t d = 0; d < K; ++d) pr.decay[d] = a.decay_last[d] * b.decay_last[d];
  for (int i = 0; i < kChunk; ++i) {
    for (int64_t d = 0; d < K; ++d) {
      const float d_a = a.decay_last[d], d_b = b.decay_last[d];
      pr.wq[(0 * kChunk + i) * K + d] = a.w[i * K + d];
      pr.wq[(1 * kChunk + i) * K + d] = a.Q_dec[i * K + d];
      pr.wq[(2 * kChunk + i) * K + d] = b.w[i * K + d] * d_a;
      pr.wq[(3 * kChunk + i) * K + d] = b.Q_dec[i * K + d] * d_a;
      pr.kres[(0 * kChunk + i) * K + d] = a.K_res[i * K + d] * d_b;
      pr.kres[(1 * kChunk + i) * K + d] = b.K_res[i * K + d];
    }
    for (int j = 0; j < kChunk; ++j) {
      float y = 0.f, z = 0.f;
      for (int64_t d = 0; d < K; ++d) {
        y += b.w[i * K + d] * a.K_res[j * K + d];
        z += b.Q_dec[i * K + d] * a.K_res[j * K + d];
      }
      pr.Y[i * kChunk + j] = y;
      pr.Z[i * kChunk + j] = z;
    }
  }
}

// The sequential part of a pair: a.o and b.o get the chunks' outputs, S is updated in place.
void pair_step(ChunkScratch& a, ChunkScratch& b, PairScratch& pr, float* S) {
  const int64_t K = a.K, V = a.V;
  // P = [w_A; Q_A; w_B d_A; Q_B d_A] Sᵀ: [64, K] × [K, V].
  for (int r = 0; r < 4 * kChunk; ++r) {
    const float* x = pr.wq.data() + r * K;
    for (int64_t e = 0; e < V; ++e) {
      const float* Se = S + e * K;
      float acc = 0.f;
      for (int64_t d = 0; d < K; ++d) acc += x[d] * Se[d];
      pr.P[r * V + e] = acc;
    }
  }
  const float* wAS = pr.P.data();
  const float* qAS = pr.P.data() + kChunk * V;
  const float* wBS = pr.P.data() + 2 * kChunk * V;
  const float* qBS = pr.P.data() + 3 * kChunk * V;
  // Chunk A as in the single step.
  for (int64_t x = 0; x < kChunk * V; ++x) {
    a.U[x] = a.u[x] - wAS[x];
    a.o[x] = qAS[x];
  }
  matmul(a.Mqk, a.U.data(), a.o.data(), kChunk, V, kChunk, true);
  // Chunk B from S and U_A: U_B = u_B − (w_B d_A) Sᵀ − Y U_A; o_B = (Q_B d_A) Sᵀ + Z U_A + Mqk_B U_B.
  for (int64_t x = 0; x < kChunk * V; ++x) {
    b.U[x] = b.u[x] - wBS[x];
    b.o[x] = qBS[x];
  }
  matmul(pr.Y, a.U.data(), pr.yu.data(), kChunk, V, kChunk, false);
  for (int64_t x = 0; x < kChunk * V; ++x) b.U[x] -= pr.yu[x];
  matmul(pr.Z, a.U.data(), b.o.data(), kChunk, V, kChunk, true);
  matmul(b.Mqk, b.U.data(), b.o.data(), kChunk, V, kChunk, true);
  // S = S·diag(d_A d_B) + U_Aᵀ (K_res_A d_B) + U_Bᵀ K_res_B.
  for (int64_t e = 0; e < V; ++e) {
    float* Se = S + e * K;
    for (int64_t d = 0; d < K; ++d) Se[d] *= pr.decay[d];
    for (int i = 0; i < 2 * kChunk; ++i) {
      const float ui = i < kChunk ? a.U[i * V + e] : b.U[(i - kChunk) * V + e];
      const float* kr = pr.kres.data() + i * K;
      for (int64_t d = 0; d < K; ++d) Se[d] += ui * kr[d];
    }
  }
}

// The token-parallel part of one chunk: everything but the state.
void chunk_operands(const ForwardArgs& args, int64_t t0, int n_c, int64_t h, int64_t hv, ChunkScratch& c) {
  prepare_chunk(args, t0, n_c, h, hv, c);
  if (c.wide) form_L_Mqk_pairwise(c, args.scale);
  else form_L_Mqk(c);
  unit_lower_inverse_16(c.L, c.INV);
  wy_operands(c);
}

// Per worker: the chunks' scratch (two for a pair), the pair's, and the state.
struct Worker {
  ChunkScratch a, b;
  PairScratch pair;
  std::vector<float> S;
  Worker(int64_t K, int64_t V) : a(K, V), b(K, V), pair(K, V) {}
};

// checkpoint0: sequence n's first checkpoint entry (used when args.checkpoints is set).
void chunked_one(const ForwardArgs& args, const SequenceSpan& span, int64_t n, int64_t hv, int64_t checkpoint0,
                 ChunkSteps steps, Worker& wk, float* out_unrounded) {
  ChunkScratch& c = wk.a;
  std::vector<float>& S = wk.S;
  const int64_t H = args.num_heads, HV = value_heads(args), K = c.K, V = c.V;
  const int64_t h = hv / (HV / H);
  auto* out = static_cast<uint16_t*>(args.out);

  S.assign(static_cast<size_t>(V * K), 0.f);
  const int64_t state_off = (n * HV + hv) * V * K;
  // The caller's state ([V, K], or [K, V] with states_key_major), element by element.
  auto each_element = [&](auto&& f) { for_each_state_element(args, 0, V, f); };
  if (args.initial_state != nullptr && args.initial_state_dtype == DType::kFP32) {
    const float* s0 = static_cast<const float*>(args.initial_state) + state_off;
    each_element([&](int64_t i, int64_t at) { S[i] = s0[at]; });
  } else if (args.initial_state != nullptr && args.initial_state_dtype == DType::kBF16) {
    const uint16_t* s0 = static_cast<const uint16_t*>(args.initial_state) + state_off;
    each_element([&](int64_t i, int64_t at) { S[i] = bf16_to_float(s0[at]); });
  }

  auto write_out = [&](const ChunkScratch& x, int64_t t0, int n_c) {
    for (int i = 0; i < n_c; ++i) {
      uint16_t* ot = out + ((t0 + i) * HV + hv) * V;
      for (int64_t e = 0; e < V; ++e) ot[e] = float_to_bf16(x.o[i * V + e]);
      if (out_unrounded != nullptr)
        std::copy_n(x.o.begin() + i * V, V, out_unrounded + ((t0 + i) * HV + hv) * V);
    }
  };
  for (int64_t c0 = 0; c0 < span.length;) {
    // The interval is a multiple of the chunk: a checkpoint falls on a chunk boundary.
    if (args.checkpoints != nullptr && c0 % args.checkpoint_interval == 0)
      write_checkpoint(args, checkpoint0 + c0 / args.checkpoint_interval, hv, S.data());
    const int n_c = static_cast<int>(std::min<int64_t>(kChunk, span.length - c0));
    const int64_t t0 = span.token_begin + c0;
    chunk_operands(args, t0, n_c, h, hv, c);
    if (steps == ChunkSteps::kPairs && c0 + kChunk < span.length) {  // a whole chunk A and a chunk B
      const int n_b = static_cast<int>(std::min<int64_t>(kChunk, span.length - c0 - kChunk));
      chunk_operands(args, t0 + kChunk, n_b, h, hv, wk.b);
      pair_records(c, wk.b, wk.pair);
      pair_step(c, wk.b, wk.pair, S.data());
      write_out(c, t0, n_c);
      write_out(wk.b, t0 + kChunk, n_b);
      c0 += 2 * kChunk;
      continue;
    }
    recurrence_step(c, S.data());
    write_out(c, t0, n_c);
    c0 += kChunk;
  }

  if (args.final_state != nullptr && args.final_state_dtype == DType::kFP32) {
    float* s1 = static_cast<float*>(args.final_state) + state_off;
    each_element([&](int64_t i, int64_t at) { s1[at] = S[i]; });
  } else if (args.final_state != nullptr && args.final_state_dtype == DType::kBF16) {
    uint16_t* s1 = static_cast<uint16_t*>(args.final_state) + state_off;
    each_element([&](int64_t i, int64_t at) { s1[at] = float_to_bf16(S[i]); });
  }
}

}  // namespace

void unit_lower_inverse_16(const float* L, float* inv) {
  constexpr int C = kChunk;
  // Column by column, right-looking: once x_p is final, subtract its multiple from
  // every later row. Each entry is a plain fp32 dot product of bounded terms, so
  // the result is exact to fp32 rounding (times the inverse's own condition) for
  // any |L_ij| <= 1; the product (I − L)(I + L²)(I + L⁴)(I + L⁸) it replaced
  // went through powers of L up to 6435 and lost three digits on near-collinear keys.
  for (int j = 0; j < C; ++j) {
    float x[C] = {};
    x[j] = 1.f;
    for (int p = j; p < C; ++p)
      for (int i = p + 1; i < C; ++i) x[i] -= L[i * C + p] * x[p];
    for (int i = 0; i < C; ++i) inv[i * C + j] = x[i];
  }
}

Status chunked_forward_f32(const ForwardArgs& args, int num_threads, float* out_unrounded, ChunkSteps steps) {
  const int64_t H = args.num_heads;
  const int64_t HV = value_heads(args);
  const int64_t K = args.head_dim_k, V = args.head_dim_v;
  if (H <= 0 || HV <= 0 || HV % H != 0 || K <= 0 || V <= 0)
    return Status::Invalid("chunked_forward_f32: bad head counts or head dims");
  if (steps == ChunkSteps::kPairs && args.checkpoints != nullptr)
    return Status::Invalid("chunked_forward_f32: pair steps take no checkpoints (a stop may fall inside a pair)");
  const std::vector<SequenceSpan> spans = sequence_spans(args, args.cu_seqlens);
  const std::vector<int64_t> checkpoint0 =
      args.checkpoints != nullptr ? checkpoint_offsets(spans, args.checkpoint_interval)
                                  : std::vector<int64_t>(spans.size() + 1, 0);

  // Tasks = (sequence, value head) pairs, longest sequences first.
  std::vector<std::pair<int64_t, int64_t>> tasks;
  tasks.reserve(spans.size() * static_cast<size_t>(HV));
  for (int64_t n = 0; n < static_cast<int64_t>(spans.size()); ++n)
    for (int64_t hv = 0; hv < HV; ++hv) tasks.emplace_back(n, hv);
  std::stable_sort(tasks.begin(), tasks.end(), [&](const auto& a, const auto& b) {
    return spans[a.first].length > spans[b.first].length;
  });

  parallel_for(
      static_cast<int64_t>(tasks.size()), num_threads,
      [&] { return Worker(K, V); },
      [&](Worker& local, int64_t i) {
        const auto [n, hv] = tasks[static_cast<size_t>(i)];
        chunked_one(args, spans[static_cast<size_t>(n)], n, hv, checkpoint0[static_cast<size_t>(n)], steps, local,
                    out_unrounded);
      });
  return Status::Ok();
}

}  // namespace flashkda::cpu
