// Everything the forward kernel reads from the host, in one struct passed by value.
#pragma once
#include <cstdint>

#include "sm90/device_faults.h"

namespace flashkda::sm90 {

// State tensor element type as the kernel sees it (mirrors flashkda::DType).
enum StateType : int32_t { kStateNone = 0, kStateBF16 = 1, kStateFP32 = 2 };

// The launches of the recurrence kernel (tile_scheduler.cuh maps CTAs to work).
enum RecurrencePass : int32_t {
  kPassWhole = 0,      // one chain per (sequence, head), one pass
  kPassSummaries = 1,  // segment scan pass 1: segment 0 runs, the others' (M, B) (and o⁰, P: superpose)
  kPassFromStates = 3, // segment scan pass 3: segments 1.. from their incoming states
  // A listed plan (FwdParams::seg_plan) runs pass 1 as two launches: every
  // sequence's segment 0, one CTA per (sequence, head, 64 rows) as the one-pass
  // plan's (kPassFirstSegments), and the listed segments past the first
  // (kPassSummaries); the second may start while the first runs
  // (grid_dependency.cuh). Which goes first: FwdParams::later_first.
  kPassFirstSegments = 4,
};

// The two calls of a context-parallel forward (ForwardArgs::summaries_M,
// resume_from_summaries), on top of the segment scan's passes:
//   kSplitSummaries  prologue, pass 1 with every segment summarised (none runs
//                    for real), pass 2 composing each sequence's summary
//   kSplitResume     pass 2 from the given initial states, pass 3 with every
//                    segment (segment 0 from its initial state)
enum SplitMode : int32_t { kSplitNone = 0, kSplitSummaries = 1, kSplitResume = 2 };

// The device's segment plan (FwdParams::seg_plan), in the workspace.
struct DeviceSegmentPlan {
  int32_t pieces;    // pieces a segment (kWholeSequences, segment_plan.h: none cut)
  int32_t segments;  // entries of FwdParams::seg_list
  int32_t cut;       // entries of FwdParams::seg_cut
  int32_t unused;
};
// Segment `index` of sequence `seq`.
struct SegmentRef {
  int32_t seq;
  int32_t index;
};

struct FwdParams {
  // bf16 tensors as raw 16-bit patterns; shapes as in flashkda::ForwardArgs.
  const uint16_t* q;     // [B*T, H,  K]
  const uint16_t* k;     // [B*T, H,  K]
  const uint16_t* v;     // [B*T, HV, V]
  const uint16_t* g;     // [B*T, HV, K]
  const uint16_t* beta;  // [B*T, HV]
  const float* A_log;    // [HV]
  const float* dt_bias;  // [HV, K]
  uint16_t* out;         // [B*T, HV, V]
  // The general inputs (ForwardArgs' gate_form, g_dtype, beta_is_probability,
  // beta_dtype), read only by the prologue's kGeneralInputs instantiations:
  // g_f32 / beta_f32 replace g / beta where those are fp32 (the other is null).
  const float* g_f32;
  const float* beta_f32;
  int32_t gate_log_decay;    // g is the log decay a (GateForm::kLogDecay)
  int32_t beta_probability;  // b = beta as given

  const void* initial_state;  // [N, HV, V, K] ([N, HV, K, V] with states_key_major) or null
  void* final_state;          // the same layout, or null
  int32_t initial_state_type;
  int32_t final_state_type;
  int32_t states_key_major;   // ForwardArgs::states_key_major

  const int64_t* cu_seqlens;    // [N+1] device pointer, or null: sequence n = batch row n
  const int32_t* cu_seqlens32;  // the same as int32 (one of the two, or neither)
  int64_t seqlen;             // tokens per batch row when cu_seqlens is null
  int64_t total_tokens;       // B·T: cu_seqlens values are clamped to [0, total_tokens]

  // Element strides of the token and head axes (the last axis is contiguous);
  // the host fills in the dense ones where the caller gave none. 32-bit (below
  // 2^31, checked on the host): the prologue is issue-bound, and a 64 x 64-bit
  // product per row it loads cost it 7 % more instructions than 64 x 32.
  int32_t q_tok, q_head, k_tok, k_head, v_tok, v_head, g_tok, g_head, beta_tok, beta_head;

  // Forward on a state pool instead of initial_state / final_state: sequence n
  // reads and writes slot state_indices[n] (none when negative or past the pool).
  void* state_pool;         // [P, pool_stride elements], or null
  int32_t pool_type;        // StateType
  int32_t index_is_int64;   // state_indices: int64 (1) or int32 (0)
  int64_t pool_size;        // P
  int64_t pool_stride;      // elements between slots
  const void* state_indices;
  const uint8_t* has_initial_state;  // [N] or null

