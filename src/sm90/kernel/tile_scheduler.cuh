// Who works on what.
//   Prologue kernel: one CTA per (chunk slot, value head).
//   Recurrence kernel, one pass: one CTA per (sequence, value head, V-slice),
//   a varlen batch's sequences longest first (order_sequences_longest_first).
//   Recurrence kernel, segment scan (docs/design.md): one CTA per (segment
//   slot, value head, 64-row slice of the state rows that pass computes).
//
// Chunk slots index the workspace records without a host pass over cu_seqlens:
// chunk c of sequence n has slot n + floor(begin(n)/16) + c. Slots are distinct
// (the next sequence's first slot is at least one past this one's last, since
// ceil(L/16) <= floor(L/16) + 1) and below N + ceil(T/16), T the total tokens;
// a few slots belong to no chunk and their CTAs exit at once.
//
// cu_seqlens values live on the device and are not checked on the host: every
// kernel reads them through sequence_span, which clamps a sequence to
// 0 <= begin <= end <= T. With clamped bounds the slot arithmetic above stays
// inside the workspace and every token index inside the tensors, whatever the
// values; the prologue kernel records a violation (device_faults.h).
#pragma once
#include <cstdint>

#include "sm90/kernel/block_scan.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/segment_plan.h"

namespace flashkda::sm90 {

__host__ __device__ inline int64_t num_chunk_slots(int64_t num_seqs, int64_t total_tokens) {
  return num_seqs + (total_tokens + kChunk - 1) / kChunk;
}

// Sequence n's tokens [begin, end), clamped (see above).
__device__ __forceinline__ ClampedSpan sequence_span(const FwdParams& p, int64_t n) {
  if (p.cu_seqlens != nullptr) return clamped_span(p.cu_seqlens, n, p.num_seqs, p.total_tokens);
  if (p.cu_seqlens32 != nullptr) return clamped_span(p.cu_seqlens32, n, p.num_seqs, p.total_tokens);
  return {n * p.seqlen, (n + 1) * p.seqlen, true};
}
__device__ __forceinline__ int64_t seq_begin(const FwdParams& p, int64_t n) {
  if (p.cu_seqlens != nullptr) return clamp_offset(p.cu_seqlens[n], 0, p.total_tokens);
  if (p.cu_seqlens32 != nullptr) return clamp_offset(p.cu_seqlens32[n], 0, p.total_tokens);
  return n * p.seqlen;
}
__device__ __forceinline__ int64_t first_slot(const FwdParams& p, int64_t n) {
  return n + seq_begin(p, n) / kChunk;
}

__device__ __forceinline__ const ChunkOperands* chunk_record(const FwdParams& p, int64_t slot, int v_head) {
  return static_cast<const ChunkOperands*>(p.chunk_records) + slot * p.num_v_heads + v_head;
}

struct ChunkTile {
  bool valid;
  int64_t token_begin;  // first token of the chunk (flattened B*T index)
  int rows;             // real tokens in the chunk, 1..16
};

// The chunk of `slot`: the last sequence whose first slot is <= slot (binary
// search; first_slot is non-decreasing in n).
__device__ __forceinline__ ChunkTile locate_chunk(const FwdParams& p, int64_t slot) {
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (first_slot(p, mid) <= slot) lo = mid;
    else hi = mid - 1;
  }
  const ClampedSpan span = sequence_span(p, lo);
  const int64_t begin = span.begin, len = span.end - span.begin;
  const int64_t c = slot - (lo + begin / kChunk);
  ChunkTile t;
  t.valid = c >= 0 && c * kChunk < len;
  t.token_begin = begin + c * kChunk;
  const int64_t rem = len - c * kChunk;
  t.rows = static_cast<int>(rem < kChunk ? rem : kChunk);
  return t;
}

struct SequenceTile {
  int seq;          // n
  int v_head;       // hv
  int v_slice;      // which V / v_split rows of the state
  int64_t token_begin;
  int64_t length;
  int64_t first_slot;
};

// blockIdx.x = (seq · HV + hv) · v_split + slice: the CTAs of one (sequence,
// head) are neighbours, so they read its chunk records while L2 still has them.
__device__ __forceinline__ SequenceTile get_sequence_tile(const FwdParams& p) {
  SequenceTile w;
  const int64_t idx = blockIdx.x;
  w.v_slice = static_cast<int>(idx % p.v_split);
  const int64_t sh = idx / p.v_split;
  w.v_head = static_cast<int>(sh % p.num_v_heads);
  const int64_t rank = sh / p.num_v_heads;
  w.seq = p.seq_order != nullptr ? p.seq_order[rank] : static_cast<int>(rank);
  const ClampedSpan span = sequence_span(p, w.seq);
  w.token_begin = span.begin;
  w.length = span.end - span.begin;
  w.first_slot = w.seq + span.begin / kChunk;
  return w;
}

