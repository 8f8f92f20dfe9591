// How many chunks a segment of the segment scan gets (spec section 6): the rule
// the host's launch plan applies where it knows the lengths or assumes them
// (sm90_forward.cu, choose_segment_chunks), and the device applies to the
// lengths of a varlen batch whose boundaries only the device holds
// (prologue_kernel.cuh, plan_segments_on_device). One rule in one place: the two
// must choose alike for the same lengths.
//
// Pass 1 runs 2·R 4-warp CTAs per segment and head (value rows B, key rows M;
// R = K / 64 CTAs per state), except R for the first segment (it runs for real).
// G is the most segments whose pass 1 fills one wave of kSegmentCtasPerSm CTAs
// on every SM.
//   Pass 3 by chains: the last segment needs no summary, and pass 3 walks each
//   segment but the first again, so a chain is about 2·C/G: heads · (2R·G_total
//   − 3R·N) <= the wave, and a sequence that would get fewer than 3 segments
//   gains nothing (pass 3 of segment 1 waits for all of segment 0), so then no
//   sequence is cut.
//   Outputs by superposition (calls without checkpoints): pass 1 also summarises
//   the last segment and out follows token-parallel, so a chain is C/G_s steps,
//   with heads · (2R·G_s − R·N) <= the wave: one or two segments fewer than above
//   at a few heads, about as many at one head.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHKDA_HOST_DEVICE __host__ __device__
#else
#define FLASHKDA_HOST_DEVICE
#endif

namespace flashkda::sm90 {

constexpr int64_t kSegmentCtasPerSm = 2;  // 4-warp recurrence CTAs resident on an SM (4 stages)
// Shorter segments lose: at T = 1024 (64 chunks) H = 12 and 24 ran 2-35 %
// slower split into segments of 6-22 chunks than as one chain (H200,
// docs/perf-log.md): the prologue, the extra launches and the composition cost
// more than the shorter chain saves.
constexpr int64_t kMinSegmentChunks = 32;
constexpr int64_t kMinSegmentsPerChain = 3;
constexpr int64_t kMinSuperposedSegmentsPerChain = 2;

// Segments of `seg` chunks that a sequence of `c` chunks gets: one where it is
// not cut (an empty sequence still has one, from its initial to its final state).
FLASHKDA_HOST_DEVICE inline int64_t segments_of(int64_t c, int64_t seg) { return c > seg ? (c + seg - 1) / seg : 1; }
// Whether the composition walks a sequence of `segments` segments: from two with
// outputs by superposition (it also forms the final state), from three by chains
// (with two, S_in(1) is segment 0's own final state).
FLASHKDA_HOST_DEVICE inline bool composed(int64_t segments, bool superposed) {
  return segments >= (superposed ? 2 : 3);
}

// What the rule looks at. `longest`: the longest sequence's chunks (known, or
// assumed: equal lengths, or one sequence holding them all).
struct SegmentRule {
  int64_t seqs = 0;
  int64_t heads = 0;
  int64_t row_parts = 2;  // R
  int64_t total_chunks = 0;
  int64_t longest = 0;
  bool superposable = false;
  int64_t wave = 0;  // kSegmentCtasPerSm · SMs

