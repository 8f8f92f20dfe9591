// The oracle: the token-by-token KDA recurrence of the contract (spec section 1)
// in float64 on the bf16 inputs. Deliberately literal: one token at a time, the
// six steps of the contract in order, no algebraic rearrangement.
//
// Parallel over (sequence, value head) pairs, and over blocks of a pair's state
// rows when there are fewer pairs than threads (one long head): every row of the
// state evolves on its own given the token's inputs (steps 4-6 below touch row e
// and v[e] only), so a block repeats steps 1-3 for its tokens and computes exactly
// what the whole pair would for its rows. Every task owns disjoint slices of
// `out`, `final_state` and the checkpoints. Also the twin of the affine segment
// scan (spec section 6): a run of tokens as the map S_in ↦ S_in·M + B.
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

// Steps 1-3 of the contract for token t of value head hv: q̂, k̂ (L2 normalised,
// eps inside the root), the decay exp(a) and b (common/gate.h: the gate and beta
// in the forms ForwardArgs says they come in).
struct TokenInputs {
  std::vector<double> qn, kn, decay;
  double b = 0;
};

void token_inputs(const ForwardArgs& args, int64_t t, int64_t hv, TokenInputs& x) {
  const int64_t H = args.num_heads;
  const int64_t HV = value_heads(args);
  const int64_t K = args.head_dim_k;
  const int64_t h = hv / (HV / H);  // q/k head of this value head (GVA)
  const uint16_t* qt = static_cast<const uint16_t*>(args.q) + (t * H + h) * K;
  const uint16_t* kt = static_cast<const uint16_t*>(args.k) + (t * H + h) * K;
  const int64_t gt = (t * HV + hv) * K;  // g's first element of this row (g_dtype)
  x.qn.resize(static_cast<size_t>(K));
  x.kn.resize(static_cast<size_t>(K));
  x.decay.resize(static_cast<size_t>(K));
  // 1. L2 normalisation, eps inside the root.
  double qss = 0, kss = 0;
  for (int64_t d = 0; d < K; ++d) {
    x.qn[d] = bf16_to_float(qt[d]);
    x.kn[d] = bf16_to_float(kt[d]);
    qss += x.qn[d] * x.qn[d];
    kss += x.kn[d] * x.kn[d];
  }
  const double qinv = 1.0 / std::sqrt(qss + 1e-6);
  const double kinv = 1.0 / std::sqrt(kss + 1e-6);
  for (int64_t d = 0; d < K; ++d) {
    x.qn[d] *= qinv;
    x.kn[d] *= kinv;
  }
  // 2. Gate: a = lower_bound · sigmoid(exp(A_log) · (g + dt_bias)), or a = g given
  // as the log decay (A_log and dt_bias may then be null); decay = exp(a).
  if (args.gate_form == GateForm::kLogDecay) {
    for (int64_t d = 0; d < K; ++d)
      x.decay[d] = std::exp(static_cast<double>(load_gate_input(args.g, args.g_dtype, gt + d)));
  } else {
    const double A = clamp_gate_scale(std::exp(static_cast<double>(args.A_log[hv])));
    const float* dt_bias = args.dt_bias + hv * K;
    for (int64_t d = 0; d < K; ++d) {
      const double g = load_gate_input(args.g, args.g_dtype, gt + d);
      x.decay[d] = std::exp(safe_gate<double>(g, dt_bias[d], A, args.lower_bound));
    }
  }
  // 3. b = sigmoid(beta), or beta itself when given as the probability.
  x.b = beta_coefficient<double>(load_gate_input(args.beta, args.beta_dtype, t * HV + hv), args.beta_is_probability);
}

// Steps 4-5 on row `row` of a state (K columns) with value v_e:
// row ← row · diag(exp(a)); row ← row + b (v_e − row·k̂) k̂.
void update_row(double* row, int64_t K, const TokenInputs& x, double v_e) {
  for (int64_t d = 0; d < K; ++d) row[d] *= x.decay[d];
  double sk = 0;
  for (int64_t d = 0; d < K; ++d) sk += row[d] * x.kn[d];
  const double coef = x.b * (v_e - sk);
  for (int64_t d = 0; d < K; ++d) row[d] += coef * x.kn[d];
}

// row · q̂ (the output of a state row, before the scale).
double row_dot_q(const double* row, int64_t K, const TokenInputs& x) {
  double o = 0;
  for (int64_t d = 0; d < K; ++d) o += row[d] * x.qn[d];
  return o;
}