// The one-pass recurrence's CTAs start in blockIdx order, a wave at a time: in a
// varlen batch in sequence order, a long sequence late in the batch started
// after the short ones and ran alone at the end (H = 64, varlen-6, its 3063
// tokens last: the order below took 8 % off the call). So the prologue's first
// CTA orders the sequences longest first (a greedy longest-processing-time
// schedule) by chunk count, exactly below kOrderExactChunks and to 1/16 above
// it, and the recurrence's CTAs take their sequence from that order. Within a
// bin the places follow the atomics and may differ from call to call: they move
// when a CTA starts, never what it computes.
constexpr int kOrderExactChunks = 128;
constexpr int kOrderStepsPerOctave = 16;
constexpr int kOrderBins = 1024;  // 128 exact + 16 an octave from 2^7 to 2^62 chunks
constexpr int kOrderBinsPerLane = kOrderBins / 32;

__device__ __forceinline__ int order_bin(int64_t chunks) {
  if (chunks < kOrderExactChunks) return static_cast<int>(chunks);
  const int octave = 63 - __clzll(chunks);  // >= 7
  const int step = static_cast<int>((chunks >> (octave - 4)) & (kOrderStepsPerOctave - 1));
  const int bin = kOrderExactChunks + (octave - 7) * kOrderStepsPerOctave + step;
  return bin < kOrderBins ? bin : kOrderBins - 1;
}
__device__ __forceinline__ int sequence_order_bin(const FwdParams& p, int64_t n) {
  const ClampedSpan span = sequence_span(p, n);
  return order_bin((span.end - span.begin + kChunk - 1) / kChunk);
}

// A counting sort of the N sequences by bin, largest first, into p.seq_order,
// by the kThreads threads of one CTA; `bins`: kOrderBins ints of shared memory.
// Every sequence takes one place below N: a permutation, whatever cu_seqlens holds.
template <int kThreads>
__device__ __forceinline__ void order_sequences_longest_first(const FwdParams& p, int32_t* bins, int tid) {
  static_assert(kOrderBins % 32 == 0, "one warp scans the bins");
  for (int b = tid; b < kOrderBins; b += kThreads) bins[b] = 0;
  __syncthreads();
  for (int64_t n = tid; n < p.num_seqs; n += kThreads) atomicAdd(&bins[sequence_order_bin(p, n)], 1);
  __syncthreads();
  // Warp 0: bins[b] = the sequences in the bins above b. Lane l owns the
  // kOrderBinsPerLane bins from the top down, starting at kOrderBins − 1 − l·kOrderBinsPerLane.
  if (tid < 32) {
    const int top = kOrderBins - 1 - tid * kOrderBinsPerLane;
    int mine = 0;
    for (int i = 0; i < kOrderBinsPerLane; ++i) mine += bins[top - i];
    int above = mine;  // inclusive scan over the lanes, then exclusive
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int x = __shfl_up_sync(0xffffffffu, above, d);
      if (tid >= d) above += x;
    }
    above -= mine;
    for (int i = 0; i < kOrderBinsPerLane; ++i) {
      const int count = bins[top - i];
      bins[top - i] = above;
      above += count;
    }
  }
  __syncthreads();
  for (int64_t n = tid; n < p.num_seqs; n += kThreads)
    p.seq_order[atomicAdd(&bins[sequence_order_bin(p, n)], 1)] = static_cast<int32_t>(n);
}

// Segment slots index the segment states the way chunk slots index the records:
// piece j of sequence n, the j-th run of seg_chunks chunks, has slot n +
// floor(begin(n) / (16·seg_chunks)) + j, distinct, below N + ceil(T /
// (16·seg_chunks)), and inside that bound for any clamped cu_seqlens. A segment
// is `pieces` consecutive pieces (segment_pieces) and has the slot of its first.
// Every sequence has at least one segment (an empty one still takes its
// initial state to its final state).
__device__ __forceinline__ int64_t first_segment_slot(const FwdParams& p, int64_t n) {
  return n + seq_begin(p, n) / (kChunk * p.seg_chunks);
}
// Pieces a segment: a listed plan's (one but where the device chose,
// LaunchPlan::device_segments), else 1.
__device__ __forceinline__ int64_t segment_pieces(const FwdParams& p) {
  return p.seg_plan != nullptr ? p.seg_plan->pieces : 1;
}