  // CTAs of R that the first (and, by chains, the last) segments need fewer.
  FLASHKDA_HOST_DEVICE int64_t first_saving() const { return superposable ? 1 : 3; }
  FLASHKDA_HOST_DEVICE int64_t min_segments() const {
    return superposable ? kMinSuperposedSegmentsPerChain : kMinSegmentsPerChain;
  }
  // Pass 1's CTAs per head of one sequence of c chunks that segments of `seg`
  // chunks cut (0: it runs whole, R CTAs, and finishes in its own time).
  FLASHKDA_HOST_DEVICE int64_t cut_ctas(int64_t c, int64_t seg) const {
    return c > seg ? 2 * row_parts * ((c + seg - 1) / seg) - first_saving() * row_parts : 0;
  }
  // The count that spreads the wave over every sequence, as if all were cut
  // alike; 0: no cut. Several sequences: sequence n gets ceil(C_n / seg) <=
  // C_n / seg + 1 segments, so seg >= total / (segments − N) keeps them within
  // `segments` whatever the lengths.
  FLASHKDA_HOST_DEVICE int64_t spread_chunks() const {
    const int64_t segments = (wave + first_saving() * row_parts * seqs * heads) / (2 * row_parts * heads);
    if (segments <= seqs) return 0;
    const int64_t parts = seqs == 1 ? segments : segments - seqs;
    const int64_t seg = (total_chunks + parts - 1) / parts;
    return seg > kMinSegmentChunks ? seg : kMinSegmentChunks;
  }
};

// The rule. `cut_ctas(seg)`: pass 1's CTAs of the sequences segments of `seg`
// chunks cut, over the known lengths, all heads; lengths_known false: assumed
// equal, no such sum. In a serving batch of one long prefill among short ones
// the spread count left the long one's pass 1 alone overflowing the wave, and
// its second wave cost a whole segment more: at H = 48 one 8000-token sequence
// among 3 or 15 of 64 tokens ran 0.78 / 0.98 ms split against 0.72 / 0.76 ms in
// one pass (docs/perf-log.md). So the longest sequence gets fewer, longer
// segments until the cut sequences' pass 1 fits the wave; none if it then has
// too few. The CTAs only grow with the longest's segment count G (every
// sequence's segments are as many or more), so the most G that fits is found by
// bisection: O(N log G) for batches of many sequences too.
template <class CutCtas>
FLASHKDA_HOST_DEVICE int64_t segment_chunks(const SegmentRule& r, bool lengths_known, const CutCtas& cut_ctas) {
  if (r.seqs <= 0 || r.heads <= 0 || r.total_chunks <= 0) return 0;
  int64_t seg = r.spread_chunks();
  if (seg == 0) return 0;
  if (lengths_known && cut_ctas(seg) > r.wave) {
    const int64_t longest = r.longest;
    int64_t lo = r.min_segments() - 1, hi = (longest + seg - 1) / seg;  // fits at lo (or none), not at hi
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (cut_ctas((longest + mid - 1) / mid) <= r.wave) lo = mid;
      else hi = mid;
    }
    if (lo < r.min_segments()) return 0;
    seg = (longest + lo - 1) / lo;
  }
  if (r.longest < r.min_segments() * seg - (seg - 1)) return 0;
  return seg;
}

// The segments for a plan whose kind is fixed (outputs superposed, or pass 3 by
// chains), as the launch plan chooses them (choose_launch_plan): none unless
// pass 3 by chains would cut (at T = 1024 two segments superposed measured
// slower than one chain), then, superposed, the superposed count where it cuts.
// `cut_ctas(rule, seg)`: as above, for that rule's kind.
template <class CutCtas>
FLASHKDA_HOST_DEVICE int64_t segment_chunks_of_kind(SegmentRule r, bool superposed, const CutCtas& cut_ctas) {
  r.superposable = false;
  const int64_t chains = segment_chunks(r, true, [&](int64_t seg) { return cut_ctas(r, seg); });
  if (chains == 0 || !superposed) return chains;
  r.superposable = true;
  const int64_t by_superposition = segment_chunks(r, true, [&](int64_t seg) { return cut_ctas(r, seg); });
  return by_superposition > 0 ? by_superposition : chains;
}

// What a cut costs against one pass: a model in chunk steps (one step of a
// CTA's chain, ~0.8-0.9 µs with two 4-warp CTAs an SM, H200). The rule above
// asks only whether pass 1 fits a wave. In a batch of one long sequence among
// many short ones the short ones' CTAs already fill the GPU beside the long
// chain, and a cut adds the composition and pass 3 (or the output kernel) after
// them: with the host's lengths, 4 of 14 such batches ran 1.1-1.25x the time of
// one pass cut (12 and 24 heads, docs/perf-log.md). So a plan cuts only where
// the model says it is faster than one pass.
//   A launch takes its longest chain or its CTAs' steps spread over the wave,
// whichever is longer; a CTA's steps are its chunks plus kCtaSetUpSteps (its
// state in and out, its pipeline's fill: the 1,536 CTAs of at most 4 chunks of
// 12/1x2000+63x64's segment 0s took ~61 µs, ~5.8 waves of ~10.5 µs each).
//   One pass: R CTAs per (sequence, head), chains of C_n steps.
//   Cut: pass 1 (a cut sequence's segment 0 as R CTAs, its later segments as
// 2R; by chains the last segment waits for pass 3), the composition
// (kCompositionSteps: 15-28 µs measured on these batches), then pass 3 (R CTAs
// per later segment, chains of seg steps) or the output kernel
// (kOutputChunkHeadsPerStepAndRowPart chunk-heads of 64 rows a step).
constexpr int64_t kCtaSetUpSteps = 8;
constexpr int64_t kCompositionSteps = 20;
constexpr int64_t kOutputChunkHeadsPerStepAndRowPart = 300;
// The model is optimistic about the cut: on the measured batches the cut ran
// 1.17-1.46x the time the model gave it against one pass (12/varlen6 model 0.78,
// measured 0.91; 12/3x3000+40x64 0.98 and 1.15; 24/1x8000+15x64 0.60 and 0.88). So
// a cut must be modelled at most 9/10 of one pass. Every cut that won measured is
// at 0.79 or less; of 16 batch shapes at 1-64 heads only 12/3x3000+40x64 (and,
// unmeasured, 8/4x2048 at 0.97) move to one pass.
constexpr int64_t kCutMarginNum = 9, kCutMarginDen = 10;