  // Checkpoints (checkpoints.cuh): every ck_chunks chunks into `checkpoints`, and
  // slot checkpoints into the pool.
  void* checkpoints;               // or null
  int32_t ck_type;                 // StateType
  int32_t ck_value_major;          // [HV, V, K] entries (1) or [HV, K, V] (0)
  int64_t ck_chunks;               // checkpoint_interval / 16
  int64_t ck_capacity;             // entries the buffer holds
  const int64_t* slot_ck_offsets;  // [N, 2] or null
  const void* slot_ck_slots;       // [N, 2], index type as state_indices
  // Varlen with periodic checkpoints: sequence n's first entry (Σ_{m<n} ceil(L_m / c)),
  // in the workspace, written by the prologue's set-up CTA (checkpoints.cuh).
  int64_t* ck_first_entries;

  // Varlen, one pass (or the segment 0s of the device's segment plan): the
  // sequences longest first, a permutation of 0..N-1 in the workspace that the
  // prologue writes and the recurrence's CTAs take their sequence from
  // (tile_scheduler.cuh); null: in order.
  int32_t* seq_order;

  int32_t num_seqs;    // N
  int32_t num_heads;   // H
  int32_t num_v_heads; // HV
  int32_t v_split;     // recurrence CTAs sharing one (sequence, head), each owning V / v_split rows

  // Workspace: one ChunkOperands record per (chunk slot, value head), written by
  // the prologue kernel and read by the recurrence kernel (tile_scheduler.cuh
  // says which slot a chunk has).
  void* chunk_records;
  int64_t num_slots;

  // The affine segment scan (docs/design.md): a sequence longer than seg_chunks
  // chunks is cut into segments of seg_chunks chunks (0: never cut). Workspace:
  // one SegmentState per (segment slot, value head), after the records.
  int64_t seg_chunks;
  int64_t num_seg_slots;
  float* seg_states;
  // A varlen forward of several sequences that the segment scan cuts
  // (LaunchPlan::listed_segments): the prologue's set-up CTA writes the plan to
  // the workspace from the lengths (plan_segments_on_device, tile_scheduler.cuh):
  // how many pieces a segment takes, the list of segments past the first (the
  // CTAs of pass 1, pass 3 and the output kernel take them in order) and the
  // list of the sequences cut (the composition's). device_rule: the lengths are
  // the device's only (LaunchPlan::device_segments): seg_chunks is a piece, the
  // segment slots index pieces, and the set-up CTA applies segment_plan.h's rule;
  // else a segment is one piece, the host's. Null: a segment is one piece, and
  // the grids map onto segment slots and sequences. num_sms: the wave the rule
  // fills; max_cut: the most sequences the plan can cut (the composition's
  // grid); max_later: a bound on the later segments' pieces, and so on the
  // segments (the passes' and the output kernel's grids).
  DeviceSegmentPlan* seg_plan;
  SegmentRef* seg_list;
  int32_t* seg_cut;
  int32_t num_sms;
  int32_t max_cut;
  int32_t max_later;
  int32_t device_rule;
  // A listed plan's pass 1: the later segments' launch first, then the segment
  // 0s beside it (1), or the segment 0s first (0). Later segments first, a cut
  // sequence's whole chain starts at once, where behind the segment 0s its later
  // segments got SMs only as the uncut sequences' CTAs drained. Segment 0s first,
  // they are placed on an idle GPU, one an SM as far as they fit: placed beside
  // another launch's CTAs (when they were the second launch), two of them shared
  // an SM and every chain ran at that pace (H = 12, 4 x 2048 left whole by the
  // device: 1.33x the one-pass time). Set for the host's listed plans only: where
  // the device plans, it may leave the batch whole, and then the segment 0s are
  // every chain (later first measured +4 % on such batches). docs/perf-log.md.
  int32_t later_first;
  int32_t pass;  // RecurrencePass: what the recurrence kernel's CTAs do
  int32_t split_mode;  // SplitMode
  float* summaries_M;  // kSplitSummaries: fp32 [N, HV, K, K]
  float* summaries_B;  // kSplitSummaries: fp32 [N, HV, V, K]

  float scale;
  float lower_bound_log2e;  // lower_bound · log2(e): the gate works in base 2
  // K = V: 64 or 128, which instantiations the host launches (the kernels have
  // it as a template argument). Last, so the other fields keep their offsets.
  int32_t head_dim;

  // The segment scan's outputs by superposition (segment_outputs.cuh): pass 1
  // leaves each chunk's o⁰ and P in chunk_outputs (one ChunkOutputs per chunk
  // slot and value head), pass 2 also writes the final states, and the output
  // kernel forms out with output_parts CTAs per (segment slot, value head); else
  // (0) pass 3 runs each segment's chain again from its incoming state.
  int32_t superpose;
  int32_t output_parts;
  int32_t output_chunks;  // chunks an output CTA (fwd_launch.h, kOutputChunksPerCta)
  void* chunk_outputs;
};

}  // namespace flashkda::sm90