struct SegmentTile {
  bool valid;
  int seq;
  int64_t index;        // j
  int64_t count;        // segments of the sequence, G >= 1
  int64_t slot;         // segment slot of j (its first piece's)
  int64_t pieces;       // pieces a segment: segment j − 1 has slot − pieces
  int64_t token_begin;  // first token of segment j
  int64_t length;       // its tokens
  int64_t first_chunk;  // of the sequence, segment j's first
  int64_t first_slot;   // chunk slot of its first chunk
};

__device__ __forceinline__ SegmentTile segment_of_sequence(const FwdParams& p, int64_t n, int64_t j, int64_t pieces) {
  const ClampedSpan span = sequence_span(p, n);
  const int64_t len = span.end - span.begin, chunks = (len + kChunk - 1) / kChunk;
  const int64_t seg = p.seg_chunks * pieces, seg_tokens = kChunk * seg;
  SegmentTile t;
  t.seq = static_cast<int>(n);
  t.count = segments_of(chunks, seg);
  t.index = j;
  t.valid = j >= 0 && j < t.count;
  t.slot = n + span.begin / (kChunk * p.seg_chunks) + j * pieces;
  t.pieces = pieces;
  t.token_begin = span.begin + j * seg_tokens;
  const int64_t rem = len - j * seg_tokens;
  t.length = rem < 0 ? 0 : (rem < seg_tokens ? rem : seg_tokens);
  t.first_chunk = j * seg;
  t.first_slot = n + span.begin / kChunk + t.first_chunk;
  return t;
}

// The segment of a segment slot where a segment is one piece (a plan without
// lists): of the last sequence whose first segment slot is <= slot.
__device__ __forceinline__ SegmentTile locate_segment(const FwdParams& p, int64_t slot) {
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (first_segment_slot(p, mid) <= slot) lo = mid;
    else hi = mid - 1;
  }
  return segment_of_sequence(p, lo, slot - first_segment_slot(p, lo), 1);
}

__device__ __forceinline__ int64_t sequence_chunks(const FwdParams& p, int64_t n) {
  const ClampedSpan span = sequence_span(p, n);
  return (span.end - span.begin + kChunk - 1) / kChunk;
}

// f(C_n) over the sequences' chunks C_n, summed (or the largest), on every
// thread of the kThreads of one CTA: a block-wide reduction. `scratch`:
// kThreads / 32 int64 of shared memory.
template <int kThreads, class F>
__device__ __forceinline__ int64_t reduce_over_sequences(const FwdParams& p, const F& f, bool largest,
                                                         int64_t* scratch, int tid) {
  constexpr int kWarps = kThreads / 32;
  auto join = [largest](int64_t a, int64_t b) { return largest ? (a > b ? a : b) : a + b; };
  int64_t x = 0;
  for (int n = tid; n < p.num_seqs; n += kThreads) x = join(x, f(sequence_chunks(p, n)));
#pragma unroll
  for (int d = 16; d > 0; d /= 2) x = join(x, __shfl_xor_sync(0xffffffffu, x, d));
  if ((tid & 31) == 0) scratch[tid >> 5] = x;
  __syncthreads();
  int64_t all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) all = join(all, scratch[w]);
  __syncthreads();  // scratch is rewritten by the next reduction
  return all;
}

// The rule's view of the batch on the device (SegmentRule, segment_plan.h).
__device__ __forceinline__ SegmentRule device_segment_rule(const FwdParams& p, int64_t total_chunks, int64_t longest) {
  SegmentRule rule;
  rule.seqs = p.num_seqs;
  rule.heads = p.num_v_heads;
  rule.row_parts = p.head_dim / 64;
  rule.total_chunks = total_chunks;
  rule.longest = longest;
  rule.wave = kSegmentCtasPerSm * p.num_sms;
  return rule;
}