// `sum(f)`: f(C_n) summed over the batch's sequences of C_n chunks.
template <class Sum>
FLASHKDA_HOST_DEVICE bool cut_pays(const SegmentRule& r, int64_t seg, bool superposed, const Sum& sum) {
  if (seg <= 0) return false;
  const int64_t R = r.row_parts, o = kCtaSetUpSteps;
  auto spread = [&](int64_t cta_steps) { return (cta_steps * r.heads + r.wave - 1) / r.wave; };
  auto longer = [](int64_t a, int64_t b) { return a > b ? a : b; };
  const int64_t whole = longer(r.longest, spread((r.total_chunks + o * r.seqs) * R));
  const int64_t pass1 = sum([&](int64_t c) -> int64_t {
    if (c <= seg) return (c + o) * R;
    const int64_t later = (c + seg - 1) / seg - 1;
    const int64_t summarised = superposed ? c - seg + o * later : (later - 1) * (seg + o);
    return (seg + o) * R + summarised * 2 * R;
  });
  int64_t after = 0;
  if (superposed) {
    const int64_t chunks = sum([&](int64_t c) -> int64_t { return c > seg ? c - seg : 0; });
    after = (chunks * r.heads * R + kOutputChunkHeadsPerStepAndRowPart - 1) / kOutputChunkHeadsPerStepAndRowPart;
  } else {
    after = longer(seg, spread(sum([&](int64_t c) -> int64_t {
                     return c > seg ? (c - seg + o * ((c + seg - 1) / seg - 1)) * R : 0;
                   })));
  }
  const int64_t cut = longer(seg, spread(pass1)) + kCompositionSteps + after;
  return cut * kCutMarginDen < whole * kCutMarginNum;
}

// A segment of the device's plan is this many of the host's pieces (the host
// launched the segment scan for pieces of seg_chunks chunks, the finest any
// lengths would need): ceil(seg / piece), never fewer than one piece, and
// kWholeSequences where the rule cuts nothing.
constexpr int32_t kWholeSequences = 1 << 30;
FLASHKDA_HOST_DEVICE inline int32_t pieces_per_segment(int64_t seg, int64_t piece) {
  if (seg <= 0) return kWholeSequences;
  const int64_t m = (seg + piece - 1) / piece;
  return static_cast<int32_t>(m < 1 ? 1 : m);
}

// The device's choice for a batch whose longest sequence has `longest` chunks:
// as above, and kWholeSequences unless whole pieces still give the longest as
// many whole segments as the launched kind needs to gain (two superposed, three
// by chains). Rounded up, the rule's segments can leave too short a remainder:
// at 24 heads, 1 x 4000 + 60 x 64 tokens took 84-chunk segments up to 123
// (123 + 123 + 4 chunks by chains, a chain of ~246 steps against 250) and ran
// 0.48 ms against 0.36 in one pass (docs/perf-log.md).
FLASHKDA_HOST_DEVICE inline int32_t device_segment_pieces(int64_t seg, int64_t piece, int64_t longest,
                                                          bool superposed) {
  const int32_t m = pieces_per_segment(seg, piece);
  if (m == kWholeSequences) return m;
  const int64_t min_segments = superposed ? kMinSuperposedSegmentsPerChain : kMinSegmentsPerChain;
  return longest >= min_segments * m * piece ? m : kWholeSequences;
}

// What the device's set-up CTA runs (plan_segments_on_device) for a batch of
// these lengths (`sum`, as for cut_pays): the rule's segments for the launched
// kind, in whole pieces (device_segment_pieces), where the cut is faster than
// one pass (cut_pays).
template <class CutCtas, class Sum>
FLASHKDA_HOST_DEVICE int32_t device_plan_pieces(const SegmentRule& r, bool superposed, int64_t piece,
                                                const CutCtas& cut_ctas, const Sum& sum) {
  const int64_t seg = segment_chunks_of_kind(r, superposed, cut_ctas);
  const int32_t m = device_segment_pieces(seg, piece, r.longest, superposed);
  return m != kWholeSequences && cut_pays(r, m * piece, superposed, sum) ? m : kWholeSequences;
}

}  // namespace flashkda::sm90
