// Who works on what.
//   Prologue kernel: one CTA per (chunk slot, value head).
//   Recurrence kernel: one CTA per (sequence, value head, V-slice).
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

#include "sm90/kernel/params.h"
#include "sm90/kernel/shared_storage.cuh"

namespace flashkda::sm90 {

__host__ __device__ inline int64_t num_chunk_slots(int64_t num_seqs, int64_t total_tokens) {
  return num_seqs + (total_tokens + kChunk - 1) / kChunk;
}

// Sequence n's tokens [begin, end), clamped (see above).
__device__ __forceinline__ ClampedSpan sequence_span(const FwdParams& p, int64_t n) {
  if (p.cu_seqlens == nullptr) return {n * p.seqlen, (n + 1) * p.seqlen, true};
  return clamped_span(p.cu_seqlens, n, p.num_seqs, p.total_tokens);
}
__device__ __forceinline__ int64_t seq_begin(const FwdParams& p, int64_t n) {
  return p.cu_seqlens != nullptr ? clamp_offset(p.cu_seqlens[n], 0, p.total_tokens) : n * p.seqlen;
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
  w.seq = static_cast<int>(sh / p.num_v_heads);
  const ClampedSpan span = sequence_span(p, w.seq);
  w.token_begin = span.begin;
  w.length = span.end - span.begin;
  w.first_slot = w.seq + span.begin / kChunk;
  return w;
}

}  // namespace flashkda::sm90