// The device's choice of pieces a segment (LaunchPlan::device_segments), as
// device_plan_pieces (segment_plan.h) makes it: the rule over the batch's true
// lengths for the kind of plan launched (superposed or by chains), in whole
// pieces, where the cost model says the cut pays. The rule's bisection is
// ~log2(G) reductions, the cost model two more. The cost model out of line,
// the reductions' loops over int sequence indices: else their int64 sums
// spilled at the prologue's 64 registers (4-64 bytes).
template <int kThreads>
__device__ __noinline__ bool device_cut_pays(const FwdParams& p, int64_t total_chunks, int64_t longest, int64_t seg,
                                             int64_t* scratch, int tid) {
  return cut_pays(device_segment_rule(p, total_chunks, longest), seg, p.superpose != 0, [&](const auto& f) {
    return reduce_over_sequences<kThreads>(p, f, false, scratch, tid);
  });
}
template <int kThreads>
__device__ __forceinline__ int32_t device_rule_pieces(const FwdParams& p, int64_t* scratch, int tid) {
  auto chunks = [](int64_t c) { return c; };
  const int64_t total = reduce_over_sequences<kThreads>(p, chunks, false, scratch, tid);
  const int64_t longest = reduce_over_sequences<kThreads>(p, chunks, true, scratch, tid);
  const int64_t seg = segment_chunks_of_kind(
      device_segment_rule(p, total, longest), p.superpose != 0, [&](const SegmentRule& r, int64_t s) {
        return reduce_over_sequences<kThreads>(p, [&](int64_t c) { return r.cut_ctas(c, s); }, false, scratch, tid) *
               r.heads;
      });
  const int32_t m = device_segment_pieces(seg, p.seg_chunks, longest, p.superpose != 0);
  return m != kWholeSequences && device_cut_pays<kThreads>(p, total, longest, m * p.seg_chunks, scratch, tid)
             ? m
             : kWholeSequences;
}

// The segment plan of a varlen forward of several sequences
// (LaunchPlan::listed_segments): the device's choice where it chooses
// (p.device_rule, device_rule_pieces), else the host's segments. Then the lists
// the passes take their work from (FwdParams::seg_plan). By the kThreads
// threads of one CTA (the prologue's set-up CTA: the segment scan's passes all
// run after that kernel). `scratch`: kThreads / 32 int64 of shared memory.
template <int kThreads>
__device__ __forceinline__ void plan_segments_on_device(const FwdParams& p, int64_t* scratch, int tid) {
  auto chunks_of = [&](int64_t n) { return sequence_chunks(p, n); };
  const int32_t pieces = p.device_rule != 0 ? device_rule_pieces<kThreads>(p, scratch, tid) : 1;
  const int64_t seg_dev = p.seg_chunks * pieces;
  // The lists, in sequence order: every segment past the first (each
  // sequence's in order; the first run in their own launch, kPassFirstSegments),
  // and the sequences the composition walks (`composed`, segment_plan.h, as
  // compose_chain decides). Each pass of kThreads
  // sequences: a block-wide exclusive scan of (segments, cut) packed in one
  // int64 (segments in the low 32 bits: fewer than 2^31, the host's grid check).
  int64_t before = 0;  // (segments, cut) of the earlier passes
  for (int64_t base = 0; base < p.num_seqs; base += kThreads) {
    const int64_t n = base + tid;
    const int64_t c = n < p.num_seqs ? chunks_of(n) : 0;
    const int64_t count = n < p.num_seqs ? segments_of(c, seg_dev) : 0;
    const int64_t later = count > 1 ? count - 1 : 0;
    const bool walked = composed(count, p.superpose != 0);
    const int64_t mine = later + (walked ? (int64_t{1} << 32) : 0);
    int64_t pass_total = 0;
    const int64_t at = before + block_exclusive_sum<kThreads>(mine, scratch, tid, &pass_total);
    // Valid boundaries keep both lists within their room (the host sized them);
    // the bounds hold for any cu_seqlens (clamped spans may overlap).
    const int64_t first = at & 0xffffffffll, cut_at = at >> 32;
    for (int64_t j = 0; j < later && first + j < p.max_later; ++j)
      p.seg_list[first + j] = SegmentRef{static_cast<int32_t>(n), static_cast<int32_t>(j + 1)};
    if (walked && cut_at < p.max_cut) p.seg_cut[cut_at] = static_cast<int32_t>(n);
    before += pass_total;
  }
  if (tid == 0) {
    const int64_t segments = before & 0xffffffffll, cut = before >> 32;
    *p.seg_plan = DeviceSegmentPlan{pieces, static_cast<int32_t>(segments < p.max_later ? segments : p.max_later),
                                    static_cast<int32_t>(cut < p.max_cut ? cut : p.max_cut), 0};
  }
}

