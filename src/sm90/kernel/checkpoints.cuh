// Checkpoints for prefix caching (ForwardArgs::checkpoints, slot checkpoints),
// written by the recurrence CTAs that hold a sequence's true state: the
// whole-sequence pass, segment 0 of the segment scan's pass 1, and its pass 3.
// Every chunk boundary is crossed by exactly one such CTA, so every entry has one
// writer (a CTA of pass 3 does not write the state it starts from: the CTA of
// the segment before wrote it after its last chunk).
//   every c tokens   entry first(n) + j, j < ceil(L_n / c), holds the state after
//                    j·c tokens; [HV, K, V] (key-major, fla's `h`) or [HV, V, K]
//   slot checkpoints the state after slot_checkpoint_offsets[n][i] tokens (a
//                    positive multiple of 16, at most L_n) into pool slot
//                    slot_checkpoint_slots[n][i]
// The offsets and slots live on the device: invalid ones are skipped here and
// recorded by the prologue kernel (device_faults.h); entries past
// checkpoints_capacity are skipped.
#pragma once
#include <cstdint>
#include <climits>

#include "sm90/kernel/block_scan.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/recurrence.cuh"
#include "sm90/kernel/state_location.cuh"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

constexpr int kSlotCheckpoints = 2;  // per sequence (ForwardArgs::slot_checkpoint_offsets)

// Slot checkpoint i of sequence n, if its offset and slot are valid for a
// sequence of `len` tokens: the chunks after which it is taken, else -1.
__device__ __forceinline__ int64_t slot_checkpoint_chunks(const FwdParams& p, int64_t n, int i, int64_t len,
                                                          int64_t* slot) {
  const int64_t off = p.slot_ck_offsets[n * kSlotCheckpoints + i];
  *slot = p.index_is_int64 ? static_cast<const int64_t*>(p.slot_ck_slots)[n * kSlotCheckpoints + i]
                           : static_cast<int64_t>(static_cast<const int32_t*>(p.slot_ck_slots)[n * kSlotCheckpoints + i]);
  return off >= kChunk && off % kChunk == 0 && off <= len && *slot >= 0 && *slot < p.pool_size ? off / kChunk : -1;
}
// Whether slot checkpoint i of sequence n is present but invalid (a fault).
__device__ __forceinline__ bool slot_checkpoint_fault(const FwdParams& p, int64_t n, int i, int64_t len) {
  int64_t slot = 0;
  const int64_t off = p.slot_ck_offsets[n * kSlotCheckpoints + i];
  const bool valid = slot_checkpoint_chunks(p, n, i, len, &slot) >= 0;
  return !valid && off >= 0 && slot >= 0;  // a negative offset or slot means "none"
}

struct CheckpointCursor {
  bool any;
  int64_t every;        // c / 16 chunks (0: no periodic checkpoints)
  int64_t first_entry;  // sequence n's entry for j = 0
  int64_t entries;      // ceil(L / c), less any past the capacity
  int64_t slot_chunks[kSlotCheckpoints];
  int64_t slot[kSlotCheckpoints];
};

// ceil(L / c) for c = 16·k: ceil(ceil(L / 16) / k), a shift where k is a power
// of two (c = 64, fla's `h`), else a 32-bit division while the chunk count fits.
// A 64-bit division is ~60 instructions: once per earlier sequence and thread,
// when every recurrence thread counted its sequence's first entry, it was a third
// of the checkpoint kernel's instructions on a batch of 64 sequences of 128 tokens.
struct EntryCount {
  int64_t k;   // chunks an entry
  int shift;   // log2(k) where k is a power of two, else -1
  __device__ explicit EntryCount(int64_t chunks_per_entry) : k(chunks_per_entry), shift(0) {
    while (shift < 62 && (int64_t{1} << shift) < k) ++shift;
    if ((int64_t{1} << shift) != k) shift = -1;
  }
  __device__ int64_t of(int64_t tokens) const {
    const int64_t chunks = (tokens + kChunk - 1) / kChunk;  // tokens >= 0: a shift
    if (shift >= 0) return (chunks + k - 1) >> shift;
    if (chunks < (int64_t{1} << 31) && k < (int64_t{1} << 31))
      return static_cast<int64_t>((static_cast<uint32_t>(chunks) + static_cast<uint32_t>(k) - 1u) /
                                  static_cast<uint32_t>(k));
    return (chunks + k - 1) / k;
  }
};

