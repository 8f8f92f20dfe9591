// Kernel 2, sequential: one CTA walks a run of chunks of one (sequence, value
// head) in order with its rows of a state in registers (fp32): a V-slice of the
// whole sequence, or, in the segment scan, of one segment (tile_scheduler.cuh,
// get_recurrence_work).
//   load      chunk records and v, kStages deep: v by cp.async through a
//             per-thread cursor (chunk_loader.cuh), a record the same way or by
//             one bulk copy onto the stage's mbarrier (kBulkRecords)
//   state     every warp: 16 rows of V, the recurrence step (recurrence.cuh)
//   epilogue  every warp stores its own 16x16 output tile (epilogue.cuh)
// One barrier per chunk: after it a stage is visible to all warps, and the stage
// refilled next was released by every warp before it.
#pragma once
#include <type_traits>

#include "sm90/kernel/checkpoints.cuh"
#include "sm90/kernel/chunk_loader.cuh"
#include "sm90/kernel/entry_storer.cuh"
#include "sm90/kernel/epilogue.cuh"
#include "sm90/kernel/grid_dependency.cuh"
#include "sm90/kernel/params.h"
#include "sm90/kernel/recurrence.cuh"
#include "sm90/kernel/segment_outputs.cuh"
#include "sm90/kernel/shared_storage.cuh"
#include "sm90/kernel/tile_scheduler.cuh"