// A segment's fp32 states in the workspace, one pair per (segment slot, value
// head), row-major [row][key]:
//   b  pass 1: B_j (segment 0 of a forward: its final state S_in(1), as it runs
//      for real; of a summaries call: B_0); pass 2 of a forward or a resume
//      overwrites it with S_in(j + 1); pass 3 of segment j + 1 starts from it
//   m  pass 1: M_j; a resume's pass 2 puts S_in(0) in the last segment's
//      (resumed_initial_state)
struct SegmentState {
  float b[kHeadDim * kHeadDim];
  float m[kHeadDim * kHeadDim];
};
__device__ __forceinline__ SegmentState* segment_state(const FwdParams& p, int64_t slot, int v_head) {
  return reinterpret_cast<SegmentState*>(p.seg_states) + slot * p.num_v_heads + v_head;
}

// A resumed forward (kSplitResume): the sequence's initial state in fp32, as the
// composition read it, for pass 3's segment 0 to start from. Not the caller's
// tensor itself: with final_state == initial_state (an engine's in-place update)
// the CTAs of the last segment, in the same launch, may already have written the
// final state over it. The copy goes in m of the sequence's last segment: the
// resume never reads M_{G−1} (the last segment runs for real in pass 3), and with
// one segment the composition takes no step.
__device__ __forceinline__ float* resumed_initial_state(const FwdParams& p, int64_t first_slot, int64_t segments,
                                                        int64_t pieces, int v_head) {
  return segment_state(p, first_slot + (segments - 1) * pieces, v_head)->m;
}

// Where a recurrence CTA's rows of the state start, and where they end up.
enum class StateFrom { kInitial, kZero, kIdentity, kBuffer };
enum class StateTo { kNone, kFinal, kBuffer };

// What one recurrence CTA does: rows row0 .. row0 + kRows - 1 of one state over
// a run of chunks of one (sequence, value head). Value rows are rows of S (v
// enters, out may be written); key rows are rows of M (v = 0, no output).
struct RecurrenceWork {
  bool active;
  bool value_rows;
  bool write_out;
  bool true_state;      // the sequence's real state (checkpoints may be taken from it)
  int64_t first_chunk;  // of the sequence, where this run of chunks starts
  int seq, v_head, row0;
  int64_t token_begin, length, first_slot;
  StateFrom from;
  StateTo to;
  const float* in_rows;  // kBuffer: the [128][128] fp32 state read
  float* out_rows;       // kBuffer: the [128][128] fp32 state written
};