// Rows [row_begin, row_end) of one (sequence, value head): the recurrence over
// the tokens of `span`. checkpoint0: sequence n's first checkpoint entry (used
// when args.checkpoints is set).
void reference_one(const ForwardArgs& args, const SequenceSpan& span, int64_t n, int64_t hv, int64_t checkpoint0,
                   int64_t row_begin, int64_t row_end, float* out_unrounded) {
  const int64_t HV = value_heads(args);
  const int64_t K = args.head_dim_k;
  const int64_t V = args.head_dim_v;
  const auto* v = static_cast<const uint16_t*>(args.v);
  auto* out = static_cast<uint16_t*>(args.out);

  // S [V][K], value-first, starts at initial_state[n][hv] (or zero); only the
  // rows [row_begin, row_end) are read, updated and written.
  std::vector<double> S(static_cast<size_t>(V * K), 0.0);
  const int64_t state_off = (n * HV + hv) * V * K;
  // The rows' elements of the caller's state ([V, K], or [K, V] with states_key_major).
  auto each_element = [&](auto&& f) { for_each_state_element(args, row_begin, row_end, f); };
  if (args.initial_state != nullptr && args.initial_state_dtype == DType::kFP32) {
    const float* s0 = static_cast<const float*>(args.initial_state) + state_off;
    each_element([&](int64_t i, int64_t at) { S[i] = s0[at]; });
  } else if (args.initial_state != nullptr && args.initial_state_dtype == DType::kBF16) {
    const uint16_t* s0 = static_cast<const uint16_t*>(args.initial_state) + state_off;
    each_element([&](int64_t i, int64_t at) { S[i] = bf16_to_float(s0[at]); });
  }

  const double scale = args.scale;
  TokenInputs x;
  for (int64_t t = span.token_begin; t < span.token_begin + span.length; ++t) {
    const int64_t done = t - span.token_begin;  // tokens of this sequence already in S
    if (args.checkpoints != nullptr && done % args.checkpoint_interval == 0)
      write_checkpoint(args, checkpoint0 + done / args.checkpoint_interval, hv, S.data(), row_begin, row_end);
    token_inputs(args, t, hv, x);
    const uint16_t* vt = v + (t * HV + hv) * V;
    uint16_t* ot = out + (t * HV + hv) * V;
    for (int64_t e = row_begin; e < row_end; ++e) {
      double* row = S.data() + e * K;
      // 4-5. Decay, then the delta-rule write of row e.
      update_row(row, K, x, bf16_to_float(vt[e]));
      // 6. o = scale · S q̂ with the updated state.
      const double o = row_dot_q(row, K, x);
      ot[e] = float_to_bf16(static_cast<float>(scale * o));
      if (out_unrounded != nullptr) out_unrounded[(t * HV + hv) * V + e] = static_cast<float>(scale * o);
    }
  }

  if (args.final_state != nullptr && args.final_state_dtype == DType::kFP32) {
    float* s1 = static_cast<float*>(args.final_state) + state_off;
    each_element([&](int64_t i, int64_t at) { s1[at] = static_cast<float>(S[i]); });
  } else if (args.final_state != nullptr && args.final_state_dtype == DType::kBF16) {
    uint16_t* s1 = static_cast<uint16_t*>(args.final_state) + state_off;
    each_element([&](int64_t i, int64_t at) { s1[at] = float_to_bf16(static_cast<float>(S[i])); });
  }
}

}  // namespace

Status reference_forward_f64(const ForwardArgs& args, float* out_unrounded, int threads) {
  const int64_t H = args.num_heads;
  const int64_t HV = value_heads(args);
  if (H <= 0 || HV <= 0 || HV % H != 0 || args.head_dim_k <= 0 || args.head_dim_v <= 0)
    return Status::Invalid("reference_forward_f64: bad head counts or head dims");
  const std::vector<SequenceSpan> spans = sequence_spans(args, args.cu_seqlens);
  const int64_t pairs = static_cast<int64_t>(spans.size()) * HV;
  const std::vector<int64_t> checkpoint0 =
      args.checkpoints != nullptr ? checkpoint_offsets(spans, args.checkpoint_interval)
                                  : std::vector<int64_t>(spans.size() + 1, 0);
  // Row blocks only where the pairs alone leave threads idle; a block of at
  // least kMinBlockRows rows, since each block repeats steps 1-3 (2K exp a token).
  constexpr int64_t kMinBlockRows = 8;
  const int64_t V = args.head_dim_v;
  const int64_t workers = worker_threads(threads);
  const int64_t blocks = pairs == 0 || pairs >= workers
                             ? 1
                             : std::min((workers + pairs - 1) / pairs, std::max<int64_t>(1, V / kMinBlockRows));
  const int64_t rows_per_block = (V + blocks - 1) / blocks;

  // Longest sequences are not reordered: the oracle is about clarity, and the
  // tasks are handed out one at a time, which balances well enough.
  parallel_for(pairs * blocks, static_cast<int>(workers), [&](int64_t i) {
    const int64_t pair = i / blocks, block = i % blocks;
    const int64_t row_begin = block * rows_per_block, row_end = std::min(V, row_begin + rows_per_block);
    if (row_begin >= row_end) return;
    reference_one(args, spans[static_cast<size_t>(pair / HV)], pair / HV, pair % HV,
                  checkpoint0[static_cast<size_t>(pair / HV)], row_begin, row_end, out_unrounded);
  });
  return Status::Ok();
}