// Every sequence's first periodic entry, Σ_{m < n} ceil(L_m / c), into
// p.ck_first_entries, by the kThreads threads of one CTA (the prologue's set-up
// CTA, before any recurrence CTA runs), kEntriesPerThread consecutive sequences a
// thread and pass, their loads in flight together. Summed by each recurrence CTA
// instead, the CTA of sequence n waited on ~n/8 dependent round trips to
// cu_seqlens before its first chunk (docs/perf-log.md). `warp_sums`: kThreads/32
// int64 of shared memory.
constexpr int kEntriesPerThread = 4;
template <int kThreads>
__device__ __forceinline__ void write_first_entries(const FwdParams& p, int64_t* warp_sums, int tid) {
  constexpr int kPass = kThreads * kEntriesPerThread;
  const EntryCount count(p.ck_chunks);
  int64_t before_pass = 0;  // entries of the sequences of the earlier passes
  for (int64_t base = 0; base < p.num_seqs; base += kPass) {
    const int64_t first = base + static_cast<int64_t>(tid) * kEntriesPerThread;
    int64_t entries[kEntriesPerThread], mine = 0;
#pragma unroll
    for (int i = 0; i < kEntriesPerThread; ++i) {
      const ClampedSpan s = sequence_span(p, first + i < p.num_seqs ? first + i : 0);
      entries[i] = first + i < p.num_seqs ? count.of(s.end - s.begin) : 0;
      mine += entries[i];
    }
    int64_t pass_total = 0;
    int64_t at = before_pass + block_exclusive_sum<kThreads>(mine, warp_sums, tid, &pass_total);
#pragma unroll
    for (int i = 0; i < kEntriesPerThread; ++i) {
      if (first + i < p.num_seqs) p.ck_first_entries[first + i] = at;
      at += entries[i];
    }
    before_pass += pass_total;
  }
}

__device__ __forceinline__ CheckpointCursor checkpoint_cursor(const FwdParams& p, const RecurrenceWork& w) {
  CheckpointCursor ck{};
  if (!w.true_state) return ck;
  const int64_t len = sequence_span(p, w.seq).end - sequence_span(p, w.seq).begin;
  if (p.checkpoints != nullptr) {
    const EntryCount count(p.ck_chunks);
    ck.every = p.ck_chunks;
    ck.first_entry = p.ck_first_entries != nullptr ? p.ck_first_entries[w.seq] : w.seq * count.of(p.seqlen);
    const int64_t room = p.ck_capacity - ck.first_entry;
    ck.entries = count.of(len);
    ck.entries = ck.entries < room ? ck.entries : (room > 0 ? room : 0);
    ck.any = ck.entries > 0;
  }
  for (int i = 0; i < kSlotCheckpoints; ++i) ck.slot_chunks[i] = -1;
  if (p.slot_ck_offsets != nullptr) {
    for (int i = 0; i < kSlotCheckpoints; ++i) ck.slot_chunks[i] = slot_checkpoint_chunks(p, w.seq, i, len, &ck.slot[i]);
    // As on the CPU backends (cpu/state_pool.cpp), entry 1 is written after
    // entry 0: where both name one slot, entry 1's state is the one kept.
    if (ck.slot_chunks[1] >= 0 && ck.slot_chunks[0] >= 0 && ck.slot[0] == ck.slot[1]) ck.slot_chunks[0] = -1;
    ck.any = ck.any || ck.slot_chunks[0] >= 0 || ck.slot_chunks[1] >= 0;
  }
  return ck;
}