// blockIdx.x = (slot · HV + hv) · parts + part; parts = the pass's state rows / kRows.
//   kPassWhole        parts = v_split: value rows of the whole sequence
//   kPassSummaries    parts = 2 · kDim / kRows: value rows, then key rows (M).
//                     Segment 0 runs for real (initial state in, out written,
//                     its final state to b, or to final_state if it is the only
//                     one); segments 1 .. G−2 compute B (zero state in) and M
//                     (identity in, v = 0); the last needs no summary, unless
//                     the outputs come by superposition (p.superpose): then the
//                     last runs like the others, and every CTA's out tiles go to
//                     chunk_outputs (o⁰, P) instead of out. With a listed
//                     plan (p.seg_plan), only its listed segments past the first.
//   kPassFirstSegments parts = kDim / kRows: a listed plan's segment 0s
//                     (every sequence's, longest first), each as segment 0 of
//                     kPassSummaries runs, out written.
//   kPassFromStates   parts = kDim / kRows: segments 1 .. G−1 from the state
//                     that pass 2 left in the previous segment's b.
// A context-parallel forward's two calls (SplitMode, params.h) change two
// things: kSplitSummaries summarises every segment in pass 1 (segment 0 and
// the last too), kSplitResume runs segment 0 in pass 3 from a copy of its
// initial state (resumed_initial_state).
// kDim: the caller's head dim; rows past it (padding, shared_storage.cuh) are
// never computed.
template <int kRows, int kDim>
__device__ __forceinline__ RecurrenceWork get_recurrence_work(const FwdParams& p) {
  RecurrenceWork w{};
  if (p.pass == kPassWhole) {
    const SequenceTile t = get_sequence_tile(p);
    w.active = w.value_rows = w.write_out = w.true_state = true;
    w.seq = t.seq;
    w.v_head = t.v_head;
    w.row0 = t.v_slice * kRows;
    w.token_begin = t.token_begin;
    w.length = t.length;
    w.first_slot = t.first_slot;
    w.from = StateFrom::kInitial;
    w.to = StateTo::kFinal;
    return w;
  }
  static_assert(kDim % kRows == 0, "the CTAs of a pass cover the state's rows");
  constexpr int kValueParts = kDim / kRows;
  const int64_t idx = blockIdx.x;
  int part;
  SegmentTile t;
  if (p.pass == kPassFirstSegments) {
    // Segment 0 of every sequence, a CTA per (sequence, head, value rows), as
    // the one-pass plan's grid and in its order (longest first): a sequence the
    // device left whole runs here as it would there.
    part = static_cast<int>(idx % kValueParts);
    const int64_t sh = idx / kValueParts;
    w.v_head = static_cast<int>(sh % p.num_v_heads);
    const int64_t rank = sh / p.num_v_heads;
    t = segment_of_sequence(p, p.seq_order != nullptr ? p.seq_order[rank] : rank, 0, p.seg_plan->pieces);
  } else if (p.seg_plan == nullptr) {
    const int parts = p.pass == kPassSummaries ? 2 * kValueParts : kValueParts;
    part = static_cast<int>(idx % parts);
    const int64_t sh = idx / parts;
    w.v_head = static_cast<int>(sh % p.num_v_heads);
    t = locate_segment(p, sh / p.num_v_heads);
  } else {
    // The device's list of segments past the first: the value-row CTAs of every
    // listed segment, then the key rows.
    const int64_t kind_ctas = static_cast<int64_t>(p.max_later) * p.num_v_heads * kValueParts;
    const int64_t rest = idx % kind_ctas, i = rest / (static_cast<int64_t>(p.num_v_heads) * kValueParts);
    part = static_cast<int>((idx / kind_ctas) * kValueParts + rest % kValueParts);
    w.v_head = static_cast<int>((rest / kValueParts) % p.num_v_heads);
    if (i >= p.seg_plan->segments) return w;
    const SegmentRef ref = p.seg_list[i];
    t = segment_of_sequence(p, ref.seq, ref.index, p.seg_plan->pieces);
  }
  w.seq = t.seq;
  w.value_rows = part < kValueParts;
  w.row0 = (part % kValueParts) * kRows;
  w.token_begin = t.token_begin;
  w.length = t.length;
  w.first_slot = t.first_slot;
  w.first_chunk = t.first_chunk;
  const bool first = t.index == 0, last = t.index == t.count - 1;
  if (!t.valid) return w;
  if (p.pass == kPassSummaries || p.pass == kPassFirstSegments) {
    if (p.split_mode == kSplitSummaries) {
      // Every segment, the first and the last too, is summarised.
      w.active = true;
      w.from = w.value_rows ? StateFrom::kZero : StateFrom::kIdentity;
      w.to = StateTo::kBuffer;
      SegmentState* st = segment_state(p, t.slot, w.v_head);
      w.out_rows = w.value_rows ? st->b : st->m;
    } else if (first) {
      w.active = w.true_state = w.value_rows;
      w.write_out = true;
      w.from = StateFrom::kInitial;
      w.to = last ? StateTo::kFinal : StateTo::kBuffer;
      w.out_rows = segment_state(p, t.slot, w.v_head)->b;
    } else {
      // Superposed outputs need the last segment's o⁰ and P, and its (M, B) for
      // the final state (pass 2).
      w.active = !last || p.superpose != 0;
      w.from = w.value_rows ? StateFrom::kZero : StateFrom::kIdentity;
      w.to = StateTo::kBuffer;
      SegmentState* st = segment_state(p, t.slot, w.v_head);
      w.out_rows = w.value_rows ? st->b : st->m;
    }
  } else {
    // Resuming, segment 0 runs here too, from the composition's copy of its
    // initial state (resumed_initial_state).
    const bool from_initial = first && p.split_mode == kSplitResume;
    w.active = !first || from_initial;
    w.write_out = w.true_state = true;
    w.from = StateFrom::kBuffer;
    w.in_rows = from_initial ? resumed_initial_state(p, t.slot, t.count, t.pieces, w.v_head)
                             : segment_state(p, t.slot - t.pieces, w.v_head)->b;
    w.to = last ? StateTo::kFinal : StateTo::kNone;
  }
  return w;
}

}  // namespace flashkda::sm90
