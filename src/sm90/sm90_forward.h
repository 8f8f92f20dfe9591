// The Hopper (sm_90a) backend behind flashkda::forward(Backend::kCuda).
// Arguments reaching these functions have passed flashkda::validate().
#pragma once
#include <cstddef>
#include <string>

#include "flashkda/flashkda.h"

namespace flashkda::sm90 {

// True when the kernels were compiled into this library.
bool compiled_in();
// True when the current CUDA device can run them (compute capability 9.0); else *why says why.
bool device_supported(std::string* why);
// Problem shapes this backend handles (K = V = 64 or 128); else a kNotSupported status.
Status check_supported(const ForwardArgs& args);
Status workspace_size(const ForwardArgs& args, size_t* bytes);
Status forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, void* stream);

// flashkda::segment_summaries on kCuda: each given token range as a one-sequence
// forward's summaries call (ForwardArgs::summaries_M), on the legacy default
// stream, returning when they are done. host_segments: the ranges [S, 2], copied to
// the host and checked by the caller (api/segment_summaries.cpp).
Status segment_summaries(const SegmentSummaryArgs& args, const int64_t* host_segments);
// flashkda::compose_summaries on kCuda (sm90_compose_summaries.cu): K, V <= 128
// (kCudaMaxComposeDim), asynchronous on args.stream.
constexpr int64_t kCudaMaxComposeDim = 128;
Status compose_summaries(const ComposeSummariesArgs& args);
// `bytes` of device memory to the host, synchronously: the checks of device-resident
// arguments an entry needs before it can plan (segment_summaries' ranges).
Status copy_to_host(void* dst, const void* src, size_t bytes);