// Key-major entries: element (row, col) at offset + col·V + row, V = kDim. Per
// key the warp's 16 rows are one 32-byte run (bf16), but a thread's fragment
// holds two rows of two keys. So each 8x8 block is transposed in the registers
// (movmatrix: then a thread holds key g, rows 2t, 2t + 1 of each half) and
// neighbouring threads swap halves (t even takes rows 2t..2t + 3, t odd rows
// 8 + 2(t − 1)..): one 8-byte store a tile a thread, whole sectors, a quarter of
// the stores of element-wise writes. The entry (a multiple of K·V elements),
// row0 (of 16) and the buffer (16-byte aligned: validate.cpp) keep them aligned.
template <int kDim>
__device__ __forceinline__ void store_state_key_major_bf16(const StateRows& S, __nv_bfloat16* entry, int row0,
                                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
  const bool odd = (t & 1) != 0;
  __nv_bfloat16* at = entry + static_cast<int64_t>(g) * kDim + row0 + (odd ? 8 + 2 * (t - 1) : 2 * t);
#pragma unroll
  for (int j = 0; j < kDim / 8; ++j) {
    uint32_t top, bottom;  // key 8j + g: rows 2t, 2t + 1 and 8 + 2t, 9 + 2t
    cute::SM75_U32x1_MOVM_T::copy(pack_bf16(S.tile[j].x[0], S.tile[j].x[1]), top);
    cute::SM75_U32x1_MOVM_T::copy(pack_bf16(S.tile[j].x[2], S.tile[j].x[3]), bottom);
    const uint32_t theirs = __shfl_xor_sync(0xffffffffu, odd ? top : bottom, 1);
    *reinterpret_cast<uint2*>(at + static_cast<int64_t>(8 * j) * kDim) =
        odd ? make_uint2(theirs, bottom) : make_uint2(top, theirs);
  }
}

// fp32 key-major entries: one 4-byte store an element.
template <int kDim>
__device__ __forceinline__ void store_state_key_major_fp32(const StateRows& S, float* entry, int row0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float* at = entry + static_cast<int64_t>(2 * t) * kDim + row0 + g;
#pragma unroll
  for (int j = 0; j < kDim / 8; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int e = 0; e < 2; ++e) at[static_cast<int64_t>(8 * j + e) * kDim + 8 * hr] = S.tile[j].x[2 * hr + e];
}

// The chunk count of periodic entry j, kNoCheckpoint past the last.
constexpr int64_t kNoCheckpoint = INT64_MAX;
__device__ __forceinline__ int64_t periodic_stop(const CheckpointCursor& ck, int64_t j) {
  return j < ck.entries ? j * ck.every : kNoCheckpoint;
}

// Periodic entry j of the CTA's sequence, value head v_head: its first element.
template <int kDim>
__device__ __forceinline__ int64_t periodic_entry_offset(const FwdParams& p, const CheckpointCursor& ck, int64_t j,
                                                         int v_head) {
  return ((ck.first_entry + j) * p.num_v_heads + v_head) * kDim * kDim;
}

// The first periodic entry at or after `from` chunks (one division, before the loop).
__device__ __forceinline__ int64_t first_periodic_entry(const CheckpointCursor& ck, int64_t from) {
  return ck.entries > 0 ? (from + ck.every - 1) / ck.every : 0;
}

// The first chunk count at or after `from` where something is stored, given
// that the next periodic entry is j; kNoCheckpoint if none. The loop keeps this
// and j in registers (the cursor itself stays in shared memory, copied into
// registers at each stop).
__device__ __forceinline__ int64_t next_checkpoint_stop(const CheckpointCursor& ck, int64_t j, int64_t from) {
  int64_t stop = periodic_stop(ck, j);
#pragma unroll
  for (int i = 0; i < kSlotCheckpoints; ++i)
    if (ck.slot_chunks[i] >= from && ck.slot_chunks[i] < stop) stop = ck.slot_chunks[i];
  return stop;
}

// At a stop, after `chunks_done` chunks of the sequence: the checkpoints that
// fall there; returns the next stop. j: the next periodic entry, advanced past
// one stored here. The cursor is read into registers and the next stop found
// before the first store: a shared-memory read issued after the stores waits
// behind them in the SM's memory pipeline (ncu: a fifth of a stop's time).
template <int kDim>
__device__ __forceinline__ int64_t store_checkpoints(const StateRows& S, const FwdParams& p,
                                                     const CheckpointCursor& cursor, int64_t chunks_done, int64_t& j,
                                                     int v_head, int row0, int lane) {
  const CheckpointCursor ck = cursor;
  const bool periodic = chunks_done == periodic_stop(ck, j);
  const int64_t offset = periodic_entry_offset<kDim>(p, ck, j, v_head);
  if (periodic) ++j;
  const int64_t next = next_checkpoint_stop(ck, j, chunks_done + 1);
  if (periodic) {
    if (p.ck_value_major) {
      StateLocation l{};
      l.out = p.checkpoints;
      l.out_type = p.ck_type;
      l.offset = offset;
      store_state<kDim>(S, l, row0, lane);
    } else if (p.ck_type == kStateBF16) {
      store_state_key_major_bf16<kDim>(S, static_cast<__nv_bfloat16*>(p.checkpoints) + offset, row0, lane);
    } else {
      store_state_key_major_fp32<kDim>(S, static_cast<float*>(p.checkpoints) + offset, row0, lane);
    }
  }
#pragma unroll
  for (int i = 0; i < kSlotCheckpoints; ++i) {
    if (ck.slot_chunks[i] != chunks_done) continue;
    StateLocation l{};
    l.out = p.state_pool;
    l.out_type = p.pool_type;
    l.offset = ck.slot[i] * p.pool_stride + static_cast<int64_t>(v_head) * kDim * kDim;
    store_state<kDim>(S, l, row0, lane);
  }
  return next;
}