namespace flashkda::sm90 {

// kStages: chunk records in flight. The per-chunk step takes over a
// microsecond, so two records ahead already cover a DRAM round trip; four
// (the default) leave slack. Three leave shared memory for a third 4-warp CTA
// on an SM, but at 174 registers a thread the 3-stage variant still runs two:
// held to 168 so that three fit, the segment scan's passes ran slower on most
// few-heads rows (docs/perf-log.md).
template <class Base, int kVCta>
struct WithEntryStage : Base {
  alignas(128) unsigned char entry_stage[EntryStage<kVCta>::kBytes];
};

template <int kStateWarps, int kStages, bool kEntryStorer = false>
struct RecurrenceConfig {
  static_assert(kStateWarps % 4 == 0, "the state's products are warpgroup MMAs: whole warpgroups of 4 warps");
  static constexpr int kThreads = 32 * kStateWarps;  // the state warps'
  static constexpr int kCtaThreads = kThreads + (kEntryStorer ? kStorerThreads : 0);
  static constexpr int kVCta = 16 * kStateWarps;
  using Ring = RecurrenceSmem<kVCta, kStages, kStateWarps>;
  using Smem = std::conditional_t<kEntryStorer, WithEntryStage<Ring, kVCta>, Ring>;
  // The swizzled record operands need 1024-byte aligned shared addresses; the
  // dynamic allocation is only promised 16, so it carries one atom of slack.
  static constexpr size_t kSmemBytes = sizeof(Smem) + kSw128AtomBytes;
  // Two 4-warp CTAs an SM, as without the storer; the bound fixes the registers
  // at entry, which setmaxnreg needs (entry_storer.cuh).
  static constexpr int kMinCtasPerSm = kEntryStorer && kStateWarps == 4 ? 2 : 1;
  static constexpr int kStateRegs = state_registers(kThreads, kCtaThreads, kMinCtasPerSm);
  static_assert(!kEntryStorer || kCtaThreads == EntryHandOff<kVCta>::kCtaThreads,
                "the named barriers count the state warps and the storer");
};

// The state alone is 64 registers a thread, the wgmma operands of a step another
// ~50: both variants may use more than 128 registers rather than spill (the
// 8-warp one, held to 128 for two CTAs an SM, spilled and had ptxas serialize
// its wgmma). Occupancy is then bounded by registers and shared memory alike.
// kCheckpoints: the variant that writes checkpoints (checkpoints.cuh). Their
// stores inside the chunk loop cost ~20 registers a thread (176 -> 196 in the
// 8-warp variant), so the calls without checkpoints run a variant without them.
// kDim: the caller's K = V (shared_storage.cuh); 64 runs 4-warp CTAs, one per
// (sequence, head), on the state's first 64 rows.
// kBulkRecords: each chunk record arrives by one bulk copy that thread 0 issues
// and the stage's mbarrier completes. Its writes are in the async proxy, so the
// chunk loop needs no proxy fence (a memory barrier on the SM, 2-5 % of a
// chain-bound call: docs/perf-log.md). Else every thread's cp.async, then the
// fence. K = 128 only: K = 64 reads parts of a record.
// kSuperposed: the segment scan's pass 1 with outputs by superposition
// (segment_outputs.cuh): every CTA's out tiles go to the workspace, none to out:
// o⁰ (value rows) as fp32 accumulator fragments, P (key rows) as bf16 hi + lo in
// a swizzled layout for the output kernel's wgmma. (A listed plan, FwdParams::seg_plan,
// runs the segment 0s in a launch of their own, kPassFirstSegments, with out written.)
// kEntryStorer: the checkpoint variant (K = 128, records by bulk copy) whose
// periodic bf16 key-major entries a storer warpgroup writes (entry_storer.cuh),
// taken where the sequences are long enough (LaunchPlan::entry_storer, sm90_forward.cu).
template <int kStateWarps, int kStages, bool kCheckpoints, int kDim, bool kBulkRecords, bool kSuperposed,
          bool kEntryStorer>
__global__ void __launch_bounds__(
    RecurrenceConfig<kStateWarps, kStages, kEntryStorer>::kCtaThreads,
    RecurrenceConfig<kStateWarps, kStages, kEntryStorer>::kMinCtasPerSm)
    kda_recurrence_kernel(const __grid_constant__ FwdParams p) {
  static_assert(is_supported_head_dim<kDim>(), "K = V = 64 or 128");
  static_assert(!kBulkRecords || kDim == kHeadDim, "bulk copies move whole records: K = 128");
  static_assert(!(kSuperposed && kCheckpoints), "checkpoints run pass 3's chains");
  static_assert(!kEntryStorer || (kCheckpoints && kDim == kHeadDim && kBulkRecords),
                "the entry storer: periodic entries at K = 128, records by bulk copy");
  using Cfg = RecurrenceConfig<kStateWarps, kStages, kEntryStorer>;
  using Smem = typename Cfg::Smem;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + ((kSw128AtomBytes - raw_addr % kSw128AtomBytes) % kSw128AtomBytes));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#ifdef FLASHKDA_DEBUG_POISON_SMEM
  // Test builds: shared memory starts as NaN, so that a read of a part of a
  // record the loader skips (record_vector) shows in the results.
  for (int i = tid; i < static_cast<int>(sizeof(Smem) / 16); i += Cfg::kCtaThreads)
    reinterpret_cast<uint4*>(&s)[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
  __syncthreads();
#endif
  // The entry storer (entry_storer.cuh) works where the state warps hand
  // entries over: periodic bf16 key-major ones (ck_periodic below, from the same
  // cursor); elsewhere it leaves. The warpgroups part before anything else is
  // computed: a value live across setmaxnreg was spilled, and reloaded inside
  // the chunk loop.
  if constexpr (kEntryStorer) {
    init_stage_barriers(s.record_full, 1);  // before the warpgroups part: a CTA barrier
    if (warp >= kStateWarps) {
      warpgroup_registers_down<storer_registers(Cfg::kThreads)>();
      const RecurrenceWork w = get_recurrence_work<Cfg::kVCta, kDim>(p);
      if (!w.active) {
        leave_early(recurrence_beside(p));
      } else if (w.true_state) {
        const CheckpointCursor ck = checkpoint_cursor(p, w);
        const CheckpointStart start = checkpoint_start(ck, w);
        const PeriodicBf16Entries entries = PeriodicBf16Entries::from<kDim>(p, ck, start.entry, w.v_head);
        if (entries.at != nullptr) {
          const int64_t last = w.first_chunk + (w.length + kChunk - 1) / kChunk;
          run_entry_storer<Cfg::kVCta>(s.entry_stage, entries.at, int64_t{p.num_v_heads} * kDim * kDim,
                                       periodic_entries_stored(ck, start, last), w.row0, tid - Cfg::kThreads);
        }
      }
      return;
    }
    warpgroup_registers_up<Cfg::kStateRegs>();
  }

  // A listed segment plan runs pass 1 as two launches (RecurrencePass): the
  // second may start once every CTA of the first has, and needs nothing from
  // it. The second completes only after the first (its CTA 0 waits for it), so
  // that the composition after it sees both. Pass 3 runs beside the composition
  // and waits for it before its first read. CTAs with nothing listed let the
  // next launch start (grid_dependency.cuh).
  const bool beside = recurrence_beside(p);
  const bool waits_for_first_of_pass1 = second_of_pass1(p) && blockIdx.x == 0;
  if (first_of_pass1(p)) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const RecurrenceWork w = get_recurrence_work<Cfg::kVCta, kDim>(p);
  if (!w.active) {
    leave_early(beside);
    return;
  }
  if (p.pass == kPassFromStates) wait_for_launch_before(beside);  // the composition's states
  const int64_t num_chunks = (w.length + kChunk - 1) / kChunk;
  const int row = w.row0 + 16 * warp;  // the warp's first row of the state

  // Key rows (M) read no v: their v tile stays zero-filled.
  const int v_col0 = w.value_rows ? w.row0 : 0;
  const ChunkOperands* const first_record = chunk_record(p, w.first_slot, w.v_head);
  const ChunkCursor<Cfg::kVCta, Cfg::kThreads, kDim> cursor(p, first_record, w.token_begin, w.v_head, v_col0,
                                                      Smem::kLdV, tid);
  if constexpr (kBulkRecords && !kEntryStorer) init_stage_barriers(s.record_full, 1);
  // The state warps' CTA barrier: with a storer, its threads are not in it.
  auto state_warps_sync = [] {
    if constexpr (kEntryStorer) named_barrier_sync(kStateWarpsBarrier, Cfg::kThreads);
    else __syncthreads();
  };
  const OutCursor<kDim> out(p, w.token_begin, w.v_head, row, lane);
  const OutputFragmentCursor<kDim> fragments_out(p, w.first_slot, w.v_head, row, lane);
  auto chunk_rows = [&](int64_t c) {
    const int64_t rem = w.length - c * kChunk;
    return static_cast<int>(rem < kChunk ? rem : kChunk);
  };
  auto issue_load = [&](int64_t c, int stage) {
    if (c < num_chunks) {
      if (kBulkRecords && tid == 0)
        bulk_copy_record(s.stage[stage].ops, first_record + c * p.num_v_heads, s.record_full[stage]);
      cursor.template issue<kBulkRecords>(p, s.stage[stage].ops, &s.stage[stage].v[0][0], c,
                                          w.value_rows ? chunk_rows(c) : 0, tid);
    }
    cute::cp_async_fence();  // one group per chunk, empty past the end: keeps the wait count uniform
  };

  // Checkpoints: the cursor's loads (cu_seqlens, the sequence's first entry) go
  // first, in flight with the state's; after the copies' asm they waited for
  // their own round trip before the first chunk.
  CheckpointCursor mine{};
  if (kCheckpoints && w.true_state) mine = checkpoint_cursor(p, w);
  StateRows S;
  if (w.from == StateFrom::kInitial) {
    const StateLocation l = state_location<kDim>(p, w.seq, w.v_head);
    if (l.key_major) load_state_key_major<kDim>(S, l, row, lane);
    else load_state<kDim>(S, l, row, lane);
  } else {
    load_state_rows<kDim>(S, w.from, w.in_rows, row, lane);
  }
  for (int c = 0; c < kStages - 1; ++c) issue_load(c, c);
  // Checkpoints: the cursor in shared memory; the next stop and the next
  // periodic entry in registers.
  __shared__ CheckpointCursor ck;
  int64_t ck_next = kNoCheckpoint, ck_entry = 0;
  PeriodicBf16Entries ck_periodic;  // the common case's stops (checkpoints.cuh)
  EntryHandOff<Cfg::kVCta> hand_off;
  // A periodic stop of the common kind: handed to the storer, or stored here.
  auto periodic_stop_here = [&](int64_t stop) {
    if constexpr (kEntryStorer) {
      hand_off.hand_over(S, s.entry_stage, warp, lane);
      return ck_periodic.advance<kDim>(p, stop);
    } else {
      return ck_periodic.store<kDim>(S, p, stop, row, lane);
    }
  };
  if (kCheckpoints && w.true_state) {
    // Every thread finds the cursor, one writes it: with the search (then a loop
    // over the sequences before this one) under `tid == 0`, the compiler could
    // no longer prove the chunk loop warp-uniform, and the stage's wgmma
    // descriptors left the uniform datapath (a broadcast of the stage, a
    // register-to-uniform move and a warp sync a chunk: 1-4 % of a call).
    // The set-up works from those registers; the copy in shared memory is for
    // the general stops in the loop (and the final store's slot test), which
    // the chunk loop's first barrier publishes it to. A barrier of its own here
    // held every warp behind warp 0's wait for the cursor's loads.
    if (tid == 0) ck = mine;
    const CheckpointStart start = checkpoint_start(mine, w);
    ck_entry = start.entry;
    ck_next = start.next;
    ck_periodic = PeriodicBf16Entries::from<kDim>(p, mine, ck_entry, w.v_head);
    if (ck_next == 0) {  // the entry at token 0, by the loop's own kind of stop
      ck_next = ck_periodic.at != nullptr ? periodic_stop_here(0)
                                          : store_checkpoints<kDim>(S, p, mine, 0, ck_entry, w.v_head, row, lane);
    }
    if (num_chunks == 0) state_warps_sync();  // no loop barrier to publish ck
  }

  int stage = 0;  // c % kStages, without 64-bit division
  int phase = 0;  // of the stages' mbarriers: flips each time the ring wraps
  for (int64_t c = 0; c < num_chunks; ++c) {
    cute::cp_async_wait<kStages - 2>();
    const int ustage = stage;  // the refill's lambda takes this constant, not the loop's variable
    if constexpr (kBulkRecords) cute::wait_barrier(s.record_full[ustage], phase);
    else fence_async_proxy();  // the record's cp.async writes, before wgmma reads them
    state_warps_sync();
    const auto& st = s.stage[ustage];
    // The refill of the stage released at the barrier above, and the out tile's
    // stores, run in the shadows of the step's products (recurrence_step).
    auto refill = [&] { issue_load(c + kStages - 1, ustage == 0 ? kStages - 1 : ustage - 1); };
    if constexpr (kSuperposed) {
      recurrence_step<kDim, false>(S, st.ops, &st.v[0][0], Smem::kLdV, 16 * warp, s.out[warp], lane, refill,
                                   [&](const FragC(&o)[2]) { fragments_out.store(p, o, c, w.value_rows); });
    } else {
      // 0 rows: stores nothing
      recurrence_step<kDim>(S, st.ops, &st.v[0][0], Smem::kLdV, 16 * warp, s.out[warp], lane, refill,
                            [&] { out.store(p, s.out[warp], c, w.write_out ? chunk_rows(c) : 0); });
    }
    if (kCheckpoints && w.first_chunk + c + 1 == ck_next) {
      ck_next = ck_periodic.at != nullptr ? periodic_stop_here(ck_next)
                                          : store_checkpoints<kDim>(S, p, ck, ck_next, ck_entry, w.v_head, row, lane);
    }
    if (stage + 1 == kStages) phase ^= 1;
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  if (w.to == StateTo::kFinal) {
    const bool kept = !kCheckpoints || p.slot_ck_offsets == nullptr || final_state_kept(ck, p, w.seq);
    if (kept) {
      const StateLocation l = state_location<kDim>(p, w.seq, w.v_head);
      if (l.key_major) store_state_key_major<kDim>(S, l, row, lane);
      else store_state<kDim>(S, l, row, lane);
    }
  } else if (w.to == StateTo::kBuffer) {
    store_state_rows<kDim>(S, w.out_rows, row, lane);
  }
  if (waits_for_first_of_pass1) asm volatile("griddepcontrol.wait;" ::: "memory");
}

}  // namespace flashkda::sm90