SegmentSummary segment_summary_f64(const ForwardArgs& args, int64_t token_begin, int64_t token_end, int64_t hv,
                                  SegmentOutputs* outputs) {
  const int64_t K = args.head_dim_k, V = args.head_dim_v, HV = value_heads(args);
  const auto* v = static_cast<const uint16_t*>(args.v);
  SegmentSummary s;
  s.K = K;
  s.V = V;
  s.M.assign(static_cast<size_t>(K * K), 0.0);
  s.B.assign(static_cast<size_t>(V * K), 0.0);
  for (int64_t r = 0; r < K; ++r) s.M[static_cast<size_t>(r * K + r)] = 1.0;
  if (outputs != nullptr) {
    outputs->K = K;
    outputs->V = V;
    outputs->tokens = token_end - token_begin;
    outputs->out0.assign(static_cast<size_t>(outputs->tokens * V), 0.0);
    outputs->P.assign(static_cast<size_t>(outputs->tokens * K), 0.0);
  }
  // B: the recurrence from a zero state; M: the same recurrence on K rows started
  // from the identity, with v = 0 (S_in · M is then what the tokens do to S_in).
  // Their rows' outputs, each taken after the row's update, are o⁰ and P.
  const double scale = args.scale;
  TokenInputs x;
  for (int64_t t = token_begin; t < token_end; ++t) {
    token_inputs(args, t, hv, x);
    const uint16_t* vt = v + (t * HV + hv) * V;
    const int64_t i = t - token_begin;
    for (int64_t e = 0; e < V; ++e) {
      double* row = s.B.data() + e * K;
      update_row(row, K, x, bf16_to_float(vt[e]));
      if (outputs != nullptr) outputs->out0[static_cast<size_t>(i * V + e)] = scale * row_dot_q(row, K, x);
    }
    for (int64_t r = 0; r < K; ++r) {
      double* row = s.M.data() + r * K;
      update_row(row, K, x, 0.0);
      if (outputs != nullptr) outputs->P[static_cast<size_t>(i * K + r)] = scale * row_dot_q(row, K, x);
    }
  }
  return s;
}

std::vector<double> superpose(const SegmentOutputs& o, const std::vector<double>& S_in) {
  std::vector<double> out = o.out0;
  for (int64_t t = 0; t < o.tokens; ++t)
    for (int64_t i = 0; i < o.V; ++i) {
      double s = 0;
      for (int64_t r = 0; r < o.K; ++r)
        s += S_in[static_cast<size_t>(i * o.K + r)] * o.P[static_cast<size_t>(t * o.K + r)];
      out[static_cast<size_t>(t * o.V + i)] += s;
    }
  return out;
}

SegmentSummary compose(const SegmentSummary& first, const SegmentSummary& second) {
  const int64_t K = first.K, V = first.V;
  SegmentSummary c;
  c.K = K;
  c.V = V;
  c.M.assign(static_cast<size_t>(K * K), 0.0);
  c.B = second.B;
  // M = M1 M2 and B = B1 M2 + B2, row by row.
  for (int64_t i = 0; i < K; ++i)
    for (int64_t p = 0; p < K; ++p) {
      const double a = first.M[static_cast<size_t>(i * K + p)];
      for (int64_t j = 0; j < K; ++j) c.M[static_cast<size_t>(i * K + j)] += a * second.M[static_cast<size_t>(p * K + j)];
    }
  for (int64_t i = 0; i < V; ++i)
    for (int64_t p = 0; p < K; ++p) {
      const double a = first.B[static_cast<size_t>(i * K + p)];
      for (int64_t j = 0; j < K; ++j) c.B[static_cast<size_t>(i * K + j)] += a * second.M[static_cast<size_t>(p * K + j)];
    }
  return c;
}

std::vector<double> apply(const SegmentSummary& s, const std::vector<double>& S_in) {
  const int64_t K = s.K, V = s.V;
  std::vector<double> S_out = s.B;
  for (int64_t i = 0; i < V; ++i)
    for (int64_t p = 0; p < K; ++p) {
      const double a = S_in[static_cast<size_t>(i * K + p)];
      for (int64_t j = 0; j < K; ++j) S_out[static_cast<size_t>(i * K + j)] += a * s.M[static_cast<size_t>(p * K + j)];
    }
  return S_out;
}

}  // namespace flashkda::cpu