// The common case, periodic bf16 key-major entries and no slot checkpoints:
// the stops keep the next entry's address and the entries left in registers
// instead of reading the cursor (its 64-bit arithmetic and slot tests were ~80
// of a stop's ~230 instructions; docs/perf-log.md).
struct PeriodicBf16Entries {
  __nv_bfloat16* at = nullptr;  // the next entry; null: the stops take store_checkpoints
  int64_t left = 0;             // entries from `at` on

  // From periodic entry j on, where the call's checkpoints are of this kind.
  template <int kDim>
  __device__ __forceinline__ static PeriodicBf16Entries from(const FwdParams& p, const CheckpointCursor& ck,
                                                             int64_t j, int v_head) {
    PeriodicBf16Entries e;
    if (ck.entries > j && p.slot_ck_offsets == nullptr && !p.ck_value_major && p.ck_type == kStateBF16) {
      e.at = static_cast<__nv_bfloat16*>(p.checkpoints) + periodic_entry_offset<kDim>(p, ck, j, v_head);
      e.left = ck.entries - j;
    }
    return e;
  }

  // At the stop after `stop` chunks: the entry; returns the next stop.
  template <int kDim>
  __device__ __forceinline__ int64_t store(const StateRows& S, const FwdParams& p, int64_t stop, int row0, int lane) {
    store_state_key_major_bf16<kDim>(S, at, row0, lane);
    return advance<kDim>(p, stop);
  }

  // Past the entry at `at`, stored (or handed to the entry storer) at the stop
  // after `stop` chunks; returns the next stop.
  template <int kDim>
  __device__ __forceinline__ int64_t advance(const FwdParams& p, int64_t stop) {
    at += static_cast<int64_t>(p.num_v_heads) * kDim * kDim;
    return --left > 0 ? stop + p.ck_chunks : kNoCheckpoint;
  }
};

// Where a CTA's checkpoints start: its first periodic entry and its first stop.
// A CTA that starts after chunk 0 does not store the state it starts from (see
// the top of this file): its first stop is after its first chunk. From chunk 0
// the first entry is entry 0, without first_periodic_entry's 64-bit division.
struct CheckpointStart {
  int64_t entry = 0;
  int64_t next = kNoCheckpoint;
};
__device__ __forceinline__ CheckpointStart checkpoint_start(const CheckpointCursor& ck, const RecurrenceWork& w) {
  CheckpointStart start;
  if (ck.any) {
    const int64_t from = w.first_chunk == 0 ? 0 : w.first_chunk + 1;
    start.entry = from == 0 ? 0 : first_periodic_entry(ck, from);
    start.next = next_checkpoint_stop(ck, start.entry, from);
  }
  return start;
}

// How many periodic entries of the common kind (PeriodicBf16Entries, whose stops
// are every ck.every chunks from start.next on) a CTA whose chunks end after
// `last` chunks of the sequence stores: the count the entry storer copies.
__device__ __forceinline__ int64_t periodic_entries_stored(const CheckpointCursor& ck, const CheckpointStart& start,
                                                           int64_t last) {
  if (start.next > last || ck.entries <= start.entry) return 0;
  const int64_t reached = (last - start.next) / ck.every + 1;
  const int64_t left = ck.entries - start.entry;
  return reached < left ? reached : left;
}

// Whether the final state may go to the sequence's own slot: not where a slot
// checkpoint names that slot (the CPU backends write those after the final state).
__device__ __forceinline__ bool final_state_kept(const CheckpointCursor& ck, const FwdParams& p, int seq) {
  if (p.state_pool == nullptr) return true;
  const int64_t own = state_slot(p, seq);
  for (int i = 0; i < kSlotCheckpoints; ++i)
    if (ck.slot_chunks[i] >= 0 && ck.slot[i] == own) return false;
  return true;
}

}  // namespace flashkda::sm90
