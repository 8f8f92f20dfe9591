// The CPU backends. Arguments reaching them have passed flashkda::validate();
// every pointer is a host pointer.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "flashkda/flashkda.h"

namespace flashkda::cpu {

// Where value row i, key j of one (sequence, value head) state lies in its block
// of initial_state / final_state: [V, K], or [K, V] with states_key_major.
inline int64_t state_element(const ForwardArgs& a, int64_t i, int64_t j) {
  return a.states_key_major ? j * a.head_dim_v + i : i * a.head_dim_k + j;
}
// f(i, at) for value rows [row_begin, row_end) and every key j: i = row·K + j, the
// element's place in a [V, K] block, and at = state_element(a, row, j), its place
// in the caller's state block.
template <class F>
void for_each_state_element(const ForwardArgs& a, int64_t row_begin, int64_t row_end, F&& f) {
  for (int64_t e = row_begin; e < row_end; ++e)
    for (int64_t j = 0; j < a.head_dim_k; ++j) f(e * a.head_dim_k + j, state_element(a, e, j));
}

// The oracle: the token-by-token recurrence of the contract in float64.
// `out_unrounded` (optional, host, same shape as out): also receives out before
// its bf16 rounding, so that backends are judged against the oracle itself
// (spec section 2) and not against a second rounding of it. `threads` <= 0: one
// per hardware thread; the result is the same bits whatever the count.
Status reference_forward_f64(const ForwardArgs& args, float* out_unrounded = nullptr, int threads = 0);

// The chunk-16 algorithm in fp32 with the kernels' decomposition (base-2 exponents,
// L and Mqk, the inverse by forward substitution, the WY form), parallel over
// (sequence, value head). num_threads <= 0: std::thread::hardware_concurrency().
// `out_unrounded` as for the oracle: out before its bf16 rounding.
// steps: kPairs runs two chunks a step (the pair step, chunked_f32.cpp: one product
// with the state and one update per 32 tokens), the twin of a kernel step that would
// halve the chain of dependent steps; a sequence's odd last chunk runs alone. No
// checkpoints with kPairs (their stops fall between the chunks of a pair).
enum class ChunkSteps { kSingle, kPairs };
Status chunked_forward_f32(const ForwardArgs& args, int num_threads = 0, float* out_unrounded = nullptr,
                           ChunkSteps steps = ChunkSteps::kSingle);

// The affine segment scan's twin (spec section 6). For one value head, a run of
// tokens maps the incoming state to S_out = S_in·M + B, M [K, K], B [V, K]
// (row-major, float64): B is the run's final state from a zero state, M the final
// state of the same recurrence on K rows started from the identity with v = 0.
// Consecutive runs compose as (M1, B1)∘(M2, B2) = (M1·M2, B1·M2 + B2).
struct SegmentSummary {
  int64_t K = 0, V = 0;
  std::vector<double> M, B;
};
// A run's outputs are affine in its incoming state too: token t's out row is
//   o_t = o⁰_t + S_in · P_t
// with o⁰ the outputs from a zero state (B's run, [tokens][V]) and P_t [K] the
// outputs of M's run (K rows from the identity, v = 0): row r of P is what row r
// of S_in contributes. The GPU's segment scan computes both in pass 1 and forms
// the outputs once S_in is known, without a second chain (docs/design.md).
struct SegmentOutputs {
  int64_t K = 0, V = 0, tokens = 0;
  std::vector<double> out0, P;  // [tokens][V], [tokens][K]; scale included
};
// o⁰_t + S_in · P_t for every token of the run: [tokens][V].
std::vector<double> superpose(const SegmentOutputs& o, const std::vector<double>& S_in);
// Tokens [token_begin, token_end) of the flattened [B·T] axis (within one
// sequence), value head hv, in float64 with the oracle's steps; with `outputs`,
// also the run's o⁰ and P (above).
SegmentSummary segment_summary_f64(const ForwardArgs& args, int64_t token_begin, int64_t token_end, int64_t hv,
                                   SegmentOutputs* outputs = nullptr);
SegmentSummary compose(const SegmentSummary& first, const SegmentSummary& second);
// S_in·M + B for a [V, K] state.
std::vector<double> apply(const SegmentSummary& s, const std::vector<double>& S_in);

// The forward on a state pool (ForwardArgs::state_pool) for the CPU backends:
// gathers each sequence's slot into a dense initial state (zero without a slot
// or a state), calls `run` on dense states, scatters the final states back to
// their slots (state_pool.cpp).
Status forward_on_pool(const ForwardArgs& args, const std::function<Status(const ForwardArgs&)>& run);

// flashkda::segment_summaries and compose_summaries on the CPU backends
// (segment_summaries.cpp): the oracle's steps per (segment, value head), or two
// chunked fp32 runs per segment; compositions summed in float64.
Status segment_summaries_f64(const SegmentSummaryArgs& args, int num_threads = 0);
Status segment_summaries_chunked_f32(const SegmentSummaryArgs& args, int num_threads = 0);
Status compose_summaries_f64(const ComposeSummariesArgs& args, int num_threads = 0);

// Decode (flashkda::decode on the CPU backends): the token recurrence in float64
// on each sequence's pooled state, written back in place or to the out pool.
Status decode_f64(const DecodeArgs& args);

// INV = (I + L)^{-1} for a strictly lower-triangular 16x16 L (row-major), by
// fp32 forward substitution: exact to fp32 rounding for every |L_ij| <= 1. The
// kernel's warp-0 inverse (src/sm90/kernel/unit_lower_inverse.cuh) is the same algorithm.
void unit_lower_inverse_16(const float* L, float* inv);

}  // namespace flashkda::cpu