// How the recurrence kernel is launched for a problem on this device.
struct LaunchPlan {
  int v_split = 1;  // CTAs sharing one (sequence, head), each owning V / v_split rows of the state
  int stages = 4;   // chunk records in flight per CTA (3 only with v_split 2)
  // The affine segment scan (spec section 6): sequences longer than seg_chunks
  // chunks are cut into segments of seg_chunks chunks that run in parallel
  // (three passes, 4-warp CTAs); 0: every sequence is one chain.
  int64_t seg_chunks = 0;
  // With segments: out formed by superposition (o⁰ + S_in·P, a token-parallel
  // kernel after the composition) instead of a second chain of chunk steps per
  // segment (pass 3). Not with checkpoints, which need the true states on the way.
  bool superposed_outputs = false;
  // A varlen forward of several sequences with segments: the passes take their
  // work from lists of the segments past the first and of the sequences cut,
  // which the prologue's set-up CTA writes, and every sequence's segment 0 runs
  // in a launch of its own. Over grids of every segment slot and sequence, the
  // CTAs that found nothing cost a batch of one long sequence among 63 short
  // ones (24 heads) 0.48 ms against 0.28 (docs/perf-log.md).
  bool listed_segments = false;
  // A varlen call whose lengths only the device holds (no cu_seqlens_host; with
  // listed_segments): the host launched the segment scan for pieces of
  // seg_chunks chunks, the finest any lengths would need (planned as if one
  // sequence held every token), and the prologue's set-up CTA picks how many
  // pieces a segment takes from the lengths (segment_plan.h), none where it
  // would cut nothing.
  bool device_segments = false;
  // A call with checkpoints whose records come by bulk copy writes its periodic
  // bf16 key-major entries through the entry storer (entry_storer.cuh), a
  // warpgroup beside the state warps; else the state warps write them.
  bool entry_storer = false;
};
// What the launch heuristic looks at: sequences, value heads, the chunks of all
// sequences, and the longest sequence's chunks (-1: unknown, for varlen calls
// without cu_seqlens_host).
struct ProblemShape {
  int64_t seqs = 0;
  int64_t heads = 0;
  int64_t total_chunks = 0;
  int64_t longest_chunks = -1;
  const int64_t* cu_seqlens_host = nullptr;  // the lengths, where known: [seqs + 1] boundaries
  int64_t row_parts = 2;  // 64-row (4-warp) CTAs per state in the segment scan: K / 64
  bool superposable = false;  // the call takes no checkpoints: a segment scan may form out by superposition
  // Unknown lengths planned as if one sequence held every chunk (and the others
  // none): the finest segments any lengths would need.
  bool skewed = false;
};
ProblemShape problem_shape(const ForwardArgs& args);
// The launch heuristic's choice for this shape on `num_sms` SMs.
LaunchPlan choose_launch_plan(const ProblemShape& shape, int num_sms);
// The plan forward() runs these arguments with on `num_sms` SMs (any override
// applied): the heuristic's for their shape, the split calls' own, or the
// finest segments with LaunchPlan::device_segments where the lengths are on the
// device only; grids too large for a launch fall back to one pass.
Status launch_plan_for(const ForwardArgs& args, int num_sms, LaunchPlan* plan);
// The pieces of `piece` chunks a segment that the device chooses for known
// lengths (shape.cu_seqlens_host) in a plan of this kind (superposed outputs, or
// pass 3 by chains), as it does where only it has the lengths
// (LaunchPlan::device_segments); kWholeSequences: no cut.
int32_t device_plan_pieces(const ProblemShape& shape, bool superposed, int64_t piece, int num_sms);
// Where in the workspace the device's plan goes, for a plan with
// listed_segments: a DeviceSegmentPlan (params.h), its first int32 the pieces a
// segment (pieces_per_segment), then its lists.
size_t device_segment_plan_offset(const ForwardArgs& args, const LaunchPlan& plan);
// The room of the plan's lists (listed_segments), which sizes the grids that read
// them: `later` entries of the segments past the first (and, times the pieces a
// segment, of their pieces: the output kernel's), `cut` of the sequences the
// composition walks. Exact with the host's lengths, a bound for any lengths
// without them.
struct ListRoom {
  int64_t later = 0, cut = 0;
};
ListRoom segment_list_room(const ForwardArgs& args, const LaunchPlan& plan);
// The segment scan's composition (pass 2) for `chains` (sequence, value head,
// kind of rows) of K = dim rows: the rows of S a CTA of its staged form, the
// fewest of 4, 8, 16, 32 that keep the grid within the SM count; 0 where none
// do (its register form, any grid).
int staged_compose_rows(int64_t chains, int64_t dim, int num_sms);

// For benchmarks and tests: force parts of the plan on later calls; a field of
// 0 keeps the heuristic's choice, an unbuilt combination falls back to 4 stages.
// Process-wide, not thread-safe against concurrent forward() calls.
struct LaunchOverride {
  int v_split = 0;         // 1 or 2
  int stages = 0;          // 3 or 4
  int64_t seg_chunks = 0;  // > 0: segments of this many chunks; < 0: never split
  int records = 0;         // 4-warp, 4-stage launches at K = 128: 1 records by cp.async, 2 by bulk copy
  int outputs = 0;         // segment scan: 1 pass 3 runs each segment's chain, 2 out by superposition
                           // (where superposable: no checkpoints)
  int compose = 0;         // segment scan's composition (staged_compose_rows): 1 the register form;
                           // 4, 8, 16 or 32 the staged form with that many rows a CTA, whatever its grid
  int output_chunks = 0;   // outputs by superposition: 8 or 16 chunks an output kernel CTA, whatever its grid
  int entry_storer = 0;    // LaunchPlan::entry_storer: 1 stops by the state warps, 2 the entry storer,
                           // whatever the lengths
};
void set_launch_override(const LaunchOverride& forced);
// The plan forward() uses now: the heuristic's, with any override applied.
LaunchPlan effective_launch_plan(const ProblemShape& shape, int num_sms);

}  // namespace flashkda::sm90
